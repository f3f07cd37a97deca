"""DataLoader workers in a real kernel: a worker killed mid-epoch is explained from the curves."""

from __future__ import annotations

import pytest
from kernel_client import Kernel

pytestmark = pytest.mark.kernel

TRAIN_WITH_TWO_WORKERS = (
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
)


def test_worker_killed_mid_epoch_is_explained_and_the_error_still_propagates(fresh_kernel: Kernel) -> None:
    execution = fresh_kernel.execute(
        "%%memwatch -q --interval 20\n"
        + TRAIN_WITH_TWO_WORKERS +
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


@pytest.fixture()
def small_shm(tmp_path):  # type: ignore[no-untyped-def]
    import subprocess

    mountpoint = tmp_path / "shm"
    mountpoint.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mountpoint)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root); the explanation itself is unit-tested")
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def test_full_shm_then_a_bus_error_is_explained_as_shm(fresh_kernel: Kernel, small_shm) -> None:  # type: ignore[no-untyped-def]
    execution = fresh_kernel.execute(
        f"%%memwatch -q --interval 20 --shm-path {small_shm}\n"
        + TRAIN_WITH_TWO_WORKERS +
        "    if step == 5:\n"
        f"        open('{small_shm}/filler', 'wb').write(b'0' * (15 << 20))  # the segments filled it\n"
        "        time.sleep(0.3)  # a few samples see it full\n"
        "        os.kill(batches._workers[0].pid, signal.SIGBUS)\n",
        timeout_s=120,
    )
    assert execution.status == "error" and "DataLoader worker (pid" in execution.error["evalue"]
    report = fresh_kernel.value("torchmem_magic.last_report().to_dict()")
    assert report["shm"]["path"] == str(small_shm) and report["shm"]["limit"] == 16 << 20
    assert "/dev/shm was 9" in report["advice"][0] and "--shm-size" in report["advice"][1]
