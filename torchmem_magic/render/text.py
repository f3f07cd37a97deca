"""Text and HTML forms of a Report and of the live status line (stdlib only)."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..model import Report
    from ..session import LiveStatus

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(value: float | None, signed: bool = False) -> str:
    """1536 -> '1.5 KiB'; None/NaN -> '—'. `signed` adds '+' to growth figures."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    sign = "-" if value < 0 else ("+" if signed else "")
    size = abs(float(value))
    for unit in _UNITS:
        if size < 1024 or unit == _UNITS[-1]:
            return f"{sign}{size:.0f} {unit}" if unit == "B" else f"{sign}{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_per_step(value: float | None) -> str:
    return "—" if value is None else f"{format_bytes(value, signed=True)}/step"


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


Row = tuple[str, str, str, str, str, str]


def _row(label: str, start: float, end: float, peak: float, per_step: float | None, note: str) -> Row:
    return (label, format_bytes(start), format_bytes(end), format_bytes(peak), format_per_step(per_step), note)


def _rows(report: Report) -> list[Row]:
    """(resource, start, end, peak, growth, note) for each resource that was measured."""
    ram, heap, vram, shm, workers = report.ram, report.heap, report.vram, report.shm, report.workers
    rows = [
        _row("RAM (process tree)", ram.start_bytes, ram.end_bytes, ram.peak_bytes, ram.per_step_bytes,
             f"limit {format_bytes(ram.limit_bytes)} ({ram.limit_source})")
    ]
    if heap is not None:
        rows.append(_row("heap in use", heap.start_bytes, heap.end_bytes, heap.peak_bytes, heap.per_step_bytes,
                         "what the kernel really retains"))
    if vram is not None:
        note = f"reserved {format_bytes(vram.reserved_end_bytes)}"
        note += f" of {format_bytes(vram.limit_bytes)}" if vram.limit_bytes else ""
        note += f" on {', '.join(vram.devices)}" if vram.devices else ""
        rows.append(_row("VRAM allocated", vram.allocated_start_bytes, vram.allocated_end_bytes,
                         vram.allocated_peak_bytes, vram.per_step_bytes, note))
    if shm is not None:
        rows.append(_row(f"shm ({shm.path})", shm.start_bytes, shm.end_bytes, shm.peak_bytes, shm.per_step_bytes,
                         f"of {format_bytes(shm.limit_bytes)}, strategy {shm.strategy or '—'}"))
    if workers is not None:
        rows.append(("DataLoader workers", "", "", format_bytes(workers.peak_bytes), "",
                     f"{workers.max_count} at once, PSS"))
    return rows


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _headline(report: Report) -> str:
    status = {"ok": "ok", "error": "failed", "interrupted": "interrupted"}[report.status]
    parts = [
        f"memwatch: {status}",
        _count(report.steps, "step"),
        _count(report.epochs, "epoch"),
        format_duration(report.wall_s),
        f"{report.samples:,} samples every {report.interval_s * 1000:g} ms",
    ]
    return " · ".join(parts)


def report_text(report: Report) -> str:
    """A concise multi-line summary for terminals and `print()`."""
    lines = [_headline(report)]
    if report.error and report.status != "ok":
        lines.append(f"  stopped by {report.error}")
    rows = _rows(report)
    header = ("", "start", "end", "peak", "growth", "")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    lines.append("  " + "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths))).rstrip())
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:5], widths[1:])]
        lines.append(("  " + "  ".join(cells) + "  " + row[5]).rstrip())
    if report.steps < 3:
        lines.append("  growth per step needs at least 3 optimizer steps")
    for advice in report.advice:
        lines.append(f"  → {advice}")
    return "\n".join(lines)


def report_html(report: Report) -> str:
    """The same summary as a small self-contained HTML table (no scripts, no CDN)."""
    esc = html.escape
    head = "".join(f"<th style='text-align:right;padding:0 .6em'>{h}</th>" for h in ("start", "end", "peak", "growth"))
    body = "".join(
        "<tr><td style='text-align:left;padding-right:.6em'>"
        + esc(r[0])
        + "</td>"
        + "".join(f"<td style='text-align:right;padding:0 .6em'>{esc(c)}</td>" for c in r[1:5])
        + f"<td style='text-align:left;color:#666'>{esc(r[5])}</td></tr>"
        for r in _rows(report)
    )
    error = (
        f"<div style='color:#b00'>stopped by {esc(report.error)}</div>" if report.error and report.status != "ok" else ""
    )
    advice = "".join(f"<li>{esc(a)}</li>" for a in report.advice)
    return (
        "<div class='torchmem-report'>"
        f"<b>{esc(_headline(report))}</b>{error}"
        f"<table><thead><tr><th></th>{head}<th></th></tr></thead><tbody>{body}</tbody></table>"
        + (f"<ul>{advice}</ul>" if advice else "")
        + "</div>"
    )


def status_line(status: LiveStatus) -> str:
    """The one-line live status under the figure."""
    parts = [
        f"step {status.steps:,}",
        f"{status.steps_per_s:.1f} steps/s",
        f"epoch {status.epochs}",
        f"RAM {format_bytes(status.ram_bytes)} ({format_per_step(status.ram_per_step)})",
    ]
    if not math.isnan(status.heap_bytes):
        parts.append(f"heap {format_bytes(status.heap_bytes)} ({format_per_step(status.heap_per_step)})")
    if not math.isnan(status.vram_allocated_bytes):
        parts.append(
            f"VRAM {format_bytes(status.vram_allocated_bytes)} / {format_bytes(status.vram_reserved_bytes)} reserved"
            f" ({format_per_step(status.vram_per_step)})"
        )
    if not math.isnan(status.shm_used_bytes):
        parts.append(f"shm {format_bytes(status.shm_used_bytes)}")
    if status.workers:
        parts.append(f"{status.workers} workers")
    return " · ".join(parts)
