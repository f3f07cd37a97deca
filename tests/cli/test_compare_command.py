"""`python -m torchmem_magic compare BASE NEW` on reports that real runs saved: exit status 1 when
memory growth regressed (a clean run now leaks), 0 otherwise, 2 with one line when a file is bad."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from watching import SCRIPTS, environment

SAVED_RUN = str(SCRIPTS / "saved_run.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("runs")
    saved = {"clean": folder / "clean.json", "leaking": folder / "leaking.json"}
    for name, path in saved.items():
        args = [sys.executable, SAVED_RUN, str(path), *(["--keep"] if name == "leaking" else [])]
        result = subprocess.run(args, env=environment(folder), capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, result.stderr[-3000:]
    return saved


def _compare(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchmem_magic", "compare", *args], env=environment(tmp),
                          capture_output=True, text=True, timeout=60)


def test_a_run_that_now_leaks_fails_and_says_why(runs: dict[str, Path], tmp_path: Path) -> None:
    result = _compare(str(runs["clean"]), str(runs["leaking"]), tmp=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"compare {runs['clean']} → {runs['leaking']}"
    row = next(line for line in lines if line.startswith("  run "))
    assert "clean → leak" in row and "+kept_outputs" in row
    assert lines[-1].startswith("  regressed: run was clean, now leak at +") and lines[-1].endswith("KiB/step")


def test_the_fix_and_the_same_run_pass(runs: dict[str, Path], tmp_path: Path) -> None:
    fixed = _compare(str(runs["leaking"]), str(runs["clean"]), tmp=tmp_path)
    assert fixed.returncode == 0 and fixed.stdout.rstrip().endswith("memory growth did not regress")
    same = _compare(str(runs["leaking"]), str(runs["leaking"]), tmp=tmp_path)
    assert same.returncode == 0, same.stdout


def test_a_file_that_is_not_a_report_is_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = _compare(str(runs["clean"]), str(bad), tmp=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"torchmem_magic compare: cannot read {bad}: ") and len(result.stderr.splitlines()) == 1
    missing = _compare(str(runs["clean"]), str(tmp_path / "none.json"), tmp=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
