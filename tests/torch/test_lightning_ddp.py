"""`MemwatchCallback` under Lightning's `strategy="ddp"`: 2 CPU ranks, the script launched again for rank 1 as
Lightning does, and no watcher around the job. Rank 0's report carries both ranks, names rank 1's leak at
the module's attribute, and counts only its own process tree (rank 1 is its child)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

SCRIPT = Path(__file__).with_name("lightning_ddp_script.py")


def test_rank_zeros_report_carries_every_rank_with_its_holder(tmp_path: Path) -> None:
    saved = tmp_path / "report.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, str(SCRIPT), str(saved)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(saved.read_text())
    report = out["report"]
    assert out["is_last_report"], "last_report() is not the callback's report"
    ranks = {entry["rank"]: entry for entry in report["ranks"]}
    assert sorted(ranks) == [0, 1] and report["worst_rank"] == 1, report["ranks"]
    assert ranks[1]["verdict"] == "leak" and ranks[0]["verdict"] == "clean", report["ranks"]
    assert ranks[0]["steps"] == ranks[1]["steps"] == 300 and ranks[0]["pid"] != ranks[1]["pid"]
    top = next(s for s in report["suspects"] if s.get("rank") == 1)
    assert top["name"] == "model" and top["path"].startswith("model.train_outputs"), report["suspects"]
    assert report["verdict"] == "leak"
    # rank 0 launched rank 1, yet its RAM is its own: a process like rank 1, not the two of them (measured:
    # 0.9 times rank 1's, 1.7 times with rank 1 counted in its tree)
    assert ranks[0]["ram"]["peak"] < 1.4 * ranks[1]["ram"]["peak"], (ranks[0]["ram"], ranks[1]["ram"])
    assert "ranks:" in done.stdout and "rank 1" in done.stdout  # rank 0 printed the report of both
    assert done.stdout.count("memwatch:") == 1, done.stdout  # and rank 1 printed none
