"""torchrun's restarts under `watch`: each rank's entry says its attempt, the report tells how the
first attempt ended and leads with the last attempt's ranks (a rank of an earlier attempt is labelled,
never taken for its namesake). Across two nodes too: torchrun's restart count is a node's own (the
node whose rank did not fail does not count its restart), so the other node's ranks are told apart
by their processes in the job's store, and each node's report has both attempts of every rank."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from watching import SCRIPTS, environment, free_port, load, run, torchrun, watch_command


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
    assert re.search(r"attempt 0 ended: rank 1 stopped \(SIGKILL\) at \d+ steps; torchrun started ranks 0, 1 again", text)
    rows = [line.split()[:3] for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert [row[:3] if "(attempt" in row[1] else row[:1] for row in rows] == [
        ["0", "(attempt", "0)"], ["0"], ["1", "(attempt", "0)"], ["1"]]
    assert "ranks 0, 0" not in text and "rank 0: clean" in text


def test_two_nodes_restarted_each_report_both_attempts_of_every_rank(tmp: Path, tmp_path: Path) -> None:
    port, saves = free_port(), [tmp_path / f"node{node}.json" for node in (0, 1)]
    watchers = [
        subprocess.Popen(
            watch_command(*torchrun(), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                          "--max-restarts", "1", "--rdzv-id", "restarts", "--rdzv-backend", "c10d",
                          "--rdzv-endpoint", f"127.0.0.1:{port}", str(SCRIPTS / "restarted_ranks.py"), save=saves[node]),
            env=environment(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)
    ]
    outputs = [w.communicate(timeout=240) for w in watchers]
    assert [w.returncode for w in watchers] == [0, 0], [err[-2000:] for _, err in outputs]
    for save in saves:
        entries = {(r["rank"], r["attempt"]): r for r in load(save)["ranks"]}
        assert sorted(entries) == [(0, 0), (0, 1), (1, 0), (1, 1)], save
        assert {entries[(r, 0)]["status"] for r in (0, 1)} == {"killed"}
        assert [entries[(r, 1)]["steps"] for r in (0, 1)] == [200, 200]
        assert {entries[k]["via"] for k in entries} == {"stream", "store"}  # its own node's, the other's
        assert entries[(1, 1)]["verdict"] == "leak" and load(save)["worst_rank"] == 1
