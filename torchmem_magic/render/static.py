"""The static figure: the run's curves as a small inline SVG, written by hand (stdlib only).

The live figure is a widget, and a saved notebook keeps no widget state: this picture is what
survives saving, nbconvert and `Report.save(".html")`. Every curve is cut to `MAX_POINTS`
buckets (each keeps its bucket's maximum, as the timeline does, so peaks survive), which keeps the
SVG a few kilobytes however long the run. Plain strings in, plain strings out: no numpy, no
widgets, so it is unit-tested on synthetic timelines.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..core import resources
from ..analysis.holder_trends import top_holder
from ..core.model import Clock, RankSummary, ReportData
from ..core.resources import HEAP, RAM
from ..core.timeline import Timeline
from ..core.units import format_bytes
from .axis_range import MIN_SPAN_BYTES, fitted_range
from .text import report_html, sparkline, verdict_rate

MAX_POINTS = 240  # per curve: about one point per 2 px of plot width
MAX_RANK_LINES = 8
WIDTH_PX = 640
STRIP_HEIGHT_PX = 72  # one strip per curve of the process tree
RANK_PANEL_HEIGHT_PX = 130
LEFT_PX, RIGHT_PX = 52, 12
LEGEND_ROW_PX, X_AXIS_PX = 18, 30
MIB, GIB = float(1 << 20), float(1 << 30)
STEP_AXIS_LABELS = {"optimizer": "optimizer step", "backward": "backward pass", "batch": "batch", "forward": "forward call"}
VERDICT_COLOURS = {"leak": "#b00", "suspect": "#b60", "clean": "#070"}
RANK_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")

#: (column, legend label, colour) of the curves the figure shows, the live figure's colours
CURVES: tuple[tuple[str, str, str], ...] = tuple(
    (r.column, r.label, r.colour) for r in resources.RESOURCES if r.colour is not None and r.saved_curve
)


@dataclass(frozen=True)
class Curve:
    label: str
    colour: str
    x: tuple[float, ...]
    y_bytes: tuple[float, ...]


@dataclass(frozen=True)
class Panel:
    title: str
    x_label: str
    curves: tuple[Curve, ...]
    epochs_x: tuple[float, ...] = ()


def bucket_max(x: Sequence[float], y: Sequence[float], max_points: int = MAX_POINTS) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """At most `max_points` (x, y) pairs of the finite readings: each bucket's first x and largest y."""
    pairs = [(a, b) for a, b in zip(x, y) if math.isfinite(a) and math.isfinite(b)]
    if len(pairs) <= max_points:
        return tuple(a for a, _ in pairs), tuple(b for _, b in pairs)
    size = len(pairs) / max_points
    xs, ys = [], []
    for i in range(max_points):
        bucket = pairs[int(i * size) : int((i + 1) * size)]
        xs.append(bucket[0][0])
        ys.append(max(b for _, b in bucket))
    return tuple(xs), tuple(ys)


def evenly_bucketed(x: Sequence[float], y: Sequence[float], buckets: int) -> tuple[float, ...]:
    """The largest y in each of `buckets` equal spans of x (a bucket without a reading repeats the last
    one): a sparkline's characters stand for equal stretches of the run, though the samples do not
    (the first steps are sampled densely)."""
    pairs = [(a, b) for a, b in zip(x, y) if math.isfinite(a) and math.isfinite(b)]
    if len(pairs) <= 1:
        return tuple(b for _, b in pairs)
    low, span = pairs[0][0], (pairs[-1][0] - pairs[0][0]) or 1.0
    peaks: list[float | None] = [None] * buckets
    for a, b in pairs:
        i = min(buckets - 1, int((a - low) / span * buckets))
        peak = peaks[i]
        peaks[i] = b if peak is None else max(peak, b)
    out, last = [], pairs[0][1]
    for peak in peaks:
        last = last if peak is None else peak
        out.append(last)
    return tuple(out)


def _has_data(values: Sequence[float]) -> bool:
    return any(math.isfinite(v) and v > 0 for v in values)


def _training_loader(timeline: Timeline, epochs: int) -> int | None:
    """The loader whose passes are the report's epochs (a validation loader's are not)."""
    matching = [loader for loader, n in timeline.passes.items() if n == epochs]
    return matching[0] if len(matching) == 1 else None


def _by_steps(timeline: Timeline, clock: Clock) -> bool:
    return clock != "time" and len(timeline.by_step) >= 2


def _epochs_x(timeline: Timeline, clock: Clock, epochs: int, by_steps: bool) -> tuple[float, ...]:
    markers = timeline.epochs_of(_training_loader(timeline, epochs))
    return tuple(float(m.step_of(clock)) if by_steps else m.t_s for m in markers)


def main_panel(report: ReportData) -> Panel | None:
    """The process tree's curves (None without a timeline or a reading)."""
    timeline = report.timeline
    if not isinstance(timeline, Timeline):
        return None
    by_steps = _by_steps(timeline, report.clock)
    series = timeline.by_step if by_steps else timeline.by_time
    x_name = "step" if by_steps else "t_s"
    data = series.columns(x_name, *(c for c, _, _ in CURVES))
    curves = []
    for column, label, colour in CURVES:
        if _has_data(data[column]):
            xs, ys = bucket_max(data[x_name], data[column])
            if len(xs) >= 1:
                curves.append(Curve(label, colour, xs, ys))
    if not curves:
        return None
    x_label = STEP_AXIS_LABELS.get(report.clock, "step") if by_steps else "time (s)"
    return Panel("", x_label, tuple(curves), _epochs_x(timeline, report.clock, report.epochs, by_steps))


def _rank_order(ranks: Sequence[RankSummary], worst: int | None) -> list[RankSummary]:
    """The worst rank first, then by number, at most MAX_RANK_LINES."""
    ordered = sorted(ranks, key=lambda r: (r.rank != worst, r.rank))
    return ordered[:MAX_RANK_LINES]


def ranks_panel(report: ReportData) -> Panel | None:
    """Each rank's heap in use (its RAM where a rank has no heap), over its own steps."""
    ranks = [r for r in report.ranks or () if isinstance(r.timeline, Timeline) and len(r.timeline.by_time) >= 1]
    if not ranks:
        return None
    by_steps = all(_by_steps(r.timeline, r.clock) for r in ranks)
    heap = all(r.heap is not None for r in ranks)
    column, quantity = (HEAP.column, HEAP.label) if heap else (RAM.column, RAM.short)
    curves = []
    for i, rank in enumerate(_rank_order(ranks, report.worst_rank)):
        series = rank.timeline.by_step if by_steps else rank.timeline.by_time
        x_name = "step" if by_steps else "t_s"
        data = series.columns(x_name, column)
        xs, ys = bucket_max(data[x_name], data[column])
        worst = " (worst)" if rank.rank == report.worst_rank and report.verdict != "clean" else ""
        if xs:
            curves.append(Curve(f"rank {rank.rank}{worst}", RANK_PALETTE[i % len(RANK_PALETTE)], xs, ys))
    if not curves:
        return None
    more = len(ranks) - len(curves)
    title = f"ranks: {quantity}" + (f" ({len(curves)} of {len(ranks)} drawn)" if more > 0 else "")
    clock = ranks[0].clock
    x_label = (STEP_AXIS_LABELS.get(clock, "step") + " (each rank's)") if by_steps else "time (s, each rank's)"
    return Panel(title, x_label, tuple(curves))


def verdict_line(report: ReportData) -> str:
    """'verdict: leak · heap +1.0 MiB/step · held by history': what the picture is about."""
    parts = [f"verdict: {report.verdict}" + (f" ({report.leak_kind})" if report.leak_kind else "")]
    rate = verdict_rate(report)
    if rate is not None and report.verdict in ("leak", "suspect"):
        parts.append(rate)
    if report.worst_rank is not None and report.verdict != "clean":
        parts.append(f"worst rank {report.worst_rank}")
    holder = top_holder(report.suspects, or_largest=True)
    if report.verdict in ("leak", "suspect") and holder is not None:
        parts.append(f"held by {holder.name}")
    return " · ".join(parts)


# ----------------------------------------------------------------------------- drawing


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 × 10^k apart) covering [low, high]."""
    if not high > low:
        return [low]
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _tick_text(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:.3g}"


def y_range(curves: Sequence[Curve]) -> tuple[float, float]:
    """(low, high) bytes of a panel: the readings' own span, not from zero, so that a leak of a few
    MiB on a heap of a hundred shows as a slope; a flat curve stays flat (its noise is not blown up).
    The live figure's strips fit theirs by the same rule."""
    values = [y for c in curves for y in c.y_bytes]
    fitted = fitted_range(min(values), max(values))
    return fitted.low_bytes, fitted.high_bytes


def _unit(peak_bytes: float) -> tuple[float, str]:
    return (GIB, "GiB") if peak_bytes >= 10 * GIB else (MIB, "MiB")


def _panel_svg(panel: Panel, x_range: tuple[float, float], top_px: float, height_px: float, x_axis: bool) -> list[str]:
    """One panel's axes, epoch lines, curves and legend row (above `top_px`), as SVG elements."""
    esc = html.escape
    left, right = LEFT_PX, WIDTH_PX - RIGHT_PX
    bottom = top_px + height_px
    x_low, x_high = x_range
    y_low_bytes, y_high_bytes = y_range(panel.curves)
    unit, unit_name = _unit(y_high_bytes)
    y_low, y_high = y_low_bytes / unit, y_high_bytes / unit

    def px(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * (right - left)

    def py(y_bytes: float) -> float:
        return bottom - (y_bytes / unit - y_low) / (y_high - y_low) * height_px

    out = [f"<rect x='{left}' y='{top_px:.0f}' width='{right - left}' height='{height_px:.0f}' fill='#fff' stroke='#bbb'/>"]
    for tick in nice_ticks(y_low, y_high, 4 if height_px < 120 else 5):
        y = bottom - (tick - y_low) / (y_high - y_low) * height_px
        out.append(f"<line x1='{left}' x2='{right}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eee'/>")
        out.append(f"<text x='{left - 4}' y='{y + 3:.1f}' text-anchor='end'>{_tick_text(tick)}</text>")
    out.append(f"<text x='10' y='{top_px + height_px / 2:.0f}' text-anchor='middle' fill='#555' "
               f"transform='rotate(-90 10 {top_px + height_px / 2:.0f})'>{unit_name}</text>")
    if x_axis:
        for tick in nice_ticks(x_low, x_high):
            out.append(f"<text x='{px(tick):.1f}' y='{bottom + 13:.1f}' text-anchor='middle'>{_tick_text(tick)}</text>")
        out.append(f"<text x='{(left + right) / 2:.0f}' y='{bottom + 26:.1f}' text-anchor='middle' fill='#555'>"
                   f"{esc(panel.x_label)}</text>")
    for x in panel.epochs_x:
        out.append(f"<line class='epoch' x1='{px(x):.1f}' x2='{px(x):.1f}' y1='{top_px:.0f}' y2='{bottom:.0f}' "
                   "stroke='#999' stroke-dasharray='4 3'/>")
    for curve in panel.curves:
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(curve.x, curve.y_bytes))
        if len(curve.x) == 1:
            points += f" {px(curve.x[0]) + 1:.1f},{py(curve.y_bytes[0]):.1f}"
        out.append(f"<polyline fill='none' stroke='{curve.colour}' stroke-width='1.5' points='{points}'>"
                   f"<title>{esc(curve.label)}</title></polyline>")
    x = left + 2.0
    if panel.title:
        out.append(f"<text x='{x:.0f}' y='{top_px - 5:.0f}' font-weight='bold'>{esc(panel.title)}</text>")
        x += 6.5 * len(panel.title) + 12
    for curve in panel.curves:
        out.append(f"<rect x='{x:.0f}' y='{top_px - 13:.0f}' width='9' height='9' fill='{curve.colour}'/>")
        label = curve.label
        if len(panel.curves) == 1:  # a strip of its own: say where it went
            label += f": {format_bytes(curve.y_bytes[0])} → {format_bytes(curve.y_bytes[-1])}"
        out.append(f"<text x='{x + 13:.0f}' y='{top_px - 5:.0f}'>{esc(label)}</text>")
        x += 13 + 6.0 * len(label) + 12
    return out


def _x_range(panel: Panel) -> tuple[float, float]:
    xs = [x for c in panel.curves for x in c.x] + list(panel.epochs_x)
    low, high = min(xs), max(xs)
    return (low, high) if high > low else (low, low + 1.0)


def strips(panel: Panel) -> list[Panel]:
    """The main panel as one strip per curve, each on its own scale (RAM in hundreds of MiB would
    flatten a heap leak of a few MiB drawn on the same axis)."""
    return [Panel("", panel.x_label, (curve,), panel.epochs_x) for curve in panel.curves]


def figure_svg(report: ReportData) -> str:
    """The static figure as an `<svg>` element ('' when there is nothing to draw)."""
    main, ranks = main_panel(report), ranks_panel(report)
    layout: list[tuple[Panel, tuple[float, float], float, bool]] = []
    if main is not None:
        parts = strips(main)
        layout += [(p, _x_range(main), STRIP_HEIGHT_PX, i == len(parts) - 1) for i, p in enumerate(parts)]
    if ranks is not None:
        layout.append((ranks, _x_range(ranks), RANK_PANEL_HEIGHT_PX, True))
    if not layout:
        return ""
    colour = VERDICT_COLOURS.get(report.verdict, "#666")
    body = [f"<text class='verdict' x='{LEFT_PX}' y='14' font-weight='bold' fill='{colour}'>{html.escape(verdict_line(report))}</text>"]
    top = 20.0
    for panel, x_range, height, x_axis in layout:
        top += LEGEND_ROW_PX
        body += _panel_svg(panel, x_range, top, height, x_axis)
        top += height + (X_AXIS_PX if x_axis else 0)
    return (
        f"<svg class='torchmem-figure' xmlns='http://www.w3.org/2000/svg' width='{WIDTH_PX}' height='{top:.0f}' "
        f"viewBox='0 0 {WIDTH_PX} {top:.0f}' font-family='sans-serif' font-size='10' role='img'>"
        f"<title>{html.escape(verdict_line(report))}</title>" + "".join(body) + "</svg>"
    )


# ----------------------------------------------------------------------------- text


def sparkline_lines(report: ReportData, width: int = 32) -> list[str]:
    """'heap ▁▂▃▅▆▇█ 88.0 → 120.0 MiB' for each main curve: the figure for a terminal."""
    panel = main_panel(report)
    if panel is None:
        return []
    names = {"RAM (process tree)": "RAM", "heap in use": "heap", "VRAM allocated": "VRAM"}
    lines = []
    for curve in panel.curves:
        if curve.label in names:
            ys = evenly_bucketed(curve.x, curve.y_bytes, width)
            first, last = curve.y_bytes[0], curve.y_bytes[-1]
            lines.append(f"{names[curve.label]:<5} {sparkline(ys, MIN_SPAN_BYTES)}  {format_bytes(first)} → {format_bytes(last)}"
                         f" (peak {format_bytes(max(ys))})")
    return lines


# ----------------------------------------------------------------------------- HTML


def figure_img_html(report: ReportData) -> str:
    """The static figure as an `<img>` of the SVG ('' when there is nothing to draw).

    An image, not inline `<svg>`: a notebook opened from disk is untrusted, and JupyterLab's
    sanitizer then strips inline SVG down to its text (a jumble of labels) and refuses an
    `image/svg+xml` output, while it shows an `<img>` with a data URL; an SVG loaded as an image runs
    nothing, which is why it is allowed."""
    svg = figure_svg(report)
    if not svg:
        return ""
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return (f"<img class='torchmem-figure' alt='{html.escape(verdict_line(report), quote=True)}' "
            f"src='data:image/svg+xml;base64,{data}'>")


_IMAGE_TAG = re.compile(r"<img\b[^>]*>")
_SVG_DATA = re.compile(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)")


def embedded_figure(page: str) -> str:
    """The SVG of the figure an HTML report embeds ('' when it has none): read back from a saved page
    or notebook output (converters may reorder the tag's attributes)."""
    for tag in _IMAGE_TAG.findall(page):
        data = _SVG_DATA.search(tag)
        if "torchmem-figure" in tag and data:
            return base64.b64decode(data.group(1)).decode("utf-8")
    return ""


def report_figure_html(report: ReportData) -> str:
    """The HTML report under its static figure: what a saved notebook and a saved page show."""
    figure = figure_img_html(report)
    table = report_html(report)
    return f"<div class='torchmem-static'>{figure}{table}</div>" if figure else table


def report_document(report: ReportData, title: str = "torchmem_magic report") -> str:
    """A whole HTML page around the figure and the report: opens offline (no scripts, no CDN)."""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
        "table{border-collapse:collapse}td,th{padding:.1em .4em}</style>"
        f"</head><body>\n{report_figure_html(report)}\n</body></html>\n"
    )
