"""Memory of the kernel process and its descendants, and how DataLoader workers ended.

RSS comes from a kept-open `/proc/<pid>/statm` (~2 µs a read), PSS/USS of children from
`smaps_rollup` at a slow adaptive rate, child discovery from `/proc/<pid>/task/*/children`.
A worker's exit status is read with `waitid(..., WNOWAIT)`, which leaves the child for
multiprocessing to reap: observing never changes what torch sees.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from ..core.resources import RAM, RSS, WORKERS, WORKER_COUNT
from ..analysis.forensics import WorkerExit
from .base import Reading
from .procfs import ProcReader

PAGE_BYTES: int = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_HAS_PROC = os.path.exists("/proc/self/statm")
#: /proc reads that keep the GIL (see procfs): statm is a line of 7 numbers; a thread's children file
#: lists pids, so its buffer holds thousands
_STATM = ProcReader(128)
_CHILDREN = ProcReader(65536)


class RssReader:
    """Resident set size of one process.

    On Linux it keeps `/proc/<pid>/statm` open and `pread`s it (~2 µs); elsewhere psutil (~40 µs).
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._process: psutil.Process | None = None
        if _HAS_PROC:
            try:
                self._fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
            except OSError:
                self._fd = None
        if self._fd is None:
            try:
                self._process = psutil.Process(pid)
            except psutil.Error:
                self._process = None

    def rss_bytes(self) -> int | None:
        """Current RSS, or None once the process is gone (a zombie reads as gone too)."""
        if self._fd is not None:
            try:
                fields = _STATM.read_fd(self._fd).split()
            except OSError:
                return None
            pages = int(fields[1]) if len(fields) > 1 else 0
            return pages * PAGE_BYTES if pages else None
        if self._process is not None:
            try:
                return int(self._process.memory_info().rss)
            except psutil.Error:
                return None
        return None

    def close(self) -> None:
        """Idempotent, also when a Ctrl-C cut the last call short: the descriptor is forgotten before it
        is closed, so a repeated close never closes it twice (by then the number may be another file's)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


@dataclass(frozen=True)
class ProportionalMemory:
    """PSS (shared pages split among sharers) and USS (private pages) of one process."""

    pss_bytes: int
    uss_bytes: int


def read_proportional_memory(pid: int) -> ProportionalMemory | None:
    """PSS/USS of `pid` via /proc/<pid>/smaps_rollup (psutil elsewhere); None if unavailable.

    Costs milliseconds per process (more for big processes): call it at a slow, adaptive rate. A process
    that has exited but is not reaped yet (a DataLoader worker at its epoch's end) has no memory map: it
    gives None, not a reading of 0 (psutil reads it as all zeros), so its peak keeps its live readings.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            values: dict[bytes, int] = {}
            for line in f:
                key, _, rest = line.partition(b":")
                if key in (b"Pss", b"Private_Clean", b"Private_Dirty"):
                    values[key] = int(rest.split()[0]) * 1024
        if b"Pss" in values:
            return ProportionalMemory(
                values[b"Pss"], values.get(b"Private_Clean", 0) + values.get(b"Private_Dirty", 0)
            )
    except ProcessLookupError:  # exited: a zombie's entry stays, its memory map is gone
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.Error, AttributeError, OSError):
        return None
    pss_bytes, uss_bytes = int(getattr(info, "pss", info.uss)), int(info.uss)
    return ProportionalMemory(pss_bytes, uss_bytes) if pss_bytes or uss_bytes else None


@functools.cache
def _proc_children_supported() -> bool:
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def descendant_pids(pid: int, leave_out: frozenset[int] = frozenset()) -> set[int]:
    """All descendants of `pid`, but those in `leave_out` and theirs.

    Linux: `/proc/<pid>/task/<tid>/children` of every thread, recursively (~65 µs for a kernel with a
    few workers); where the kernel has no such file (or not Linux), psutil (~1-2 ms).
    """
    if not _proc_children_supported():
        try:
            every = {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            return set()
        return every.difference(*(descendant_pids(p) | {p} for p in leave_out if p in every))
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # exited meanwhile
        for tid in tids:
            try:
                children = _CHILDREN.read_path(f"/proc/{parent}/task/{tid}/children").split()
            except OSError:
                continue  # the thread or process exited meanwhile
            for child in map(int, children):
                if child not in found and child not in leave_out:
                    found.add(child)
                    frontier.append(child)
    return found


# ----------------------------------------------------------------------------- how a worker ended


def exit_of(pid: int, process: Any = None) -> WorkerExit | None:
    """How child `pid` ended, None while it runs (or when that cannot be known).

    `waitid(WNOWAIT)` reads the status and leaves the child to be reaped by its owner. Once
    multiprocessing has reaped it, its `Process` object keeps the code: read without polling.
    """
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already, or not our child
        code = getattr(getattr(process, "_popen", None), "returncode", None)
        if not isinstance(code, int):
            return None
        return WorkerExit(pid, -code, None) if code < 0 else WorkerExit(pid, None, code)
    except OSError:
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return WorkerExit(pid, None, info.si_status)
    return WorkerExit(pid, info.si_status, None)  # killed or dumped core


# ----------------------------------------------------------------------------- the process tree


@dataclass
class ChildProcess:
    """One descendant of the kernel process and what we last knew of its memory."""

    pid: int
    rss: RssReader
    is_worker: bool = False
    pss_bytes: int | None = None
    uss_bytes: int | None = None
    next_pss_s: float = 0.0
    pss_period_s: float = 1.0  # the period its last PSS read set (how often it wants reading)
    first_seen_s: float = 0.0
    pss_reads: int = 0  # tried so far (a child never tried is read before the budget is looked at)

    def memory_bytes(self) -> int | None:
        """PSS where read at least once, else RSS (an upper bound)."""
        if self.pss_bytes is not None:
            return self.pss_bytes
        return self.rss.rss_bytes()


class KernelRssProbe:
    """The kernel process's own RSS: the one process counter cheap enough for every step."""

    name: str = "kernel RSS"
    columns: tuple[str, ...] = (RSS.column,)

    def __init__(self, pid: int | None = None) -> None:
        self._reader = RssReader(os.getpid() if pid is None else pid)

    def rss_bytes(self) -> float:
        value = self._reader.rss_bytes()
        return float("nan") if value is None else float(value)

    def read(self) -> Reading:
        return {RSS.column: self.rss_bytes()}

    def close(self) -> None:
        self._reader.close()


class ProcessTreeProbe:
    """RAM of the kernel process and its descendants (DataLoader workers, shm managers...).

    The kernel's RSS is read on every tick. Child discovery (~65 µs from /proc) runs twice a second.
    Each child's PSS (~8 ms + 25 ms/GiB) is read at a period adapted to what its read costs in CPU
    (at least 40x, 20x in a worker's first seconds), and all the children's reads together stay
    within PSS_CPU_SHARE of one core: when they would take more, the children are read in turn, the
    most periods overdue first, so every child is still read, each
    about every N x cost / PSS_CPU_SHARE seconds with N children (64 ranks of ~8 ms: about every
    10 s). A young child's period is shorter, so within the same total it is read more often (up to
    four times) without starving the others. A child never read is read at once, over the budget if
    need be (the others then wait the longer): a worker of a short epoch must not end with no PSS.
    Between two reads a child counts at its last PSS.
    Workers announced by the DataLoader hook are picked up at the next tick without waiting for
    discovery; when one disappears, how it ended is recorded in `worker_exits`.
    """

    name: str = "process tree"
    columns: tuple[str, ...] = (RAM.column, RSS.column, WORKERS.column, WORKER_COUNT.column)
    CHILDREN_REFRESH_S = 0.5
    PSS_MIN_PERIOD_S = 1.0
    YOUNG_PSS_MIN_PERIOD_S = 0.25  # a worker's first seconds: copy-on-access shows there, in one short epoch
    YOUNG_S = 10.0
    PSS_COST_FACTOR = 40.0  # wait at least 40x what the last PSS read cost (≤ 2.5% of a core a worker) ...
    YOUNG_PSS_COST_FACTOR = 20.0  # ... 5% in a worker's first seconds (the read is kernel work, off the GIL)
    PSS_CPU_SHARE = 0.05  # every child's PSS reads together: at most this share of one core ...
    PSS_BURST_S = 1.0  # ... over any stretch longer than this (budget unused for longer is not saved up)

    def __init__(
        self, pid: int | None = None, clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time, leave_out: frozenset[int] = frozenset(),
    ) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.leave_out = leave_out  # children that are not this process's to count (other ranks it launched)
        self._clock = clock
        self._cpu_clock = cpu_clock  # what a PSS read costs this thread (the kernel's work in the read included)
        self.kernel = KernelRssProbe(self.pid)
        self._children: dict[int, ChildProcess] = {}
        self._worker_processes: dict[int, Any] = {}  # pid -> its multiprocessing.Process, if known
        self._announced: list[tuple[int, Any]] = []  # appended from the hook's thread, drained by read()
        self._next_refresh_s = 0.0
        self._pss_spent_until_s = 0.0  # the PSS reads so far, at PSS_CPU_SHARE, pay for the time up to this
        self.children_bytes = 0.0  # children's memory at the last read (the step samples reuse it)
        self.workers = 0
        self.worker_peaks: dict[int, tuple[int, int]] = {}  # pid -> (PSS peak, USS peak) of DataLoader workers
        self.worker_exits: dict[int, WorkerExit] = {}

    @property
    def worker_pids_seen(self) -> set[int]:
        return set(self._worker_processes)

    def announce_workers(self, workers: list[tuple[int, Any]]) -> None:
        """Called by the DataLoader hook with (pid, Process) of a new iterator's workers."""
        self._announced.extend(workers)

    def _refresh_children(self) -> None:
        found = descendant_pids(self.pid, self.leave_out)
        now = self._clock()
        for pid in found.difference(self._children):
            self._children[pid] = ChildProcess(pid, RssReader(pid), is_worker=pid in self._worker_processes, first_seen_s=now)
        for pid in set(self._children).difference(found):
            self._forget(pid)

    def _take_announced(self) -> None:
        announced, self._announced = self._announced, []
        for pid, process in announced:
            self._worker_processes[pid] = process
            child = self._children.get(pid)
            if child is None:
                self._children[pid] = ChildProcess(pid, RssReader(pid), is_worker=True, first_seen_s=self._clock())
            else:
                child.is_worker = True

    def _forget(self, pid: int) -> None:
        """A child is gone: for a worker, record how it ended."""
        self._children.pop(pid).rss.close()
        if pid in self._worker_processes:
            self._record_exit(pid)

    def _record_exit(self, pid: int) -> None:
        if pid not in self.worker_exits:
            ended = exit_of(pid, self._worker_processes.get(pid))
            if ended is not None:
                self.worker_exits[pid] = ended

    def check_worker_exits(self) -> list[WorkerExit]:
        """How every worker seen so far ended (those still running are left out)."""
        if self._announced:
            self._take_announced()
        for pid in self._worker_processes:
            self._record_exit(pid)
        return list(self.worker_exits.values())

    def read(self) -> Reading:
        now = self._clock()
        if self._announced:
            self._take_announced()
        if now >= self._next_refresh_s:
            self._refresh_children()
            self._next_refresh_s = now + self.CHILDREN_REFRESH_S
        rss = self.kernel.rss_bytes()
        self._read_due_pss(now)
        children_bytes = workers_bytes = workers = 0
        for pid, child in list(self._children.items()):
            if child.rss.rss_bytes() is None:  # exited since the last discovery
                self._forget(pid)
                continue
            size = child.memory_bytes() or 0
            children_bytes += size
            if child.is_worker:
                workers_bytes += size
                workers += 1
        self.children_bytes, self.workers = float(children_bytes), workers
        return {
            RAM.column: rss + children_bytes,
            RSS.column: rss,
            WORKERS.column: float(workers_bytes),
            WORKER_COUNT.column: float(workers),
        }

    def _read_due_pss(self, now: float) -> None:
        """Read the PSS of the children that are due, the most periods overdue first, while the budget of
        PSS_CPU_SHARE of a core allows: a read that costs c seconds of CPU pays for c / PSS_CPU_SHARE
        seconds, and the next read waits until then (up to PSS_BURST_S of unused budget is kept)."""
        due = [child for child in self._children.values() if now >= child.next_pss_s]
        if not due:
            return
        # a child never read comes first, whatever the budget: a short-lived worker would otherwise end
        # with no PSS at all (its first read is paid for, so the others wait the longer); then the most
        # periods overdue
        due.sort(key=lambda child: (child.pss_reads > 0, (child.next_pss_s - now) / child.pss_period_s))
        self._pss_spent_until_s = max(self._pss_spent_until_s, now - self.PSS_BURST_S)
        for child in due:
            if child.pss_reads > 0 and self._pss_spent_until_s > now:
                break
            cost_s = self._read_pss(child, now)
            self._pss_spent_until_s += cost_s / self.PSS_CPU_SHARE

    def _read_pss(self, child: ChildProcess, now: float) -> float:
        """One child's PSS and USS, its next read set by what this one cost; returns that CPU cost."""
        started = self._cpu_clock()
        child.pss_reads += 1
        reading = read_proportional_memory(child.pid)
        cost_s = self._cpu_clock() - started  # CPU, not wall: a busy machine stretches the wall time alone
        young = now - child.first_seen_s < self.YOUNG_S
        min_period_s, factor = (
            (self.YOUNG_PSS_MIN_PERIOD_S, self.YOUNG_PSS_COST_FACTOR) if young
            else (self.PSS_MIN_PERIOD_S, self.PSS_COST_FACTOR)
        )
        child.pss_period_s = max(min_period_s, factor * cost_s)
        child.next_pss_s = now + child.pss_period_s
        if reading is not None:
            child.pss_bytes, child.uss_bytes = reading.pss_bytes, reading.uss_bytes
            if child.is_worker:
                pss, uss = self.worker_peaks.get(child.pid, (0, 0))
                self.worker_peaks[child.pid] = (max(pss, reading.pss_bytes), max(uss, reading.uss_bytes))
        return max(cost_s, 0.0)

    def pids(self) -> list[int]:
        """The kernel and its live descendants."""
        return [self.pid, *self._children]

    def close(self) -> None:
        """Close every reader and drop the worker Process objects (they belong to torch)."""
        self.kernel.close()
        for child in self._children.values():
            child.rss.close()
        self._children.clear()
        self._worker_processes = dict.fromkeys(self._worker_processes)
