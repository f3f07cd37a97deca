"""`python -m torchmem_magic watch -- torchrun ...`: every rank of a real DDP run (gloo, CPU) watched.

Rank 1 keeps each step's output with its graph; the report must name that rank, the holder and a
rate close to what the script itself measured one kept output to cost. Runs of several nodes are in
test_watch_nodes.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from watching import SCRIPTS, leftovers, load, run, torchrun, watch_command

DDP = str(SCRIPTS / "ddp_leak.py")
TOLERANCE = 0.20
HOLDERS = {"global": "leaked_outputs", "local": "kept_outputs"}


def _ranks(report: dict) -> dict[int, dict]:
    return {entry["rank"]: entry for entry in report["ranks"]}


@pytest.mark.parametrize("holder,compiled", [("global", ""), ("local", ""), ("global", "aot_eager")],
                         ids=["global", "local", "global-compiled"])
def test_the_leaking_rank_its_holder_and_its_rate(holder: str, compiled: str, tmp: Path, tmp_path: Path) -> None:
    """Also with the DDP model compiled (each rank's hooks never traced, its steps counted alike)."""
    save, facts = tmp_path / "run.json", tmp_path / "facts.json"
    done = run(watch_command(*torchrun(), "--nproc-per-node", "2", DDP, "--holder", holder, "--facts", str(facts),
                             "--compile", compiled, save=save), tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    report, measured = load(save), load(facts)
    ranks = _ranks(report)
    assert sorted(ranks) == [0, 1] and report["worst_rank"] == 1 and report["verdict"] == "leak"
    leaking, clean = ranks[1], ranks[0]
    assert (leaking["verdict"], leaking["leak_kind"], leaking["status"]) == ("leak", "per-iteration", "ok")
    assert (clean["verdict"], clean["status"]) == ("clean", "ok")
    name = HOLDERS[holder]
    held = {s["name"]: s for s in leaking["suspects"]}
    assert name in held and held[name]["rank"] == 1 and not clean["suspects"]
    expected = measured["output_bytes"]  # one step's kept output; its graph adds ~2 nodes (~1.4 KiB)
    assert abs(leaking["per_step"] - expected) <= TOLERANCE * expected, (leaking["per_step"], expected)
    assert abs(held[name]["growth_per_step"] - expected) <= TOLERANCE * expected
    assert leaking["steps"] == clean["steps"] == 200
    assert "worst rank: 1" in done.stdout and name in done.stdout
    # the top table is the job's: the ranks' processes from the first rank's start on (the watcher's own
    # process aside, and its heap not shown), not the watcher alone before and after them
    both_ranks = leaking["ram"]["peak"] + clean["ram"]["peak"]
    assert report["ram"]["start"] > 0.5 * clean["ram"]["peak"] and report["ram"]["peak"] < 1.5 * both_ranks
    assert report["ram"]["end"] > clean["ram"]["end"] and report["heap"] is None
    assert leftovers(tmp) == []


def test_a_rank_killed_mid_run_keeps_what_it_streamed(tmp: Path, tmp_path: Path) -> None:
    save, facts = tmp_path / "run.json", tmp_path / "facts.json"
    kill_at = 100
    done = run(watch_command(*torchrun(), "--nproc-per-node", "2", DDP, "--kill-at", str(kill_at),
                             "--facts", str(facts), save=save), tmp)
    assert done.returncode != 0  # torchrun fails when a worker dies, and so does the watch
    report, measured = load(save), load(facts)
    ranks = _ranks(report)
    assert sorted(ranks) == [0, 1] and report["worst_rank"] == 1
    assert report["status"] == "error" and "exited with status" in report["error"]
    killed = ranks[1]
    assert killed["status"] == "killed"
    # the watcher saw its process end (a pidfd), before its launcher stopped rank 0, and read how while
    # torchrun had not reaped it yet (torchrun reaps within its 0.1 s monitor interval: rarely missed)
    assert killed["exited_s"] is not None and killed["ended"] in ("SIGKILL", None)
    if ranks[0]["exited_s"] is not None:
        assert ranks[0]["exited_s"] > killed["exited_s"]
    assert killed["ram"]["end"] > 100 << 20 and killed["heap"]["end"] > 0  # its last readings
    steps_in_1_s = 1.0 / measured["step_s"]
    assert kill_at - steps_in_1_s <= killed["steps"] <= kill_at, (killed["steps"], steps_in_1_s)
    assert killed["verdict"] == "leak"  # judged from what it streamed until then
    assert ranks[0]["status"] in ("ok", "error", "killed")
    assert "rank 1 (pid" in done.stdout and "stopped without finishing" in done.stdout
    assert leftovers(tmp) == []
