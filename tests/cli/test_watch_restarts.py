"""torchrun's restarts under `watch`: each rank's entry says its attempt, the report tells how the
first attempt ended and leads with the last attempt's ranks (a rank of an earlier attempt is labelled,
never taken for its namesake)."""

from __future__ import annotations

from pathlib import Path

from watching import SCRIPTS, load, run, torchrun, watch_command


def test_a_restarted_job_keeps_both_attempts_apart(tmp: Path, tmp_path: Path) -> None:
    save = tmp_path / "run.json"
    done = run(watch_command(*torchrun(), "--standalone", "--max-restarts", "1", "--nproc-per-node", "2",
                             str(SCRIPTS / "restarted_ranks.py"), save=save), tmp, timeout_s=240)
    assert done.returncode == 0, done.stderr[-3000:]  # the second attempt finished
    entries = {(r["attempt"], r["rank"]): r for r in load(save)["ranks"]}
    assert sorted(entries) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert entries[(0, 1)]["status"] == "killed" and entries[(0, 1)]["ended"] == "SIGKILL"
    assert entries[(0, 0)]["status"] == "killed"  # its launcher stopped it to restart
    assert entries[(1, 1)]["status"] == entries[(1, 0)]["status"] == "ok"
    assert entries[(1, 1)]["steps"] == entries[(1, 0)]["steps"] == 200 and entries[(0, 1)]["steps"] < 60
    assert entries[(1, 1)]["verdict"] == "leak" and entries[(1, 0)]["verdict"] == "clean"
    report = load(save)
    assert report["worst_rank"] == 1 and report["steps"] == 200  # led by the last attempt
    text = done.stdout
    assert "attempt 0 of the job ended: rank 1 stopped (SIGKILL) at" in text
    rows = [line.split()[:3] for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert [row[:3] if "(attempt" in row[1] else row[:1] for row in rows] == [
        ["0", "(attempt", "0)"], ["0"], ["1", "(attempt", "0)"], ["1"]]
    assert "ranks 0, 0" not in text and "rank 0: clean" in text
