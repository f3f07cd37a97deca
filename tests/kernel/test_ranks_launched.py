"""A notebook cell that launches torchrun (a subprocess, not a fork of the kernel): its ranks are
watched as forked ones are, the cell's report has each of them, and the kernel's environment is put
back as it was when the cell ends."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kernel_client import Kernel

pytestmark = pytest.mark.kernel

DDP = Path(__file__).resolve().parents[1] / "cli" / "scripts" / "ddp_leak.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def test_torchrun_launched_from_a_cell_has_its_ranks_in_the_cells_report(kernel: Kernel, tmp_path: Path) -> None:
    launcher = [str(TORCHRUN)] if TORCHRUN.exists() else [sys.executable, "-m", "torch.distributed.run"]
    command = [*launcher, "--nproc-per-node", "2", str(DDP), "--facts", str(tmp_path / "facts.json")]
    before = kernel.value("{k: v for k, v in __import__('os').environ.items() if k.startswith(('PYTHONPATH', 'TORCHMEM'))}")
    kernel.ok(f"%%memwatch -q\nimport subprocess\ndone = subprocess.run({command!r}, capture_output=True, text=True)",
              timeout_s=240)
    assert kernel.value("done.returncode") == 0, kernel.value("done.stderr[-3000:]")
    report = kernel.value(
        "{'ranks': [(r['rank'], r['verdict'], r['steps']) for r in torchmem_magic.last_report().to_dict()['ranks']],"
        " 'worst': torchmem_magic.last_report().worst_rank, 'verdict': torchmem_magic.last_report().verdict}"
    )
    assert report == {"ranks": [[0, "clean", 200], [1, "leak", 200]], "worst": 1, "verdict": "leak"}
    after = kernel.value("{k: v for k, v in __import__('os').environ.items() if k.startswith(('PYTHONPATH', 'TORCHMEM'))}")
    assert after == before  # the rank's bootstrap was the cell's only
