"""The probes one run reads, built together at its start: the process tree, the heap, /dev/shm and the
accelerators, read in two ways. The background reading (sampler thread) takes everything, children
discovery and PSS at their slow rates included; the step reading (training thread) takes only the
~1 µs counters and copies the slow columns from the last background reading."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..core import resources
from ..core.model import DeviceMemory
from ..report.evidence import ShmEvidence, WorkerEvidence
from .accelerator import AcceleratorProbe
from .base import ErrorCount, ProbeReader, Reading
from .heap import HeapProbe
from .limits import MemoryLimit, memory_limit, sharing_strategy
from .process import ProcessTreeProbe
from .shm import ShmProbe, ShmReading

NAN = math.nan
#: columns a step reading copies from the last background reading (too slow to read at every step)
SLOW_COLUMNS = tuple(r.column for r in resources.RESOURCES if r.slow)
#: the columns the readings fill by hand, looked up once (a step reading runs at every sampled step)
_RAM, _RSS, _HEAP = resources.RAM.column, resources.RSS.column, resources.HEAP.column
_WORKER_COUNT = resources.WORKER_COUNT.column


class ProbeBundle:
    """Opened by the constructor, closed by `close()`; an interrupt while opening closes what was open."""

    def __init__(self, shm_path: str, devices: list[int] | None, leave_out: frozenset[int] = frozenset()) -> None:
        self.shm_path = shm_path
        self.tree = ProcessTreeProbe(leave_out=leave_out)
        try:
            self.heap = HeapProbe()
            self.shm = ShmProbe(shm_path)
            self.accelerator = AcceleratorProbe(devices)
            self._background_heap = HeapProbe(release_gil=True)
            self._background = ProbeReader([self.tree, self._background_heap, self.accelerator, self.shm])
            self._per_step = ProbeReader([self.tree.kernel, self.heap, self.accelerator])
            self.limit: MemoryLimit = memory_limit()
            self.devices_at_start: tuple[DeviceMemory, ...] = tuple(self.accelerator.details())
        except BaseException:
            self.tree.close()
            raise
        self._last_slow: Reading = dict.fromkeys(SLOW_COLUMNS, NAN)
        self.max_workers = 0

    def background_row(self, running: bool) -> Reading:
        """Everything; while the run goes on with no DataLoader worker alive (what fills /dev/shm),
        /dev/shm is read at its slower rate (its statvfs lets go of the GIL)."""
        self.shm.idle = running and not self.tree.workers
        row = self._background.read()
        self._last_slow = {name: row[name] for name in SLOW_COLUMNS}
        workers = row[_WORKER_COUNT]
        if not math.isnan(workers):
            self.max_workers = max(self.max_workers, int(workers))
        return row

    def offer_heap(self, row: Mapping[str, float]) -> None:
        """A step row filed since the last background reading: its heap figure serves that reading."""
        self._background_heap.offer(row[_HEAP])

    def step_row(self) -> Reading:
        """The fast counters now, the slow columns as last read; RAM is the kernel's RSS plus children."""
        row = self._per_step.read()
        row[_RAM] = row[_RSS] + self.tree.children_bytes
        row.update(self._last_slow)
        return row

    def announce_workers(self, workers: list[tuple[int, Any]]) -> None:
        """A loader pass started these workers: counted exactly, even for epochs shorter than an interval."""
        self.tree.announce_workers(workers)
        self.max_workers = max(self.max_workers, len(workers))

    @property
    def heap_available(self) -> bool:
        return self.heap.available

    def shm_usage(self) -> ShmReading | None:
        return self.shm.usage()

    def device_uuids(self) -> list[str]:
        """The CUDA devices this process's allocator uses (a rank's own devices)."""
        return self.accelerator.device_uuids()

    def error_counts(self) -> list[ErrorCount]:
        return [*self._background.errors.values(), *self._per_step.errors.values(), *self.accelerator.error_counts()]

    def evidence_fields(self) -> dict[str, Any]:
        """The run's evidence that the probes know (fields of RunEvidence)."""
        return {
            "ram_limit_bytes": self.limit.limit_bytes, "ram_limit_source": self.limit.source,
            "heap_available": self.heap.available, "shm": self._shm_evidence(), "workers": self._worker_evidence(),
            "worker_exits": tuple(self.tree.check_worker_exits()),
            "devices_start": self.devices_at_start, "devices_end": tuple(self.accelerator.details()),
        }

    def _shm_evidence(self) -> ShmEvidence | None:
        usage = self.shm.usage()
        if usage is None:
            return None
        return ShmEvidence(self.shm_path, usage.total_bytes, sharing_strategy(), self.shm.torch_segments(self.tree.pids()))

    def _worker_evidence(self) -> WorkerEvidence | None:
        tree = self.tree
        if not tree.worker_pids_seen:
            return None
        peaks = tuple((pid, pss, uss) for pid, (pss, uss) in sorted(tree.worker_peaks.items()))
        return WorkerEvidence(self.max_workers, len(tree.worker_pids_seen), peaks)

    def close(self) -> None:
        """Close the process probe's /proc readers (idempotent)."""
        self.tree.close()
