"""`%%memwatch --guard` in a real ipykernel: a loop leaking 5 MiB a step is stopped with MemoryGuardError
before a RAM limit set (TORCHMEM_MAGIC_RAM_LIMIT) just above what the kernel uses; the kernel, its
variables and the report survive. Without --guard the same loop crosses the threshold and nothing is raised.
A fast loop filling a 16 MiB tmpfs (--shm-path) with 1 MiB a step, far within one sampling interval, is
stopped at the last step under the threshold, by the checks at steps."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_client import Kernel

pytestmark = pytest.mark.kernel

MIB = 1 << 20

#: sets `threshold` (HEADROOM MiB above the kernel's RAM now) and `limit`, the RAM limit whose 90% it is
SET_LIMIT = """\
import gc, os, time, psutil
gc.collect()  # what an earlier cell left to the collector is not counted as in use
_me = psutil.Process()
ram_now = _me.memory_info().rss + sum(c.memory_info().rss for c in _me.children(recursive=True))
threshold = ram_now + {headroom_mib} * 2**20
limit = int(threshold / 0.9)
os.environ["TORCHMEM_MAGIC_RAM_LIMIT"] = str(limit)
"""

LEAKY_LOOP = """\
%%memwatch {flags}
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for _ in range({steps}):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    kept.append(torch.ones(5 * 2**18))  # 5 MiB a step, kept
    time.sleep(0.01)
"""

REPORT = """[r.status, r.steps, r.ram.end_bytes, r.ram.peak_bytes, r.ram.limit_source, list(r.advice), r.error]"""


def _warm_up(kernel: Kernel) -> None:
    """One clean %%memwatch run first: the live figure's widgets are loaded before RAM is measured."""
    kernel.ok("import time")
    kernel.ok("%%memwatch\ntime.sleep(0.3)")


def test_the_guard_stops_a_leak_before_the_limit_and_the_kernel_survives(kernel: Kernel) -> None:
    _warm_up(kernel)
    kernel.ok("before = {'defined': 'before the cell'}")
    kernel.ok(SET_LIMIT.format(headroom_mib=150))
    execution = kernel.execute(LEAKY_LOOP.format(flags="--guard 90%", steps=200))  # 1000 MiB: far past the limit

    assert execution.status == "error"
    error = execution.error
    assert error is not None and error["ename"] == "MemoryGuardError", error
    first, second = error["evalue"].splitlines()
    assert first.startswith("memwatch guard: RAM at ") and "of its " in first and "(TORCHMEM_MAGIC_RAM_LIMIT)" in first
    assert "MiB/step (" in first and "MiB/s)" in first and first.endswith("stopped before the OOM killer")
    assert second.startswith("top holder so far: ")
    html = [m["content"]["data"]["text/html"] for m in execution.of_type("display_data") if "text/html" in m["content"]["data"]]
    assert html and "memwatch: failed" in html[-1] and "stopped by MemoryGuardError: memwatch guard: RAM" in html[-1]
    assert "the memory guard stopped the run" in html[-1]

    # the kernel still answers, and every variable is there
    assert kernel.value("before") == {"defined": "before the cell"}
    kept, threshold, limit = kernel.value("[len(kept), threshold, limit]")
    status, steps, ram_end, ram_peak, source, advice, reported_error = kernel.value(
        f"(lambda r: {REPORT})(torchmem_magic.last_report())"
    )
    assert 5 < kept < 200 and steps == kept + 1  # the step that raised had not appended its tensor yet
    assert kernel.value("all(t.numel() == 5 * 2**18 for t in kept)")
    assert status == "error" and source == "TORCHMEM_MAGIC_RAM_LIMIT"
    assert threshold - 100 * MIB < ram_end < limit and ram_peak < limit  # stopped near the threshold, below the limit
    assert advice[0].startswith(f"the memory guard stopped the run after {steps} steps with MemoryGuardError: RAM ")
    assert reported_error.startswith("MemoryGuardError: memwatch guard: RAM at ")
    kernel.ok("del kept")


def test_without_the_guard_the_loop_crosses_the_threshold_and_runs_to_its_end(kernel: Kernel) -> None:
    _warm_up(kernel)
    kernel.ok(SET_LIMIT.format(headroom_mib=150))
    threshold, limit = kernel.value("[threshold, limit]")
    steps = (150 * MIB + (limit - threshold) // 2) // (5 * MIB)  # to half-way between the threshold and the limit
    kernel.ok(LEAKY_LOOP.format(flags="", steps=steps))
    assert kernel.value("len(kept)") == steps
    status, _, _, ram_peak, _, advice, _ = kernel.value(f"(lambda r: {REPORT})(torchmem_magic.last_report())")
    assert status == "ok" and ram_peak > threshold
    assert not any("memory guard" in line for line in advice)
    kernel.ok("del kept")


def test_the_loop_well_under_the_threshold_runs_to_its_end_with_the_guard(kernel: Kernel) -> None:
    _warm_up(kernel)
    kernel.ok(SET_LIMIT.format(headroom_mib=400))
    kernel.ok(LEAKY_LOOP.format(flags="--guard 0.9", steps=20))  # 100 MiB of the 400 MiB headroom
    assert kernel.value("[len(kept), torchmem_magic.last_report().status]") == [20, "ok"]
    kernel.ok("del kept")


def test_a_bad_guard_is_a_one_line_usage_error(kernel: Kernel) -> None:
    kernel.ok("flag_probe = 'untouched'")
    execution = kernel.execute("%%memwatch --guard lots\nflag_probe = 'ran'")
    assert execution.status == "error"
    lines = [line for line in execution.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("UsageError: %%memwatch: guard takes a share of the limit: 90%"), lines
    assert kernel.value("flag_probe") == "untouched"


SHM_FILL = """\
%%memwatch --guard 80% --shm-path {where} --interval 10000
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
written = []
for i in range(20):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    with open(f"{where}/segment{{i}}", "wb") as segment:
        segment.write(bytes(2**20))  # 1 MiB a step, no sleep: 16 steps to ENOSPC
    written.append(i)
"""


@pytest.fixture()
def tmpfs_16mib(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "shm"
    where.mkdir()
    mount = shutil.which("mount")
    done = None if mount is None else subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done is None or done.returncode != 0:
        pytest.skip(f"mounting a 16 MiB tmpfs is not permitted here: {done.stderr.strip() if done else 'no mount command'}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_the_guard_stops_a_fill_faster_than_a_sampling_interval_at_a_step(kernel: Kernel, tmpfs_16mib: Path) -> None:
    kernel.ok("import os, time; os.environ['TORCHMEM_MAGIC_RAM_LIMIT'] = str(2**40)")  # RAM far from its threshold
    try:
        execution = kernel.execute(SHM_FILL.format(where=tmpfs_16mib))
        assert execution.status == "error"
        error = execution.error
        assert error is not None and error["ename"] == "MemoryGuardError", error
        first = error["evalue"].splitlines()[0]
        assert first.startswith("memwatch guard: /dev/shm at 12.0 MiB, 75% of its 16.0 MiB limit (its size) would pass 80%")
        assert first.endswith("stopped before a DataLoader worker's bus error")
        assert kernel.value("len(written)") == 12  # 12 MiB: the 13th segment would pass 12.8 MiB
        assert shutil.disk_usage(tmpfs_16mib).used == 12 * MIB
        assert kernel.value("torchmem_magic.last_report().steps") == 13
    finally:
        kernel.ok("os.environ.pop('TORCHMEM_MAGIC_RAM_LIMIT', None); written = None")
