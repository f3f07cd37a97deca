"""Each resource's summary over a run, as the resources table names them (pure).

A row of the table with a `summary` key is summarised here: RAM, heap, VRAM, /dev/shm and the
DataLoader workers by summarisers of their own (each knows what else its resource has: a limit's
source, the devices, the sharing strategy), any other row by the summary every resource has (its
start, end and peak readings). Rates are left to the verdict: the assembly adds them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..core import resources
from ..core.model import (
    DeviceMemory,
    HeapSummary,
    RamSummary,
    ResourceSummary,
    ShmSummary,
    VramSummary,
    WorkerSummary,
)
from ..core.resources import VRAM, VRAM_RESERVED, WORKERS, Resource
from ..core.timeline import NAN, Timeline
from .evidence import RunEvidence


def _int_or(value: float, default: int = 0) -> int:
    return default if math.isnan(value) else int(value)


def _peak(timeline: Timeline, column: str) -> float:
    values = [timeline.by_time.max(column), timeline.by_step.max(column)]
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else NAN


def _span(timeline: Timeline, column: str) -> dict[str, int]:
    """The first, last and highest readings of a column (0 where it has none)."""
    by_time = timeline.by_time
    return {
        "start_bytes": _int_or(by_time.first_value(column)),
        "end_bytes": _int_or(by_time.last_value(column)),
        "peak_bytes": _int_or(_peak(timeline, column)),
    }


def vram_summary(
    timeline: Timeline, devices_start: Sequence[DeviceMemory], devices_end: Sequence[DeviceMemory]
) -> VramSummary | None:
    """Accelerator memory over the run; None when no device was in use."""
    by_time = timeline.by_time
    allocated_peak = _peak(timeline, VRAM.column)
    if math.isnan(allocated_peak) and not devices_end:
        return None
    start = {d.name: d for d in devices_start}
    # the allocator's own peak counters catch peaks between samples, when they rose in this run
    peak_from_counters = sum(
        d.allocated_peak_bytes
        for d in devices_end
        if d.name not in start or d.allocated_peak_bytes > start[d.name].allocated_peak_bytes
    )
    retries_start = sum(d.num_alloc_retries or 0 for d in devices_start)
    totals = [d.total_bytes for d in devices_end]
    known_totals = [t for t in totals if t]
    return VramSummary(
        allocated_start_bytes=_int_or(by_time.first_value(VRAM.column)),
        allocated_end_bytes=_int_or(by_time.last_value(VRAM.column)),
        allocated_peak_bytes=max(_int_or(allocated_peak), peak_from_counters),
        reserved_end_bytes=_int_or(by_time.last_value(VRAM_RESERVED.column)),
        reserved_peak_bytes=_int_or(_peak(timeline, VRAM_RESERVED.column)),
        per_step_bytes=None,
        limit_bytes=sum(known_totals) if totals and len(known_totals) == len(totals) else None,
        devices=tuple(d.name for d in devices_end),
        num_alloc_retries=sum(d.num_alloc_retries or 0 for d in devices_end) - retries_start if devices_end else None,
        per_device=tuple(devices_end),
    )


def vram_headroom_bytes(vram: VramSummary) -> int | None:
    """What CUDA can still hand out: the driver's free memory plus what the cache holds unused."""
    free = [d.free_bytes for d in vram.per_device]
    if free and all(f is not None for f in free):
        return vram.reserved_end_bytes + sum(f for f in free if f is not None)
    return vram.limit_bytes


def _ram(evidence: RunEvidence, row: Resource) -> RamSummary:
    return RamSummary(**_span(evidence.timeline, row.column), per_step_bytes=None,
                      limit_bytes=evidence.ram_limit_bytes, limit_source=evidence.ram_limit_source)


def _heap(evidence: RunEvidence, row: Resource) -> HeapSummary | None:
    if not evidence.heap_available:
        return None
    return HeapSummary(**_span(evidence.timeline, row.column), per_step_bytes=None)


def _vram(evidence: RunEvidence, row: Resource) -> VramSummary | None:
    return vram_summary(evidence.timeline, evidence.devices_start, evidence.devices_end)


def _shm(evidence: RunEvidence, row: Resource) -> ShmSummary | None:
    shm = evidence.shm
    if shm is None:
        return None
    return ShmSummary(**_span(evidence.timeline, row.column), limit_bytes=shm.total_bytes, strategy=shm.strategy,
                      per_step_bytes=None, path=shm.path, torch_segments=shm.torch_segments)


def _workers(evidence: RunEvidence, row: Resource) -> WorkerSummary | None:
    workers = evidence.workers
    if workers is None:
        return None
    return WorkerSummary(
        max_count=workers.max_count,
        peak_bytes=_int_or(evidence.timeline.by_time.max(WORKERS.column)),
        pids_seen=workers.pids_seen,
        per_worker=tuple({"pid": pid, "pss_peak": pss, "uss_peak": uss} for pid, pss, uss in workers.peaks),
    )


def _any_resource(evidence: RunEvidence, row: Resource) -> ResourceSummary | None:
    """The summary every resource has; None where it was never read."""
    if math.isnan(_peak(evidence.timeline, row.column)):
        return None
    return ResourceSummary(**_span(evidence.timeline, row.column), per_step_bytes=None, name=row.summary or row.key)


Summariser = Callable[[RunEvidence, Resource], Any]
#: the summaries that say more than every resource's, by the table's `summary` key
SUMMARISERS: dict[str, Summariser] = {"ram": _ram, "heap": _heap, "vram": _vram, "shm": _shm, "workers": _workers}


def summaries(evidence: RunEvidence) -> dict[str, Any]:
    """Each summary the table names, by its key (None: not measured in this run), rates left out."""
    out: dict[str, Any] = {}
    for row in resources.RESOURCES:
        if row.summary is not None and row.summary not in out:
            out[row.summary] = SUMMARISERS.get(row.summary, _any_resource)(evidence, row)
    return out
