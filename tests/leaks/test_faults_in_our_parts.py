"""A part of ours that fails or is interrupted, at each stage of a run, in a fresh process each (see
`fault_scenario.py`): whatever happens, no hook, thread or file descriptor is left, stderr is the one it
was and the environment is as before. A Ctrl-C anywhere is the user's KeyboardInterrupt. A failure of a
part the report can stand without (a scan between steps, the search at the end) is counted and said in one
line of the report, and the run goes on; one at the start (the first reading, the hooks, the start scan) or
in the report's own assembly is raised to the user as it is: no run is watched then, and none pretends to be.
A renderer of the finished report that fails (the text printed at the end) is one line on stderr; the report
is kept and the run's end is the block's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest
from left_behind import run_cell

STAGES = ("probes", "hooks", "start_scan", "mid_scan", "search", "report", "render")
KINDS = ("error", "interrupt")
CELLS = [(stage, kind) for stage in STAGES for kind in KINDS]
#: the stages whose failure the report stands without, and the source it counts it as
STANDS_WITHOUT = {"mid_scan": "step/epoch hooks", "search": "end-of-run search"}


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str], dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(CELLS, pool.map(partial(run_cell, "fault_scenario.py"), CELLS)))


@pytest.mark.parametrize("cell", CELLS, ids=["-".join(c) for c in CELLS])
def test_a_fault_in_our_parts_leaves_the_process_as_it_was(cell: tuple[str, str], results: dict[Any, dict[str, Any]]) -> None:
    stage, kind = cell
    result = results[cell]
    assert "failed_to_run" not in result, result.get("failed_to_run")
    assert result["calls"] >= 1, "the fault was never reached"
    assert (result["hooks"], result["threads"], result["fds_left"]) == (0, [], []), result
    assert result["stderr_same"] and result["environ_changed"] == [], result
    if kind == "interrupt":
        assert result["seen"].startswith("KeyboardInterrupt"), result
    elif stage == "render":  # the run ended well: a renderer of ours that fails is one line, the report is kept
        assert (result["seen"], result["report"], result["verdict"]) == ("ok", "ok", "leak"), result
        said = [line for line in result["stderr"].splitlines() if "injected fault" in line]
        assert len(said) == 1 and "could not be shown" in said[0] and "last_report()" in said[0], result["stderr"]
    elif stage in STANDS_WITHOUT:
        assert (result["seen"], result["report"], result["verdict"]) == ("ok", "ok", "leak"), result
        assert result["failed"] == [[STANDS_WITHOUT[stage], 1]] and len(result["said"]) == 1, result
    else:
        assert result["seen"] == "ValueError: injected fault" and result["report"] is None, result
