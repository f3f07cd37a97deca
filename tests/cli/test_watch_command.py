"""`python -m torchmem_magic watch` around one process, and what it must never do: leave a temporary
directory, change its own environment, turn a process that never trains (or a DataLoader worker)
into a rank, swallow the command's exit status or signals, or hide another `sitecustomize`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from watching import SCRIPTS, environment, leftovers, load, run, watch_command

from torchmem_magic.__main__ import main


def test_a_plain_script_is_one_rank_and_its_spawned_loader_worker_is_none(tmp: Path, tmp_path: Path) -> None:
    save = tmp_path / "run.html"
    done = run(watch_command(sys.executable, str(SCRIPTS / "plain_loader.py"), save=save), tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ranks:" in done.stdout and "verdict: leak (worst rank: 0)" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 1 and rows[0][0] == "0"  # the loader's worker never became a rank
    assert "rank 0: val_outputs" in done.stdout and "torch.no_grad()" in done.stdout
    page = save.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "val_outputs" in page and "<script" not in page
    assert leftovers(tmp) == []


PROBE = """
import json, sys, threading
import torch
x = torch.ones(3, requires_grad=True) * 2  # torch in use, but no step of any clock
boot = sys.modules.get("torchmem_magic.agent.boot")
json.dump({
    "threads": threading.active_count(),
    "armed": boot is not None and boot._armed is not None,
    "agent": boot is not None and boot._agent is not None,
    "finders": [type(f).__name__ for f in sys.meta_path],
}, open(sys.argv[1], "w"))
sys.exit(3)
"""


def test_a_process_that_never_trains_costs_no_thread_and_nothing_is_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                      os.environ.get("PYTHONPATH", "")]))
    environ_before, threads_before = dict(os.environ), threading.active_count()
    sigint_before, sigterm_before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    seen = tmp_path / "seen.json"
    status = main(["watch", "--interval", "50", "--", sys.executable, "-c", PROBE, str(seen)])
    assert status == 3  # the command's exit status
    probe = json.loads(seen.read_text())
    assert probe["armed"] and not probe["agent"] and probe["threads"] == 1
    assert "TorchImportWatcher" not in probe["finders"]  # gone once torch was imported
    assert dict(os.environ) == environ_before and threading.active_count() == threads_before
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == (sigint_before, sigterm_before)
    assert leftovers(private) == []
    import torchmem_magic

    report = torchmem_magic.last_report()
    assert report is not None and report.ranks is None and report.status == "error"
    assert report.error is not None and "exited with status 3" in report.error


def test_sigterm_to_the_watcher_reaches_the_command_and_the_report_still_prints(tmp: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    watcher = subprocess.Popen(watch_command(sys.executable, "-c", code), env=environment(tmp),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watcher.stdout is not None
    assert watcher.stdout.readline().strip() == "ready"
    watcher.send_signal(signal.SIGTERM)
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 7, err
    assert "memwatch: failed" in out and "exited with status 7" in out
    assert leftovers(tmp) == []


def test_another_sitecustomize_still_runs(tmp: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nMARK = 'theirs ran in ' + str(os.getpid())\n")
    env = environment(tmp)
    env["PYTHONPATH"] += os.pathsep + str(theirs)
    code = "import os, sitecustomize; print(sitecustomize.MARK == 'theirs ran in ' + str(os.getpid()))"
    done = subprocess.run(watch_command(sys.executable, "-c", code), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "True"


def test_bad_usage_is_one_line_not_a_traceback(tmp: Path) -> None:
    for args, status, words in (
        (["watch"], 2, "no command to watch"),
        (["watch", "--interval", "0", "--", "true"], 2, "between 1 and 10000 ms"),
        (["watch", "--save", "x.txt", "--", "true"], 2, ".json or .html"),
        (["watch", "--", "no-such-command-here"], 127, "cannot run 'no-such-command-here'"),
        (["show", str(tmp / "missing.json")], 1, "cannot read"),
    ):
        done = run([sys.executable, "-m", "torchmem_magic", *args], tmp, timeout_s=60)
        assert done.returncode == status, (args, done.stderr)
        assert words in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert leftovers(tmp) == []


def test_a_saved_json_shows_the_same_report(tmp: Path, tmp_path: Path) -> None:
    save = tmp_path / "run.json"
    done = run(watch_command(sys.executable, "-c", "pass", save=save), tmp, timeout_s=60)
    assert done.returncode == 0, done.stderr
    shown = run([sys.executable, "-m", "torchmem_magic", "show", str(save)], tmp, timeout_s=60)
    assert shown.returncode == 0 and shown.stdout == done.stdout
    assert load(save)["schema"] == 2


LEAKY_LOOP = """
import time, torch
model = torch.nn.Linear(256, 256)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
for step in range(150):
    out = model(torch.randn(64, 256))
    optimizer.zero_grad(); out.pow(2).mean().backward(); optimizer.step()
    history.append(out)
    time.sleep(0.005)
"""


def test_no_scan_keeps_the_curves_and_drops_the_leak_finder(tmp: Path, tmp_path: Path) -> None:
    save = tmp_path / "run.json"
    done = run([sys.executable, "-m", "torchmem_magic", "watch", "--no-scan", "--save", str(save), "--",
                sys.executable, "-c", LEAKY_LOOP], tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    (rank,) = load(save)["ranks"]
    assert rank["verdict"] == "leak" and rank["steps"] == 150
    assert rank["suspects"] == []  # nothing scanned: no holder named
