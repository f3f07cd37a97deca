"""DataLoader workers in a real kernel: a worker killed mid-epoch is explained from the curves."""

from __future__ import annotations

import pytest

from kernel_client import Kernel

pytestmark = pytest.mark.kernel


def test_worker_killed_mid_epoch_is_explained_and_the_error_still_propagates(fresh_kernel: Kernel) -> None:
    execution = fresh_kernel.execute(
        "%%memwatch -q --interval 20\n"
        "import os, signal, time\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Slow(Dataset):\n"
        "    def __len__(self): return 400\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.005)\n"
        "        return torch.randn(8)\n"
        "model = torch.nn.Linear(8, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "batches = iter(DataLoader(Slow(), batch_size=4, num_workers=2))\n"
        "for step, x in enumerate(batches):\n"
        "    opt.zero_grad(); model(x).sum().backward(); opt.step()\n"
        "    if step == 10:\n"
        "        victim = batches._workers[0].pid\n"
        "        os.kill(victim, signal.SIGKILL)\n",
        timeout_s=120,
    )
    assert execution.status == "error" and execution.error["ename"] == "RuntimeError"
    assert "DataLoader worker (pid" in execution.error["evalue"]  # "killed by signal" or "exited unexpectedly"
    report = fresh_kernel.value("torchmem_magic.last_report().to_dict()")
    victim = fresh_kernel.value("victim")
    assert report["status"] == "error" and report["workers"]["max"] == 2
    assert report["advice"][0].startswith(f"DataLoader worker {victim} died")
    assert "neither memory nor /dev/shm was near its limit" in report["advice"][0]
