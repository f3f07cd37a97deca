"""`watch --tensorboard DIR`: every rank's curves and leak rate as TensorBoard scalars, a run per rank, on disk
while the command runs, read back with tensorboard's own event reader. Keyed to an event: the leaking rank
waits at a step until the test has read its leak from the event files (a file the test creates once it has)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from watching import SCRIPTS, environment, torchrun, watch_until

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

DDP = str(SCRIPTS / "ddp_leak.py")
GROWTH = "memwatch/growth_bytes_per_step"


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    if not run.is_dir():
        return {}
    accumulator = EventAccumulator(str(run))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def test_each_rank_is_a_run_whose_leak_shows_while_the_command_goes(tmp: Path, tmp_path: Path) -> None:
    go, logs = tmp_path / "go", tmp_path / "tb"
    cmd = [sys.executable, "-m", "torchmem_magic", "watch", "--status-every", "0", "--tensorboard", str(logs),
           "--", *torchrun(), "--nproc-per-node", "2", DDP, "--steps", "200", "--sleep-s", "0.01", "--wait-at", "120",
           "--wait-for", str(go), "--facts", str(tmp_path / "facts.json")]
    seen: dict[str, list[tuple[int, float]]] = {}

    def leak_shown() -> bool:
        nonlocal seen
        seen = _scalars(logs / "rank1")
        return bool(seen.get(GROWTH)) and seen[GROWTH][-1][1] > 0  # the leaking rank waits at step 120 till then

    returncode, out, err = watch_until(cmd, environment(tmp), go, leak_shown, poll_s=0.5)
    assert go.exists(), (seen, err[-3000:])
    assert returncode == 0, err[-3000:]
    assert "verdict: leak (worst rank: 1)" in out
    assert sorted(p.name for p in logs.iterdir()) == ["rank0", "rank1"]
    leaking, clean = _scalars(logs / "rank1"), _scalars(logs / "rank0")
    for run in (leaking, clean):
        steps = [step for step, _ in run["memwatch/ram_bytes"]]
        assert len(steps) >= 2 and steps == sorted(set(steps)) and steps[-1] == 200, run  # the last: the rank's end
    assert leaking[GROWTH][-1][1] > 32 * 1024  # ~66 KiB a step kept
    assert clean[GROWTH][-1][1] == 0.0


def test_without_tensorboard_it_is_one_line_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = ("import sys; sys.modules['torch.utils.tensorboard'] = None\n"
            "from torchmem_magic.__main__ import main\n"
            f"sys.exit(main(['watch', '--tensorboard', 'runs', '--', 'touch', {str(marker)!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment(tmp_path))
    assert result.returncode == 2 and not marker.exists()
    assert result.stderr.strip() == (
        "torchmem_magic watch: --tensorboard needs the tensorboard package: pip install 'torchmem_magic[tensorboard]'"
    )
