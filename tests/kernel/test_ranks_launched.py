"""A notebook cell that launches torchrun (a subprocess, not a fork of the kernel): its ranks are
watched as forked ones are, the cell's report has each of them, and the kernel's environment is put
back as it was when the cell ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kernel_client import Kernel, free_port

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


def test_a_cell_that_runs_one_node_of_a_job_shows_the_other_nodes_ranks(kernel: Kernel, tmp_path: Path) -> None:
    """Node 1 runs under `watch` beside the kernel; the cell starts node 0. Rank 1 (node 1, leaking)
    reaches the cell only through the job's store: named in the live status line while the job runs,
    and in the cell's report with its node and holder."""
    launcher = [str(TORCHRUN)] if TORCHRUN.exists() else [sys.executable, "-m", "torch.distributed.run"]
    port = free_port()

    def node(rank: int) -> list[str]:
        return [*launcher, "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1", "--rdzv-id", "cell-job",
                "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(port), str(DDP),
                "--holder", "local", "--steps", "400", "--sleep-s", "0.02", "--facts", str(tmp_path / "facts.json")]

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    other = subprocess.Popen([sys.executable, "-m", "torchmem_magic", "watch", "--status-every", "0", "--", *node(1)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        execution = kernel.ok(f"%%memwatch --interval 50\nimport subprocess\ndone = subprocess.run({node(0)!r}, "
                              "capture_output=True, text=True)", timeout_s=240)
        other.communicate(timeout=120)
    finally:
        if other.poll() is None:
            other.kill()
            other.communicate()
    assert kernel.value("done.returncode") == 0, kernel.value("done.stderr[-3000:]")
    statuses = [str(m["content"]["data"]["state"]["value"]).replace("&nbsp;", " ") for m in execution.iopub
                if m["msg_type"] == "comm_msg" and "value" in m["content"]["data"].get("state", {})]
    final_at = next(i for i, value in enumerate(statuses) if value.startswith("<code>ok · "))  # the report's
    live = [value for value in statuses[:final_at] if "worst rank 1: leak +" in value]
    assert live, statuses[-5:]  # named while the job ran, through the store
    ranks = kernel.value("[(r['rank'], r['via'], r['node'], r['verdict'], [s['name'] for s in r['suspects']])"
                         " for r in torchmem_magic.last_report().to_dict()['ranks']]")
    assert ranks == [[0, "stream", 0, "clean", []], [1, "store", 1, "leak", ["kept_outputs"]]]
