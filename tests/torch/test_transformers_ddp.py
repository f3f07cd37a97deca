"""The transformers callback under `torchrun --nproc-per-node 2` (CPU, gloo), nothing watching the job from
outside: the main process's report carries both ranks and names rank 1's holder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).with_name("transformers_ddp_script.py")


def test_the_main_processs_report_carries_every_rank_with_its_holder(tmp_path: Path) -> None:
    saved = tmp_path / "report.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT), str(saved),
               str(tmp_path / "run")]
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(saved.read_text())
    ranks = {entry["rank"]: entry for entry in report["ranks"]}
    assert sorted(ranks) == [0, 1] and report["worst_rank"] == 1 and report["verdict"] == "leak", report["ranks"]
    assert (ranks[0]["verdict"], ranks[1]["verdict"]) == ("clean", "leak") and ranks[1]["steps"] == 150
    top = next(s for s in report["suspects"] if s.get("rank") == 1)
    assert top["path"].startswith("trainer.kept_logits"), report["suspects"]
    assert done.stdout.count("memwatch:") == 1 and "worst rank: 1" in done.stdout, done.stdout[-3000:]
