"""The report's table: a row per resource the resources table gives a row, in its order (stdlib only).

Each row is (label, start, end, peak, growth, note). The resources whose summaries say more than
every resource's have their note worded here; any other resource's row is drawn from the summary
every resource has, so a resource added to the table gets its row with nothing written here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.model import ReportData, resource_summary
from ..core.resources import SHM, Resource, report_rows
from ..core.units import format_bytes, rate_unit

Row = tuple[str, str, str, str, str, str]


def format_per_step(value: float | None, clock: str = "optimizer") -> str:
    """'+1.0 MiB/step', '+1.0 MiB/batch', '+1.0 MiB/s': growth per step of the report's clock."""
    return "—" if value is None else f"{format_bytes(value, signed=True)}/{rate_unit(clock)}"


def _row(label: str, start: float, end: float, peak: float, per_step: float | None, note: str, clock: str) -> Row:
    return (label, format_bytes(start), format_bytes(end), format_bytes(peak), format_per_step(per_step, clock), note)


def _ram(row: Resource, ram: Any, clock: str) -> Row:
    note = f"limit {format_bytes(ram.limit_bytes)} ({ram.limit_source})"
    return _row(row.label, ram.start_bytes, ram.end_bytes, ram.peak_bytes, ram.per_step_bytes, note, clock)


def _heap(row: Resource, heap: Any, clock: str) -> Row:
    note = "what the kernel really retains"
    return _row(row.label, heap.start_bytes, heap.end_bytes, heap.peak_bytes, heap.per_step_bytes, note, clock)


def _vram(row: Resource, vram: Any, clock: str) -> Row:
    note = f"reserved {format_bytes(vram.reserved_end_bytes)}"
    note += f" of {format_bytes(vram.limit_bytes)}" if vram.limit_bytes else ""
    note += f" on {', '.join(vram.devices)}" if vram.devices else ""
    return _row(row.label, vram.allocated_start_bytes, vram.allocated_end_bytes, vram.allocated_peak_bytes,
                vram.per_step_bytes, note, clock)


def _shm(row: Resource, shm: Any, clock: str) -> Row:
    note = f"of {format_bytes(shm.limit_bytes)}, strategy {shm.strategy or '—'}"
    return _row(f"{SHM.short} ({shm.path})", shm.start_bytes, shm.end_bytes, shm.peak_bytes, shm.per_step_bytes,
                note, clock)


def _workers(row: Resource, workers: Any, clock: str) -> Row:
    return (row.label, "", "", format_bytes(workers.peak_bytes), "", f"{workers.max_count} at once, PSS")


def _any_resource(row: Resource, summary: Any, clock: str) -> Row:
    note = f"of {format_bytes(summary.limit_bytes)}" if summary.limit_bytes else ""
    return _row(row.label, summary.start_bytes, summary.end_bytes, summary.peak_bytes, summary.per_step_bytes,
                note, clock)


#: the rows worded for what their summaries say beyond every resource's, by the table's `summary` key
ROW_FORMATS: dict[str, Callable[[Resource, Any, str], Row]] = {
    "ram": _ram, "heap": _heap, "vram": _vram, "shm": _shm, "workers": _workers,
}


def report_table_rows(report: ReportData) -> list[Row]:
    """(resource, start, end, peak, growth, note) for each resource that was measured."""
    rows = []
    for row in report_rows():
        summary = resource_summary(report, row.summary)
        if summary is not None:
            rows.append(ROW_FORMATS.get(row.summary or "", _any_resource)(row, summary, report.clock))
    return rows
