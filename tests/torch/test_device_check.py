"""tools/device_check, the GPU check, on a machine without CUDA: it says so in one line, writes a summary
naming every check as skipped, and exits 0; a check that fails (run on the CPU with `--device cpu`)
fails the run and leaves the other checks' entries in place."""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "device_check"
CHECKS = ("vram_leak", "vram_clean", "caching_allocator", "gc_empty_cache", "guard_vram", "ranks_vram", "nvml_contexts")


def _cuda_here() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def run_script(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script finds its own checkout
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def summary_of(path: Path) -> dict[str, Any]:
    summary = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(summary, dict)
    assert list(summary["checks"]) == list(CHECKS)
    for entry in summary["checks"].values():
        assert entry["status"] in ("pass", "fail", "skipped")
        assert isinstance(entry["figures"], dict) and isinstance(entry["assertions"], list)
    return summary


def test_the_script_compiles_and_is_executable(tmp_path: Path) -> None:
    py_compile.compile(str(SCRIPT), cfile=str(tmp_path / "device_check.pyc"), doraise=True)
    assert SCRIPT.read_text(encoding="utf-8").startswith("#!/usr/bin/env python3\n")
    assert os.access(SCRIPT, os.X_OK)


def test_without_cuda_every_check_is_skipped_and_it_exits_0(tmp_path: Path) -> None:
    if _cuda_here():
        pytest.skip("this machine has CUDA: the script would run the GPU checks")
    done = run_script(tmp_path)  # the default --out: device_check.json in the working directory
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("device_check: no CUDA") and "every check skipped" in lines[0]
    for name in CHECKS:  # one line per check, saying it was skipped and why
        assert [line for line in lines if line.split()[:2] == ["SKIP", name]] == [lines[1 + CHECKS.index(name)]]
        assert lines[1 + CHECKS.index(name)].endswith("no CUDA")
    summary = summary_of(tmp_path / "device_check.json")
    assert summary["result"] == "skipped"
    assert all(e["status"] == "skipped" and e["reason"] == "no CUDA" for e in summary["checks"].values())
    assert [s["check"] for s in summary["skipped"]] == list(CHECKS)
    assert summary["environment"]["package"] == str(ROOT / "torchmem_magic")
    text = (tmp_path / "device_check.txt").read_text(encoding="utf-8")
    assert text.splitlines()[0] == lines[0] and all(name in text for name in CHECKS)


def test_a_failing_check_fails_the_run_and_the_others_keep_their_entries(tmp_path: Path) -> None:
    out = tmp_path / "out" / "summary.json"
    done = run_script(tmp_path, "--device", "cpu", "--only", "gc_empty_cache", "--out", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    summary = summary_of(out)
    assert summary["result"] == "fail"
    entry = summary["checks"]["gc_empty_cache"]
    # on the CPU, the gc + empty_cache action has no CUDA figures to report: the check says so and fails
    assert entry["status"] == "fail" and "CUDA reserved before and after" in entry["reason"]
    assert entry["figures"]["action"] == "gc + empty_cache" and entry["seconds"] > 0
    assert any(line.startswith("FAIL gc_empty_cache") for line in done.stdout.splitlines())
    others = [e for name, e in summary["checks"].items() if name != "gc_empty_cache"]
    assert all(e["status"] == "skipped" and e["reason"] == "not selected (--only)" for e in others)
    assert (tmp_path / "out" / "summary.txt").is_file()
