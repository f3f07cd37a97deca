"""Nothing of the user's is kept by the watcher, in a fresh process for each cell of the matrix: torch cold
(the process's first optimizer step inside the watched block) or warm, times each way a run ends (well, the
user's exception, a real SIGINT, the Stop button's request, the memory guard), times each front end of a
script (`memwatch()`, `assert_no_leak()`, the pytest mark, the Lightning and transformers callbacks).

Afterwards the session is freed, and so is the training function's 16 MiB local once the user let go of
what they hold (`release_last_exception()` frees what pytest keeps of a failed test, `sys.last_*`); no hook,
thread or file descriptor is left, fd 2 is the one it was, and the environment is what the same loop unwatched
leaves (torch's first step sets TORCHINDUCTOR_CACHE_DIR itself). The cells run four at a time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest
from left_behind import run_cell

FRONTS = ("memwatch", "gate", "mark", "lightning", "transformers")
TORCH_STATES = ("cold", "warm")
ENDINGS = ("ok", "error", "interrupt", "stop", "guard")
CELLS = [(front, state, ending) for front in FRONTS for state in TORCH_STATES for ending in ENDINGS]
BASELINES = [("bare", state, "ok") for state in TORCH_STATES]
#: what each ending is seen as by the code around the front end (Lightning turns a Ctrl-C into SystemExit(1);
#: the pytest mark's failures are pytest's to report: `pytest.main` returns)
ENDED = {"ok": "ok", "error": "ValueError", "interrupt": "KeyboardInterrupt", "stop": "StopTraining",
         "guard": "MemoryGuardError"}

#: what the front end's own library changes in the environment, with us or without: pytest's current test
#: (left set when a session is stopped by an interrupt), Lightning's import
LIBRARIES_SET = {"mark": {"PYTEST_CURRENT_TEST"}, "lightning": {"PYTORCH_NVML_BASED_CUDA_CHECK"}}


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str, str], dict[str, Any]]:
    cells = BASELINES + CELLS
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(cells, pool.map(partial(run_cell, "scenario.py"), cells)))


@pytest.mark.parametrize("cell", CELLS, ids=["-".join(c) for c in CELLS])
def test_the_run_keeps_nothing_of_the_users(cell: tuple[str, str, str], results: dict[Any, dict[str, Any]]) -> None:
    front, torch_state, ending = cell
    result = results[cell]
    assert "failed_to_run" not in result, result.get("failed_to_run")
    expected = ENDED[ending]
    if front == "mark":
        expected = "ok"
    elif front == "lightning" and ending in ("interrupt", "stop"):
        expected = "SystemExit"
    assert result["ended"] == expected
    assert result["ended_s"] is not None, "the session did not end"
    assert result["report"] == ("ok" if ending == "ok" else "interrupted" if ending in ("interrupt", "stop")
                                and front != "transformers" else "error")
    assert "session" in result["alive"], "no step of the user's ran inside the session"
    assert not result["alive"]["session"], "the session outlives the run"
    if front != "mark":  # pytest keeps a failed test's traceback in sys.last_* (its own, for post-mortems)
        assert not result["big_while_held"], "the session keeps the training function's local"
        assert not result["alive"]["big"], "the training function's local outlives the run"
    assert not any(result["alive_after_release"].values()), "release_last_exception() did not free the frames"
    assert (result["hooks"], result["threads"], result["fds_left"]) == (0, [], [])
    assert result["stderr_same"]
    baseline = results[("bare", torch_state, "ok")]
    assert "failed_to_run" not in baseline, baseline.get("failed_to_run")
    assert set(result["environ_changed"]) - LIBRARIES_SET.get(front, set()) == set(baseline["environ_changed"])
