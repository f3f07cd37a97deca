"""Readers of memory counters, cheap enough to call many times a second.

None of them changes state: CUDA is only read once the user's code has initialised it, the sharing
strategy is only read, and nothing is imported before a probe is first used.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .model import DeviceMemory

NAN = float("nan")
PAGE_BYTES: int = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_HAS_PROC = os.path.exists("/proc/self/statm")


# ----------------------------------------------------------------------------- process memory


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
                fields = os.pread(self._fd, 128, 0).split()
            except OSError:
                return None
            pages = int(fields[1]) if len(fields) > 1 else 0
            return pages * PAGE_BYTES if pages else None
        if self._process is not None:
            try:
                return self._process.memory_info().rss
            except psutil.Error:
                return None
        return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class ProportionalMemory:
    """PSS (shared pages split among sharers) and USS (private pages) of one process."""

    pss_bytes: int
    uss_bytes: int


def read_proportional_memory(pid: int) -> ProportionalMemory | None:
    """PSS/USS of `pid` via /proc/<pid>/smaps_rollup (psutil elsewhere); None if unavailable.

    Costs milliseconds per process (more for big processes): call it at a slow, adaptive rate.
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
    except (OSError, ValueError, IndexError):
        pass
    try:
        info = psutil.Process(pid).memory_full_info()
        return ProportionalMemory(int(getattr(info, "pss", info.uss)), int(info.uss))
    except (psutil.Error, AttributeError, OSError):
        return None


@functools.cache
def _proc_children_supported() -> bool:
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def descendant_pids(pid: int) -> set[int]:
    """All descendants of `pid`.

    Linux: `/proc/<pid>/task/<tid>/children` of every thread, recursively (~65 µs for a kernel with a
    few workers); where the kernel has no such file (or not Linux), psutil (~1-2 ms).
    """
    if not _proc_children_supported():
        try:
            return {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            return set()
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
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    children = f.read().split()
            except OSError:
                continue  # the thread or process exited meanwhile
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
    return found


@dataclass
class ChildProcess:
    """One descendant of the kernel process and what we last knew of its memory."""

    pid: int
    rss: RssReader
    is_worker: bool = False
    pss_bytes: int | None = None
    uss_bytes: int | None = None
    next_pss_s: float = 0.0

    def memory_bytes(self) -> int | None:
        """PSS where read at least once, else RSS (an upper bound)."""
        if self.pss_bytes is not None:
            return self.pss_bytes
        return self.rss.rss_bytes()


@dataclass(frozen=True)
class TreeReading:
    ram_bytes: int  # kernel RSS + children's memory (PSS where known)
    rss_bytes: int  # kernel process alone
    workers_bytes: int
    workers: int
    children: int


class ProcessTreeProbe:
    """RAM of the kernel process and its descendants (DataLoader workers, shm managers...).

    The kernel's RSS is read on every tick. Child discovery (~65 µs from /proc) runs twice a
    second, and each child's PSS (~8 ms + 25 ms/GiB) at a period adapted to what it costs, so
    the probe never takes more than ~2% of one core. Worker PIDs announced by the DataLoader hook
    are picked up at the next tick without waiting for discovery.
    """

    CHILDREN_REFRESH_S = 0.5
    PSS_MIN_PERIOD_S = 1.0
    PSS_COST_FACTOR = 50.0  # wait at least 50x what the last PSS read cost

    def __init__(self, pid: int | None = None, clock: Any = time.monotonic) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._clock = clock
        self._kernel = RssReader(self.pid)
        self._children: dict[int, ChildProcess] = {}
        self._worker_pids: set[int] = set()
        self._announced: list[int] = []  # appended from the hook's thread, drained by tick()
        self._next_refresh_s = 0.0
        self.worker_pids_seen: set[int] = set()
        self.worker_peaks: dict[int, tuple[int, int]] = {}  # pid -> (PSS peak, USS peak) of DataLoader workers

    def announce_workers(self, pids: list[int]) -> None:
        """Called by the DataLoader hook with the PIDs of a new iterator's workers."""
        self._announced.extend(pids)

    def kernel_rss_bytes(self) -> int:
        return self._kernel.rss_bytes() or 0

    def _refresh_children(self) -> None:
        found = descendant_pids(self.pid)
        for pid in found.difference(self._children):
            self._children[pid] = ChildProcess(pid, RssReader(pid), is_worker=pid in self._worker_pids)
        for pid in set(self._children).difference(found):
            self._children.pop(pid).rss.close()

    def _take_announced(self) -> None:
        announced, self._announced = self._announced, []
        for pid in announced:
            self._worker_pids.add(pid)
            self.worker_pids_seen.add(pid)
            child = self._children.get(pid)
            if child is None:
                self._children[pid] = ChildProcess(pid, RssReader(pid), is_worker=True)
            else:
                child.is_worker = True

    def tick(self) -> TreeReading:
        now = self._clock()
        if self._announced:
            self._take_announced()
        if now >= self._next_refresh_s:
            self._refresh_children()
            self._next_refresh_s = now + self.CHILDREN_REFRESH_S
        rss = self.kernel_rss_bytes()
        children_bytes = workers_bytes = workers = 0
        for pid, child in list(self._children.items()):
            if now >= child.next_pss_s:
                started = time.perf_counter()
                reading = read_proportional_memory(pid)
                cost_s = time.perf_counter() - started
                child.next_pss_s = now + max(self.PSS_MIN_PERIOD_S, self.PSS_COST_FACTOR * cost_s)
                if reading is not None:
                    child.pss_bytes, child.uss_bytes = reading.pss_bytes, reading.uss_bytes
                    if child.is_worker:
                        pss, uss = self.worker_peaks.get(pid, (0, 0))
                        self.worker_peaks[pid] = (max(pss, reading.pss_bytes), max(uss, reading.uss_bytes))
            if child.rss.rss_bytes() is None:  # exited since the last discovery
                self._children.pop(pid).rss.close()
                continue
            size = child.memory_bytes() or 0
            children_bytes += size
            if child.is_worker:
                workers_bytes += size
                workers += 1
        return TreeReading(rss + children_bytes, rss, workers_bytes, workers, len(self._children))

    def pids(self) -> list[int]:
        """The kernel and its live descendants."""
        return [self.pid, *self._children]

    def close(self) -> None:
        self._kernel.close()
        for child in self._children.values():
            child.rss.close()
        self._children.clear()


# ----------------------------------------------------------------------------- CPU heap


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]


class HeapProbe:
    """Bytes the C heap really has in use (glibc `mallinfo2`: uordblks + hblkhd, ~1 µs).

    RSS includes freed-but-not-returned pages; heap in use tracks what is really retained.
    `available` is False (with `unavailable_reason`) on musl/macOS, old glibc, or when
    another allocator is preloaded (its memory is invisible to glibc's counters).
    """

    def __init__(self) -> None:
        self._mallinfo2: Any = None
        self.unavailable_reason: str | None = None
        preload = os.environ.get("LD_PRELOAD", "")
        if not sys.platform.startswith("linux"):
            self.unavailable_reason = f"no glibc heap counters on {sys.platform}"
        elif any(name in preload for name in ("jemalloc", "tcmalloc", "mimalloc")):
            self.unavailable_reason = f"another allocator is preloaded ({preload})"
        else:
            try:
                fn = ctypes.CDLL(None).mallinfo2
                fn.restype, fn.argtypes = _Mallinfo2, []
                self._mallinfo2 = fn
            except (OSError, AttributeError):
                self.unavailable_reason = "mallinfo2 not found (not glibc >= 2.33)"

    @property
    def available(self) -> bool:
        return self._mallinfo2 is not None

    def read(self) -> float:
        """Heap bytes in use, NaN when unavailable."""
        if self._mallinfo2 is None:
            return NAN
        info = self._mallinfo2()
        return float(info.uordblks + info.hblkhd)


# ----------------------------------------------------------------------------- /dev/shm


@dataclass(frozen=True)
class ShmReading:
    used_bytes: int
    total_bytes: int


class ShmProbe:
    """Used and total bytes of the shared-memory filesystem (statvfs, ~2 µs).

    With torch's default `file_descriptor` strategy the segments are unlinked at once, so only
    the filesystem's counters see them, not a directory listing.
    """

    def __init__(self, path: str = "/dev/shm") -> None:
        self.path = path
        self.available = os.path.isdir(path)

    def read(self) -> ShmReading | None:
        if not self.available:
            return None
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None
        return ShmReading((st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize)

    def torch_segments(self, pids: list[int]) -> int:
        """`torch_*` segments in use: files still in the directory (file_system strategy) plus
        unlinked ones the given processes still hold open (file_descriptor strategy unlinks at once)."""
        if not self.available:
            return 0
        try:
            named = {n for n in os.listdir(self.path) if n.startswith("torch_")}
        except OSError:
            named = set()
        held = set()
        prefix = os.path.join(self.path, "torch_")
        for pid in pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(prefix):
                    held.add(target.removesuffix(" (deleted)").rsplit("/", 1)[-1])
        return len(named | held)


def sharing_strategy() -> str | None:
    """torch.multiprocessing's current sharing strategy (only read, never set)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return str(torch.multiprocessing.get_sharing_strategy())
    except Exception:  # a broken/partial torch must not break the report
        return None


# ----------------------------------------------------------------------------- memory limit


@dataclass(frozen=True)
class MemoryLimit:
    limit_bytes: int
    source: str  # "cgroup v2", "cgroup v1" or "system"


_UNLIMITED = 1 << 60  # cgroup v1 writes ~2^63 for "no limit"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return value if value < _UNLIMITED else None


def _cgroup_limit(proc_root: Path, sys_root: Path) -> MemoryLimit | None:
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    best: MemoryLimit | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2 unified hierarchy: walk from our group up to the root
            base, name, source = sys_root / "fs" / "cgroup", "memory.max", "cgroup v2"
        elif "memory" in controllers.split(","):
            base, name, source = sys_root / "fs" / "cgroup" / "memory", "memory.limit_in_bytes", "cgroup v1"
        else:
            continue
        group = Path(rel.lstrip("/"))
        for level in [group, *group.parents]:
            value = _read_int(base / level / name)
            if value is not None and (best is None or value < best.limit_bytes):
                best = MemoryLimit(value, source)
    return best


def memory_limit(proc_root: str = "/proc", sys_root: str = "/sys") -> MemoryLimit:
    """The RAM limit the OOM killer enforces for this process: the tightest cgroup limit, else RAM."""
    system = MemoryLimit(int(psutil.virtual_memory().total), "system")
    cgroup = _cgroup_limit(Path(proc_root), Path(sys_root))
    return cgroup if cgroup is not None and cgroup.limit_bytes < system.limit_bytes else system


# ----------------------------------------------------------------------------- accelerators


def parse_device(spec: str) -> int:
    """'cuda:1', 'cuda' or '1' -> CUDA device index; ValueError naming the accepted forms.

    Checks the index against the visible device count, which queries the driver without
    creating a CUDA context.
    """
    text = spec.strip().lower()
    if text in ("cuda", "gpu"):
        text = "0"
    if text.startswith("cuda:"):
        text = text[5:]
    if not text.isdigit():
        raise ValueError(f"--device takes 'cuda', 'cuda:N' or 'N', got {spec!r}")
    import torch

    visible = torch.cuda.device_count()
    if int(text) >= visible:
        raise ValueError(f"--device {spec}: {visible} CUDA device(s) visible" + ("" if visible else " (no CUDA here)"))
    return int(text)


@dataclass
class AcceleratorProbe:
    """CUDA (or MPS) memory of the watched devices; reads nothing until the user's code has
    initialised the accelerator, so observing never creates a CUDA context.

    Args:
        devices: CUDA indices to watch; None watches every device the caching allocator uses.
    """

    devices: list[int] | None = None
    _torch: Any = field(default=None, repr=False)

    def _torch_module(self) -> Any:
        return self._torch if self._torch is not None else sys.modules.get("torch")

    def _cuda(self) -> Any:
        torch = self._torch_module()
        if torch is None:
            return None
        cuda = getattr(torch, "cuda", None)
        try:
            return cuda if cuda is not None and cuda.is_initialized() else None
        except Exception:
            return None

    @staticmethod
    def _raw_stats(cuda: Any, index: int) -> dict[str, Any]:
        """The caching allocator's nested stats: one C call, unlike memory_allocated()'s flattening."""
        return cuda.memory_stats_as_nested_dict(index) or {}

    def _watched(self, cuda: Any) -> list[tuple[int, dict[str, Any]]]:
        indices = self.devices if self.devices is not None else range(cuda.device_count())
        out = []
        for index in indices:
            stats = self._raw_stats(cuda, index)
            if self.devices is not None or stats.get("reserved_bytes", {}).get("all", {}).get("current", 0):
                out.append((index, stats))
        return out

    def read(self) -> tuple[float, float]:
        """(allocated, reserved) bytes summed over watched devices; (NaN, NaN) without one in use."""
        try:
            cuda = self._cuda()
            if cuda is None:
                return self._read_mps()
            allocated = reserved = 0
            watched = self._watched(cuda)
            if not watched:
                return NAN, NAN
            for _, stats in watched:
                allocated += stats["allocated_bytes"]["all"]["current"]
                reserved += stats["reserved_bytes"]["all"]["current"]
            return float(allocated), float(reserved)
        except Exception:  # stats must never break the user's loop
            return NAN, NAN

    def _read_mps(self) -> tuple[float, float]:
        torch = self._torch_module()
        if torch is None or sys.platform != "darwin":
            return NAN, NAN
        try:
            if not torch.backends.mps.is_available() or not torch.mps.driver_allocated_memory():
                return NAN, NAN
            return float(torch.mps.current_allocated_memory()), float(torch.mps.driver_allocated_memory())
        except Exception:
            return NAN, NAN

    def details(self) -> list[DeviceMemory]:
        """Per-device stats incl. peaks, retries and total memory (slower: call at start and end)."""
        cuda = self._cuda()
        if cuda is None:
            allocated, reserved = self._read_mps()
            if allocated != allocated:
                return []
            return [DeviceMemory("mps", int(allocated), int(reserved), int(allocated), int(reserved), None, None, None)]
        out = []
        for index, stats in self._watched(cuda):
            free: int | None = None
            total: int | None = None
            try:  # a watched device has a context already, so this creates none
                free, total = (int(v) for v in cuda.mem_get_info(index))
            except Exception:
                try:
                    total = int(cuda.get_device_properties(index).total_memory)
                except Exception:
                    pass
            out.append(
                DeviceMemory(
                    name=f"cuda:{index}",
                    allocated_bytes=stats["allocated_bytes"]["all"]["current"],
                    reserved_bytes=stats["reserved_bytes"]["all"]["current"],
                    allocated_peak_bytes=stats["allocated_bytes"]["all"]["peak"],
                    reserved_peak_bytes=stats["reserved_bytes"]["all"]["peak"],
                    num_alloc_retries=stats.get("num_alloc_retries"),
                    total_bytes=total,
                    free_bytes=free,
                )
            )
        return out
