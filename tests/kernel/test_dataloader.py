"""DataLoader workers in a real kernel: a worker that dies mid-epoch is explained from how it ended.

The loop sees torch's "DataLoader worker (pid N) is killed by signal" or, on a busy machine, only a
reset connection; the report's explanation must not depend on which. `test_..._under_load` repeats
both scenarios with every core busy (marked slow: `pytest -m slow tests/kernel/test_dataloader.py`,
`TORCHMEM_REPEAT=N` sets the number of runs, 30 by default).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_client import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.floors]

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


def kill_a_worker(kernel: Kernel) -> tuple[dict, str]:  # type: ignore[type-arg]
    """SIGKILL one worker mid-epoch; returns the report and what the cell failed with."""
    execution = kernel.execute(
        "%%memwatch -q --interval 20\n"
        + TRAIN_WITH_TWO_WORKERS +
        "    if step == 10:\n"
        "        victim = batches._workers[0].pid\n"
        "        os.kill(victim, signal.SIGKILL)\n",
        timeout_s=120,
    )
    assert execution.status == "error"  # the loop's own error propagates, whichever form it took
    report = kernel.value("torchmem_magic.last_report().to_dict()")
    victim = kernel.value("victim")
    assert report["status"] == "error" and report["workers"]["max"] == 2
    assert report["error"].split(":")[0] == execution.error["ename"]
    assert report["advice"][0].startswith(
        f"DataLoader worker {victim} died (Killed): neither memory nor /dev/shm was near its limit"
    ), report
    return report, execution.error["evalue"]


def fill_shm_then_bus_error(kernel: Kernel, shm: Path) -> tuple[dict, str]:  # type: ignore[type-arg]
    """Fill a 16 MiB tmpfs, then SIGBUS a worker (what a full /dev/shm does to it)."""
    execution = kernel.execute(
        f"%%memwatch -q --interval 20 --shm-path {shm}\n"
        + TRAIN_WITH_TWO_WORKERS +
        "    if step == 5:\n"
        f"        st = os.statvfs('{shm}')  # fill it up to the last 256 KiB, as the segments would\n"
        f"        open('{shm}/filler', 'wb').write(b'0' * (st.f_bavail * st.f_frsize - (256 << 10)))\n"
        "        time.sleep(0.3)  # a few samples see it full\n"
        "        victim = batches._workers[0].pid\n"
        "        os.kill(victim, signal.SIGBUS)\n",
        timeout_s=120,
    )
    assert execution.status == "error"
    assert execution.error is not None, [(m["msg_type"], str(m["content"])[:400]) for m in execution.iopub]
    report = kernel.value("torchmem_magic.last_report().to_dict()")
    victim = kernel.value("victim")
    # the last traceback keeps the dead iterator (and its segments) alive: release it for the next run
    kernel.ok(f"del batches; torchmem_magic.release_last_exception(); os.remove('{shm}/filler')")
    assert report["shm"]["path"] == str(shm) and report["shm"]["limit"] == 16 << 20
    # the other worker may also hit the full mount: both are then named
    died = re.match(rf"DataLoader worker ([\d, ]+) died \(Bus error\): {re.escape(str(shm))} was 9\d% full", report["advice"][0])
    assert died is not None and str(victim) in died.group(1).split(", "), report
    assert "--shm-size" in report["advice"][1]
    return report, execution.error["evalue"]


@pytest.fixture()
def small_shm(tmp_path: Path) -> Iterator[Path]:
    mountpoint = tmp_path / "shm"
    mountpoint.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mountpoint)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root); the explanation itself is unit-tested")
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def test_worker_killed_mid_epoch_is_explained_and_the_error_still_propagates(fresh_kernel: Kernel) -> None:
    kill_a_worker(fresh_kernel)


def test_full_shm_then_a_bus_error_is_explained_as_shm(fresh_kernel: Kernel, small_shm: Path) -> None:
    fill_shm_then_bus_error(fresh_kernel, small_shm)


#: the loop fails as it does when it reads from a dead worker first (a reset connection), and torch's SIGCHLD
#: handler reports the death later: here, every time, while IPython formats the loop's traceback (the worker
#: killed then, and SIGCHLD sent to the main thread, in case the worker's own went to another thread). Beside
#: load the full-shm test saw that 1 in 10 runs, and the cell then showed no error at all
DEATH_REPORTED_WHILE_THE_TRACEBACK_IS_FORMATTED = (
    "    if step == 5:\n"
    "        import threading\n"
    "        def formatted(failure, killed=[]):\n"
    "            if not killed:  # IPython may format it more than once\n"
    "                killed.append(batches._workers[0].pid)\n"
    "                os.kill(killed[0], signal.SIGKILL)\n"
    "                while open(f'/proc/{killed[0]}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z':\n"
    "                    time.sleep(0.01)\n"
    "                signal.pthread_kill(threading.main_thread().ident, signal.SIGCHLD)\n"
    "            return get_ipython().InteractiveTB.structured_traceback(type(failure), failure, failure.__traceback__)\n"
    "        failure = ConnectionResetError(104, 'Connection reset by peer')\n"
    "        failure._render_traceback_ = lambda: formatted(failure)\n"
    "        raise failure\n"
)


def test_a_worker_death_reported_while_the_traceback_is_formatted_still_shows_it(fresh_kernel: Kernel) -> None:
    execution = fresh_kernel.execute(
        "%%memwatch -q --interval 20\n" + TRAIN_WITH_TWO_WORKERS + DEATH_REPORTED_WHILE_THE_TRACEBACK_IS_FORMATTED,
        timeout_s=120,
    )
    assert execution.status == "error"
    assert execution.error is not None, (execution.stdout, execution.stderr)
    assert (execution.error["ename"], "Unexpected exception" in execution.stdout) == ("ConnectionResetError", False)
    said = "torchmem_magic: reported while the error above was shown: DataLoader worker ("
    assert said in execution.stderr and "is killed by signal: Killed" in execution.stderr, execution.stderr
    # torch's own handler is back: a later death is raised as torch raises it
    handler = fresh_kernel.value("__import__('signal').getsignal(__import__('signal').SIGCHLD).__module__")
    assert handler == "torch.utils.data._utils.signal_handling"


def _burn() -> None:
    while True:
        pass


@pytest.fixture()
def every_core_busy() -> Iterator[None]:
    burners = [multiprocessing.get_context("spawn").Process(target=_burn, daemon=True) for _ in range(os.cpu_count() or 2)]
    for burner in burners:
        burner.start()
    yield
    for burner in burners:
        burner.kill()
        burner.join()


@pytest.mark.slow
def test_worker_deaths_are_explained_every_time_under_load(
    every_core_busy: None, small_shm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every run keeps its explanation; what the loop saw varies (printed, for the record)."""
    runs = int(os.environ.get("TORCHMEM_REPEAT", "30"))
    seen: dict[str, int] = {}
    for scenario in ("SIGKILL", "full shm + SIGBUS"):
        kernel = Kernel()
        try:
            kernel.ok("import torch\ntorch.set_num_threads(1)\n%load_ext torchmem_magic\nimport torchmem_magic")
            for _ in range(runs):
                _, loop_saw = kill_a_worker(kernel) if scenario == "SIGKILL" else fill_shm_then_bus_error(kernel, small_shm)
                key = f"{scenario}: loop saw {'a reset connection' if 'reset' in loop_saw else 'the worker death'}"
                seen[key] = seen.get(key, 0) + 1
        finally:
            kernel.shutdown()
    with capsys.disabled():
        print(f"\n{runs} runs of each scenario, every explanation kept; {seen}")
