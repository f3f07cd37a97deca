import math
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch

from torchmem_magic.analysis.forensics import WorkerExit
from torchmem_magic.probes.accelerator import AcceleratorProbe, parse_device
from torchmem_magic.probes.base import ProbeReader
from torchmem_magic.probes.heap import HeapProbe
from torchmem_magic.probes import process as process_probe
from torchmem_magic.probes.limits import MemoryLimit, memory_limit, sharing_strategy
from torchmem_magic.probes.process import (
    ProcessTreeProbe,
    RssReader,
    descendant_pids,
    exit_of,
    read_proportional_memory,
)
from torchmem_magic.probes.shm import ShmProbe

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc counters")


def test_rss_reader_matches_psutil() -> None:
    reader = RssReader(os.getpid())
    ours, theirs = reader.rss_bytes(), psutil.Process().memory_info().rss
    reader.close()
    assert ours is not None and abs(ours - theirs) / theirs < 0.05


def test_rss_reader_of_a_dead_process_is_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    reader = RssReader(child.pid)
    child.wait()
    assert reader.rss_bytes() is None
    reader.close()


@linux_only
def test_proportional_memory_of_self() -> None:
    reading = read_proportional_memory(os.getpid())
    assert reading is not None
    assert 0 < reading.uss_bytes <= reading.pss_bytes <= psutil.Process().memory_info().rss * 1.05


def _zombie() -> subprocess.Popen[bytes]:
    """A child that has exited and is not reaped yet, as a DataLoader worker is at its epoch's end."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60
    while Path(f"/proc/{child.pid}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    return child


@linux_only
@pytest.mark.parametrize("source", ["smaps_rollup", "psutil"])
def test_proportional_memory_of_an_exited_unreaped_process_is_none(monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """Its memory map is gone: psutil reads all zeros, which would count as a worker's peak of 0."""
    if source == "psutil":  # a kernel without smaps_rollup (before Linux 4.14): psutil reads smaps

        def no_rollup(*_: object) -> None:
            raise FileNotFoundError

        monkeypatch.setattr(process_probe, "open", no_rollup, raising=False)
    child = _zombie()
    try:
        assert read_proportional_memory(child.pid) is None
    finally:
        child.wait()


def test_heap_probe_sees_a_tensor_come_and_go() -> None:
    probe = HeapProbe()
    if not probe.available:
        pytest.skip(probe.unavailable_reason)
    before = probe.heap_bytes()
    t = torch.empty(4 << 20, dtype=torch.uint8)
    during = probe.read()["heap_bytes"]
    del t
    after = probe.heap_bytes()
    assert during - before == pytest.approx(4 << 20, rel=0.02)
    assert abs(after - before) < 64 << 10


def test_shm_probe(tmp_path: Path) -> None:
    reading = ShmProbe(str(tmp_path)).usage()
    assert reading is not None and 0 <= reading.used_bytes <= reading.total_bytes
    assert ShmProbe(str(tmp_path)).read() == {"shm_used_bytes": float(reading.used_bytes)}
    missing = ShmProbe(str(tmp_path / "missing"))
    assert missing.usage() is None and math.isnan(missing.read()["shm_used_bytes"])
    assert sharing_strategy() in torch.multiprocessing.get_all_sharing_strategies()


def _fake_tree(tmp_path: Path, cgroup_line: str, files: dict[str, str]) -> tuple[str, str]:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    for rel, text in files.items():
        path = sys_root / "fs" / "cgroup" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(proc), str(sys_root)


def test_memory_limit_cgroup_v2_takes_tightest_ancestor(tmp_path: Path) -> None:
    roots = _fake_tree(
        tmp_path, "0::/kubepods/pod1/ctr",
        {"kubepods/pod1/ctr/memory.max": "max", "kubepods/pod1/memory.max": str(2 << 30), "kubepods/memory.max": str(8 << 30)},
    )
    assert memory_limit(*roots) == MemoryLimit(2 << 30, "cgroup v2")


def test_memory_limit_cgroup_v1_and_unlimited(tmp_path: Path) -> None:
    roots = _fake_tree(tmp_path, "7:cpu,memory:/docker/abc", {"memory/docker/abc/memory.limit_in_bytes": str(1 << 30)})
    assert memory_limit(*roots).limit_bytes == 1 << 30 and memory_limit(*roots).source == "cgroup v1"
    roots = _fake_tree(tmp_path / "u", "7:memory:/", {"memory/memory.limit_in_bytes": str(2**63 - 4096)})
    assert memory_limit(*roots).source == "system"
    assert memory_limit(*roots).limit_bytes == psutil.virtual_memory().total


def test_accelerator_probe_never_initialises_cuda() -> None:
    probe = AcceleratorProbe()
    reading = probe.read()
    assert set(reading) == set(probe.columns) and all(math.isnan(v) for v in reading.values())
    assert probe.details() == []
    assert not torch.cuda.is_initialized()


def _fake_torch(per_device: dict[int, tuple[int, int]]) -> SimpleNamespace:
    def stats(index: int) -> dict:
        alloc, res = per_device.get(index, (0, 0))
        return {
            "allocated_bytes": {"all": {"current": alloc, "peak": alloc * 2}},
            "reserved_bytes": {"all": {"current": res, "peak": res}},
            "num_alloc_retries": 1,
        }

    cuda = SimpleNamespace(
        is_initialized=lambda: True,
        device_count=lambda: 3,
        memory_stats_as_nested_dict=stats,
        get_device_properties=lambda i: SimpleNamespace(total_memory=80 << 30),
        mem_get_info=lambda i: (70 << 30, 80 << 30),
    )
    return SimpleNamespace(cuda=cuda)


def test_accelerator_probe_sums_devices_in_use_only() -> None:
    fake = _fake_torch({0: (100, 200), 2: (10, 20)})  # device 1 has no context: not watched
    probe = AcceleratorProbe(_torch=fake)
    assert probe.read() == {"vram_allocated_bytes": 110.0, "vram_reserved_bytes": 220.0}
    details = probe.details()
    assert [d.name for d in details] == ["cuda:0", "cuda:2"]
    assert details[0].free_bytes == 70 << 30 and details[0].total_bytes == 80 << 30
    assert details[0].allocated_peak_bytes == 200 and details[0].num_alloc_retries == 1
    assert AcceleratorProbe(devices=[2], _torch=fake).read() == {"vram_allocated_bytes": 10.0, "vram_reserved_bytes": 20.0}


def test_parse_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert parse_device("cuda:1") == 1 and parse_device("2") == 2 and parse_device("cuda") == 0
    with pytest.raises(ValueError, match="cuda:N"):
        parse_device("tpu")
    with pytest.raises(ValueError, match="3 CUDA device"):
        parse_device("cuda:3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="no CUDA here"):
        parse_device("cuda")
    assert not torch.cuda.is_initialized()


@linux_only
def test_process_tree_counts_children_by_pss_and_announced_workers() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; b = bytearray(80 << 20); time.sleep(30)"]
    )
    probe = ProcessTreeProbe()
    try:
        deadline = time.monotonic() + 20
        while True:
            reading = probe.read()
            if reading["ram_bytes"] - reading["rss_bytes"] > 70 << 20 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert probe.pids() == [os.getpid(), child.pid] and reading["workers"] == 0
        assert reading["ram_bytes"] - reading["rss_bytes"] > 70 << 20  # the child's private 80 MB
        assert set(reading) == set(probe.columns)
        probe.announce_workers([(child.pid, None)])
        reading = probe.read()
        assert reading["workers"] == 1 and reading["workers_bytes"] > 70 << 20
        assert probe.worker_pids_seen == {child.pid}
    finally:
        child.kill()
        child.wait()
        probe.close()


@linux_only
def test_a_workers_pss_is_read_at_a_period_set_by_the_reads_cpu_cost_not_its_wall_time() -> None:
    """On a busy machine a read's wall time stretches while its CPU cost does not: the period follows the
    CPU cost (what the probe takes from the machine), so the readings stay as frequent as it allows."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    wall = [100.0]
    cpu_per_read_s = {"cost": 0.05}
    cpu = [0.0]

    def cpu_clock() -> float:  # read before and after each PSS read: `cost` apart
        cpu[0] += cpu_per_read_s["cost"]
        return cpu[0]

    probe = ProcessTreeProbe(clock=lambda: wall[0], cpu_clock=cpu_clock)
    try:
        probe.announce_workers([(child.pid, None)])
        probe.read()
        periods = []
        for cost in (0.05, 0.001):  # 20x the cost while young: 1 s, then the 0.25 s floor
            cpu_per_read_s["cost"] = cost
            child_state = probe._children[child.pid]
            wall[0] = child_state.next_pss_s
            probe.read()
            periods.append(round(child_state.next_pss_s - wall[0], 3))
        assert periods == [1.0, 0.25]
    finally:
        child.kill()
        child.wait()
        probe.close()


PSS_SHARE = 0.05  # the promise: every child's PSS reads together take at most 5% of one core


class _FakeChildren:
    """Children that exist only for the tree probe: `pids` is what discovery finds, every RSS read answers,
    and each PSS read advances the probe's CPU clock by `cost_s` (no process, no /proc)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, pids: set[int], cost_s: float) -> None:
        self.pids, self.cost_s = pids, cost_s
        self.cpu_s = 0.0
        self.wall_s = 100.0
        self.reads: dict[int, list[float]] = {}  # pid -> the wall seconds of its PSS reads
        fakes = self

        class FakeRss:
            def __init__(self, pid: int) -> None:
                self.pid = pid

            def rss_bytes(self) -> int | None:
                return 100 << 20 if self.pid == os.getpid() or self.pid in fakes.pids else None

            def close(self) -> None:
                pass

        def read_pss(pid: int) -> process_probe.ProportionalMemory:
            self.cpu_s += self.cost_s
            self.reads.setdefault(pid, []).append(self.wall_s)
            return process_probe.ProportionalMemory(50 << 20, 40 << 20)

        monkeypatch.setattr(process_probe, "RssReader", FakeRss)
        monkeypatch.setattr(process_probe, "descendant_pids", lambda pid, leave_out=frozenset(): set(self.pids) - leave_out)
        monkeypatch.setattr(process_probe, "read_proportional_memory", read_pss)
        self.probe = ProcessTreeProbe(clock=lambda: self.wall_s, cpu_clock=lambda: self.cpu_s)

    def run(self, seconds: float, tick_s: float = 0.1) -> None:
        """Read the probe every `tick_s` for `seconds` of the fake wall clock."""
        for _ in range(round(seconds / tick_s)):
            self.probe.read()
            self.wall_s += tick_s


def test_the_pss_reads_of_many_children_share_one_budget_and_every_child_is_still_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """64 children whose reads cost 8 ms each: read each at its own period and they would take half a core.
    Together they stay within 5% of a core, and each is read about every 64 x 8 ms / 5%."""
    children = _FakeChildren(monkeypatch, set(range(1000, 1064)), cost_s=0.008)
    seconds = 120.0
    children.run(seconds)
    assert children.cpu_s <= PSS_SHARE * (seconds + ProcessTreeProbe.PSS_BURST_S) + children.cost_s
    assert children.cpu_s >= 0.8 * PSS_SHARE * seconds  # the budget is used, not wasted
    round_s = 64 * children.cost_s / PSS_SHARE  # ~10 s
    for pid in children.pids:
        times = children.reads[pid]
        assert times[0] <= 100.0 + 1.5 * round_s  # the first read within about one round
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert len(times) >= seconds / round_s - 2 and max(gaps) <= 2 * round_s


def test_a_young_child_is_read_more_often_within_the_same_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    children = _FakeChildren(monkeypatch, set(range(1000, 1032)), cost_s=0.008)
    children.run(60.0)  # every child is old now
    cpu_before, joined_s = children.cpu_s, children.wall_s
    children.pids.add(2000)  # a worker starts
    children.run(ProcessTreeProbe.YOUNG_S)
    young = len(children.reads[2000])
    old = [sum(1 for t in children.reads[pid] if t >= joined_s) for pid in range(1000, 1032)]
    assert young >= 2 * max(old)
    assert children.cpu_s - cpu_before <= PSS_SHARE * (ProcessTreeProbe.YOUNG_S + ProcessTreeProbe.PSS_BURST_S) + 0.008


def test_short_lived_workers_are_each_read_even_when_their_first_reads_spend_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four DataLoader workers of a short epoch (0.5 s) start together, each PSS read costing 50 ms (a big
    worker): two such reads spend a second of the budget, yet each worker gets its PSS (a per-worker peak),
    and later reads wait the longer for it (the total holds)."""
    children = _FakeChildren(monkeypatch, {1000}, cost_s=0.05)
    children.run(5.0)
    workers = {2000, 2001, 2002, 2003}
    children.pids |= workers
    children.run(0.5)
    children.pids -= workers
    children.run(5.0)
    assert all(children.reads.get(worker) for worker in workers), children.reads
    assert children.cpu_s <= PSS_SHARE * (children.wall_s - 100.0 + ProcessTreeProbe.PSS_BURST_S) + 4 * children.cost_s


def test_few_cheap_children_are_each_read_at_their_own_period(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget only spreads reads that would exceed it: two children of 1 ms reads, old, read every second."""
    children = _FakeChildren(monkeypatch, {1000, 1001}, cost_s=0.001)
    children.run(30.0)
    for pid in (1000, 1001):
        late = [t for t in children.reads[pid] if t >= 100.0 + ProcessTreeProbe.YOUNG_S]
        gaps = [round(b - a, 6) for a, b in zip(late, late[1:])]
        assert gaps and max(gaps) <= ProcessTreeProbe.PSS_MIN_PERIOD_S + 0.1 + 1e-6


def test_descendant_pids_match_psutil_including_grandchildren() -> None:
    script = "import subprocess, time; p = subprocess.Popen(['sleep', '30']); time.sleep(30)"
    children = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(2)]
    try:
        deadline = time.monotonic() + 20
        while len(psutil.Process().children(recursive=True)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        expected = {p.pid for p in psutil.Process().children(recursive=True)}
        assert len(expected) == 4 and descendant_pids(os.getpid()) == expected
        # another rank this process launched is left out with its own children
        other_rank = children[0].pid
        theirs = {other_rank, *(p.pid for p in psutil.Process(other_rank).children())}
        assert descendant_pids(os.getpid(), frozenset({other_rank})) == expected - theirs and len(theirs) == 2
    finally:
        for child in children:
            for grandchild in psutil.Process(child.pid).children():
                grandchild.kill()
            child.kill()
            child.wait()


def test_a_failing_probe_costs_its_columns_and_is_counted() -> None:
    class Broken:
        name = "broken"
        columns = ("heap_bytes",)

        def read(self) -> dict[str, float]:
            raise OSError("gone")

        def close(self) -> None:
            pass

    reader = ProbeReader([Broken(), ShmProbe("/nonexistent")])
    for _ in range(3):
        row = reader.read()
    assert set(row) == {"heap_bytes", "shm_used_bytes"} and math.isnan(row["heap_bytes"])
    summary = reader.errors["broken"].summary()
    assert summary is not None and (summary.source, summary.count, summary.last) == ("broken probe", 3, "OSError: gone")
    assert reader.errors["shm"].summary() is None  # missing is not failing


@linux_only
def test_exit_status_of_a_killed_child_without_reaping_it() -> None:
    import signal

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert exit_of(child.pid) is None  # still running
        child.send_signal(signal.SIGBUS)
        deadline = time.monotonic() + 10
        while exit_of(child.pid) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert exit_of(child.pid) == WorkerExit(child.pid, signal.SIGBUS, None)
        assert exit_of(child.pid) == WorkerExit(child.pid, signal.SIGBUS, None)  # read twice: not reaped
    finally:
        child.kill()
        assert child.wait() == -signal.SIGBUS  # its owner still reaps it and sees the same status
    # once reaped, the owner's Process object holds the code (multiprocessing keeps it on `_popen`)
    process = SimpleNamespace(_popen=SimpleNamespace(returncode=-signal.SIGBUS))
    assert exit_of(child.pid, process) == WorkerExit(child.pid, signal.SIGBUS, None)
    assert exit_of(child.pid, SimpleNamespace(_popen=SimpleNamespace(returncode=0))) == WorkerExit(child.pid, None, 0)
    assert exit_of(child.pid) is None  # reaped, nothing known


@linux_only
def test_the_tree_probe_records_how_an_announced_worker_ended() -> None:
    import signal

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    probe = ProcessTreeProbe()
    try:
        probe.announce_workers([(worker.pid, None), (finished.pid, None)])
        probe.read()
        worker.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while worker.pid not in probe.worker_exits and time.monotonic() < deadline:
            probe.read()  # sees the worker disappear
            time.sleep(0.02)
        while len(probe.check_worker_exits()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # the other one may still be starting up
        exits = {e.pid: e for e in probe.check_worker_exits()}
        assert exits[worker.pid].signal_name == "Killed" and exits[worker.pid].abnormal
        assert exits[finished.pid] == WorkerExit(finished.pid, None, 0) and not exits[finished.pid].abnormal
    finally:
        worker.kill()
        worker.wait()
        finished.wait()
        probe.close()


def test_shm_is_read_at_most_every_half_second_while_no_worker_fills_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from torchmem_magic.probes import shm as shm_module

    now = [0.0]
    probe = shm_module.ShmProbe(str(tmp_path), clock=lambda: now[0])
    calls = []
    real_statvfs = os.statvfs
    monkeypatch.setattr(shm_module.os, "statvfs", lambda path: (calls.append(path), real_statvfs(path))[1])
    probe.idle = True
    first = probe.read()
    now[0] = 0.4
    assert probe.read() == first and len(calls) == 1  # the sampler at the 100 ms default reuses it
    now[0] = 0.51
    probe.read()
    assert len(calls) == 2
    probe.idle = False  # DataLoader workers alive: every reading is fresh
    probe.read()
    assert len(calls) == 3


def test_the_heap_is_read_without_letting_go_of_the_gil() -> None:
    import ctypes

    probe = HeapProbe()
    if not probe.available:
        pytest.skip(probe.unavailable_reason or "no heap counters")
    # a call that let go of the GIL would wait up to a switch interval to take it back from the training thread
    assert probe._mallinfo2._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def test_proc_files_are_read_without_letting_go_of_the_gil() -> None:
    import ctypes

    from torchmem_magic.probes import procfs

    libc = procfs._libc()
    if libc is None:
        pytest.skip("no libc to call")
    # each read that let go of the GIL would block the training thread once more to get it back
    assert all(fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI for fn in (libc.pread, libc.open, libc.close))  # type: ignore[attr-defined]
    reader = procfs.ProcReader(128)
    with open("/proc/self/statm", "rb") as statm:
        assert reader.read_fd(statm.fileno()).split()[:1] == os.pread(statm.fileno(), 128, 0).split()[:1]
    assert reader.read_path("/proc/self/statm").count(b" ") == 6
    with pytest.raises(FileNotFoundError):
        reader.read_path("/proc/self/no-such-file")
    with pytest.raises(OSError):
        reader.read_fd(-1)


_LAUNCHER = """
import subprocess, sys, time
killed = subprocess.Popen([sys.executable, "-c", "import os, signal, time; time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)"])
failed = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.6); sys.exit(3)"])
print(killed.pid, failed.pid, flush=True)
time.sleep(float(sys.argv[1]))  # reaps late, as a launcher polling its workers does
killed.wait(); failed.wait()
"""


def _kernel_at_least(*version: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return found is not None and tuple(map(int, found.groups())) >= version


@linux_only
@pytest.mark.parametrize("reaped_after_s", [
    pytest.param("1.5", id="reaped_late"),  # read while a zombie
    pytest.param("0", id="reaped_at_once", marks=pytest.mark.skipif(  # gone before the witness's thread can look
        not _kernel_at_least(6, 15), reason="pidfds keep the exit status from Linux 6.15 on")),
])
def test_the_exit_witness_sees_when_and_how_processes_that_are_not_its_children_end(reaped_after_s: str) -> None:
    from torchmem_magic.probes.exits import ExitWitness

    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, reaped_after_s], stdout=subprocess.PIPE, text=True)
    killed, failed = map(int, launcher.stdout.readline().split())  # type: ignore[union-attr]
    witness = ExitWitness(time.monotonic)
    try:
        witness.watch(killed)
        witness.watch(failed)
        witness.watch(killed)  # twice: watched once
        assert exit_of(killed) is None  # not our child: waitid cannot tell
        deadline = time.monotonic() + 10
        while witness.ended(failed) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        seen_killed, seen_failed = witness.ended(killed), witness.ended(failed)
        assert seen_killed is not None and seen_failed is not None
        assert seen_killed[1] == WorkerExit(killed, 9, None) and seen_failed[1] == WorkerExit(failed, None, 3)
        assert 0.15 < seen_failed[0] - seen_killed[0] < 0.6  # the order and the time between them
    finally:
        witness.close()
        launcher.communicate()
    assert not any(t.name == "torchmem_magic-exits" for t in threading.enumerate())
    assert not [fd for fd in os.listdir("/proc/self/fd") if "pidfd" in os.path.realpath(f"/proc/self/fd/{fd}")]
    witness.watch(os.getpid())  # after close: nothing is started
    assert witness.ended(os.getpid()) is None and not any(t.name == "torchmem_magic-exits" for t in threading.enumerate())


class _Reaping:
    """A process its parent's wait has taken (state X) and the kernel releases at the `released_at`-th
    look: only then does its pidfd hold the status, as in Linux's release_task."""

    def __init__(self, released_at: int, kept_on_pidfd: bool) -> None:
        self.looks, self.released_at, self.kept_on_pidfd = 0, released_at, kept_on_pidfd

    def stat_fields(self, pid: int) -> list[bytes] | None:
        self.looks += 1
        return [b"X"] if self.looks < self.released_at else None

    def pidfd_exit(self, pidfd: int, pid: int) -> WorkerExit | None:
        released = self.looks >= self.released_at
        return WorkerExit(pid, 9, None) if released and self.kept_on_pidfd else None


@pytest.mark.parametrize("kept_on_pidfd", [True, False], ids=["linux-6.15-on", "older"])
def test_an_exit_read_while_its_parent_reaps_it_waits_for_the_release(
    monkeypatch: pytest.MonkeyPatch, kept_on_pidfd: bool
) -> None:
    from torchmem_magic.probes import exits

    reaping = _Reaping(released_at=6, kept_on_pidfd=kept_on_pidfd)
    monkeypatch.setattr(exits, "_stat_fields", reaping.stat_fields)
    monkeypatch.setattr(exits, "pidfd_exit", reaping.pidfd_exit)
    started = time.monotonic()
    how = exits.how_it_ended(-1, 4242, wait_s=30.0)
    assert how == (WorkerExit(4242, 9, None) if kept_on_pidfd else None)
    assert reaping.looks >= reaping.released_at and time.monotonic() - started < 10  # not the whole wait


@linux_only
def test_only_a_process_in_its_reaping_reads_as_being_reaped() -> None:
    from torchmem_magic.probes.exits import being_reaped, zombie_exit

    child = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    deadline = time.monotonic() + 10
    while zombie_exit(child.pid) is None and time.monotonic() < deadline:  # a zombie until we wait
        time.sleep(0.01)
    assert zombie_exit(child.pid) == WorkerExit(child.pid, 9, None)
    assert not being_reaped(child.pid) and not being_reaped(os.getpid())
    child.wait()
    assert not being_reaped(child.pid)  # gone
