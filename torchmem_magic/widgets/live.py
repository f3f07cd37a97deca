"""The live figure: one strip per resource under the cell, mutated in place while the cell runs.

It draws a `LiveSnapshot` it is given (the status line's verdict, the worst rank and the guard's
thresholds judged already, by the session's view) and decides nothing itself.

Each strip (`curve_strip.CurveStrip`) has a y axis fitted to its own curves, all on one x scale:
RAM in hundreds of MiB would flatten a heap leak of a few MiB drawn on the same axis (the static
figure's strips avoid it the same way). Created and displayed once on the main thread; afterwards
one thread at a time writes to it (the sampler thread, or the training thread at a step boundary where
that is the thread whose messages reach the page: `update_route`), throttled to `tick_period_s`, each
update batched with `hold_sync()` into one message per widget. After the session stopped, the main thread draws the final state. Every series
is at most the timeline's capacity (2,000 points), so an update's payload stays bounded.
"""

from __future__ import annotations

import html
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import bqplot
import ipywidgets
import numpy as np

from ..core import resources
from ..ranks.feed import rank_numbers
from ..render.text import status_line
from ..render.axis_range import AxisRange, steady_range, with_headroom
from ..core.resources import RAM, RSS, VRAM, VRAM_RESERVED
from ..core.timeline import DecimatingSeries
from .controls import Controls
from .curve_strip import CurveStrip, StripCurve, Threshold, epoch_marks, show_epochs, unit_of
from .rank_curves import Curve, RankCurves, padded, rank_curves, steps_of_time
from .shared import layout, shared

if TYPE_CHECKING:
    from ..render.results import Report
    from ..session.live_view import LiveSnapshot, LiveView
    from ..core.step_requests import StepRequests

STEP_AXIS_LABELS = {"optimizer": "optimizer step", "backward": "backward pass", "batch": "batch", "forward": "forward call"}
MAX_POINTS = 2000
REMOTE_OPACITY = 0.5  # another node's rank's line: lighter than this node's
RANK_LEGEND_ROW_SHARE = 0.12  # headroom per legend entry, of the ranks' span, so the legend does not hide them
#: curves drawn on another one's strip, to be read against it: the kernel's RSS within the tree's RAM,
#: what the caching allocators reserve around what the tensors use
STRIP_OF = {RSS.column: RAM.column, VRAM_RESERVED.column: VRAM.column}
#: each strip's height by the number of strips (more than the table lists: the last)
STRIP_HEIGHTS_PX = (320, 190, 165, 145)

#: (column, legend label, colour) of every curve the figure can show; absent sources are left out.
CURVES: tuple[tuple[str, str, str], ...] = tuple(
    (r.column, r.label, r.colour) for r in resources.RESOURCES if r.colour is not None
)


def _decimate(values: np.ndarray) -> np.ndarray:
    if len(values) <= MAX_POINTS:
        return values
    return values[:: math.ceil(len(values) / MAX_POINTS)]


def _has_data(column: np.ndarray) -> bool:
    return bool(column.size) and bool(np.isfinite(column).any()) and bool(np.nanmax(column) > 0)


#: the launching process's own curves, left out while ranks train in its children: it idles, so they
#: are flat lines that only crowd the legend (the tree's RAM stays: it sums the ranks, as the OOM killer does)
LAUNCHER_ONLY = frozenset(r.column for r in resources.RESOURCES if not r.launcher_curve)


def _visible_curves(data: dict[str, np.ndarray], launcher: bool = False) -> list[tuple[str, str, str]]:
    """Curves with data; the kernel's own RSS only when children make it differ from the tree's RAM."""
    curves = [c for c in CURVES if _has_data(data[c[0]])]
    if np.array_equal(data[RSS.column], data[RAM.column]):
        curves = [c for c in curves if c[0] != RSS.column]
    if launcher:
        curves = [c for c in curves if c[0] not in LAUNCHER_ONLY]
    return curves


def _curve_columns(series: DecimatingSeries, x_name: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The x values and every curve's column of `series`, as arrays."""
    data = series.columns(x_name, *(c for c, _, _ in CURVES))
    return np.frombuffer(data[x_name], dtype=np.float64), {
        c: np.frombuffer(data[c], dtype=np.float64) for c, _, _ in CURVES
    }


def _x_label(clock: str, by_steps: bool, worst_feed: Any) -> str:
    if not by_steps:
        return "time (s)"
    if worst_feed is not None:
        return f"{STEP_AXIS_LABELS.get(worst_feed.clock, 'step')} (worst rank)"
    return STEP_AXIS_LABELS.get(clock, "step")


def _strip_height_px(strips: int) -> int:
    """Each strip's height when `strips` are shown."""
    return STRIP_HEIGHTS_PX[min(strips, len(STRIP_HEIGHTS_PX)) - 1]


def _in_curve_order(columns: list[str]) -> list[str]:
    """Strips' columns top to bottom: in the order of their curves."""
    order = [c for c, _, _ in CURVES]
    return sorted(columns, key=order.index)


def _strip_thresholds(
    thresholds: Sequence[tuple[str, float, str]], visible: Sequence[tuple[str, str, str]]
) -> dict[str, list[Threshold]]:
    """Each strip's guard thresholds (drawn or only labelled: the strip decides), by its strip's column."""
    colours = {column: colour for column, _, colour in visible}
    out: dict[str, list[Threshold]] = {}
    for column, threshold_bytes, label in thresholds:
        if column in colours and threshold_bytes > 0:
            out.setdefault(STRIP_OF.get(column, column), []).append(Threshold(threshold_bytes, label, colours[column]))
    return out


def _opacities(curves: Sequence[Curve]) -> list[float]:
    """Each line's opacity: another node's rank lighter (its points are a second apart); none given
    (the mark's default, every line opaque) where every rank is this node's."""
    if not any(c.remote for c in curves):
        return []
    return [REMOTE_OPACITY if c.remote else 1.0 for c in curves]


def _ranks_title(ranks: RankCurves) -> str:
    """'ranks: heap in use, VRAM allocated (dashed) · other nodes' lighter · imbalance: ...'."""
    parts = [f"ranks: {ranks.quantity}" + (", VRAM allocated (dashed)" if ranks.vram else "")]
    if any(c.remote for c in (*ranks.memory, *ranks.vram)):
        parts.append("other nodes' lighter")
    if ranks.imbalance:
        parts.append(ranks.imbalance)
    return " · ".join(parts)


def _strip_groups(visible: Sequence[tuple[str, str, str]]) -> dict[str, list[tuple[str, str, str]]]:
    """The visible curves by strip (the strip's own column first), in the curves' order."""
    groups: dict[str, list[tuple[str, str, str]]] = {}
    for curve in visible:
        groups.setdefault(STRIP_OF.get(curve[0], curve[0]), []).append(curve)
    return {column: sorted(curves, key=lambda c: c[0] != column) for column, curves in groups.items()}


def _models_under(root: ipywidgets.Widget) -> list[ipywidgets.Widget]:
    """`root` and every model its synced traits reach (children, marks, axes, scales, layouts, styles),
    each once."""
    found: dict[int, ipywidgets.Widget] = {}
    pending = [root]
    while pending:
        model = pending.pop()
        if id(model) in found:
            continue
        found[id(model)] = model
        for key in model.keys:
            value = getattr(model, key, None)
            items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
            pending.extend(item for item in items if isinstance(item, ipywidgets.Widget))
    return list(found.values())


class LiveFigure:
    """Status line + figure + x-axis toggle (time or steps). Implements the session's Listener.

    What a cell pays for it is mostly its widget models (a comm each) and their messages, so it makes
    what the first frame shows, each model in its final state where that is known: the RAM strip, the
    status line, the toggle and the buttons; another resource's strip, a strip's epoch lines and guard
    line, and the ranks' panel come when there is something to draw in them. The layouts, the styles
    and the epoch lines' scale are the kernel's shared ones (`shared`).
    """

    tick_period_s = 0.25  # at most 4 updates a second ...
    tick_cpu_share: float | None = 0.004  # ... and fewer when a redraw costs more than 0.4% of the time between two
    tick_max_period_s = 2.0  # ... but at least one every 2 s: a figure that stops moving looks like a hung cell

    def __init__(self, requests: StepRequests | None = None) -> None:
        """`requests`: where the buttons' clicks go during the run (as `attach`, from the start)."""
        self._snapshot: LiveSnapshot | None = None  # the last drawn (the x-axis toggle redraws a finished run)
        self._lock = threading.Lock()  # the final draw and a late tick never interleave
        self.updates = 0
        self.x_scale = bqplot.LinearScale()
        self.marker_scale = shared(bqplot.LinearScale, min=0.0, max=1.0)  # the epoch lines' [0, 1]: each panel's height
        self.x_label = "time (s)"
        #: the strips' figures' one layout: they are all of a height
        self.strip_layout = ipywidgets.Layout(width="100%", height=f"{_strip_height_px(1)}px")
        #: one strip per resource with readings, by its column; the tree's RAM is there from the start
        self.strips: dict[str, CurveStrip] = {RAM.column: self._new_strip(RAM.column, [RAM.column])}
        self.strip_box = ipywidgets.VBox([self.strips[RAM.column].figure], layout=layout(width="100%"))
        self.rank_figure: Any = None  # built when the first rank streams: most runs have none
        self.rank_range: AxisRange | None = None  # the ranks' range drawn last
        # layouts given at construction: a widget made without one opens a default one first
        self.status = ipywidgets.HTML(
            value="<code>starting…</code>", layout=layout(flex="1 1 auto", margin="0 0 0 1em"),
            style=shared(ipywidgets.widgets.widget_string.HTMLStyle),
        )
        self.x_toggle = ipywidgets.ToggleButtons(
            options=[("time", "time"), ("steps", "steps")], value="time",
            tooltips=["x axis: seconds since the cell started", "x axis: steps (optimizer steps, else backward passes, batches or forward calls)"],
            style=shared(ipywidgets.ToggleButtonsStyle, button_width="60px"), layout=layout(flex="0 0 auto"),
        )
        self.x_toggle.observe(self._on_toggle, names="value")
        self.controls = Controls(requests)
        self.widget = ipywidgets.VBox(
            [
                ipywidgets.HBox([self.x_toggle, self.status], layout=layout(align_items="center")),
                self.strip_box,
                self.controls.widget,
            ],
            layout=layout(width="100%"),
        )

    def _new_strip(self, column: str, shown: Sequence[str]) -> CurveStrip:
        """The strip of `column`'s resource, captioned with its curve's label before the first draw and
        placed where it goes among the strips `shown` (top to bottom)."""
        label, colour = next((label, colour) for c, label, colour in CURVES if c == column)
        x_label = self.x_label if column == shown[-1] else None
        return CurveStrip(self.x_scale, self.marker_scale, label, colour, layout=self.strip_layout, x_label=x_label)

    def _strip_widgets(self, columns: Sequence[str]) -> list[Any]:
        """The strips' figures top to bottom, each sized for their number, the last one with the x label."""
        height_px = _strip_height_px(len(columns))
        for i, column in enumerate(columns):
            self.strips[column].place(height_px, self.x_label if i == len(columns) - 1 else None)
        return [self.strips[column].figure for column in columns]

    @property
    def shown(self) -> list[CurveStrip]:
        """The strips on show, top to bottom."""
        by_figure = {id(strip.figure): strip for strip in self.strips.values()}
        return [by_figure[id(figure)] for figure in self.strip_box.children]

    @property
    def labels(self) -> list[str]:
        """The curves on show, top to bottom (what the strips' captions name)."""
        return [label for strip in self.shown for label in strip.labels]

    def _build_ranks_panel(self) -> None:
        """A second panel for the ranks, under the first and on its x scale (so both line up in time
        or steps), shown once a rank streams. Its own y axis: a rank's heap (tens of MiB) would be
        a flat line at the bottom of the process tree's GiB. Legends stay off until a mark has data
        (a hidden mark still takes a legend row)."""
        self.rank_y_scale = bqplot.LinearScale(min=0.0)
        scales = {"x": self.x_scale, "y": self.rank_y_scale}
        self.rank_lines = bqplot.Lines(
            x=np.zeros(0), y=np.zeros(0), scales=scales, display_legend=False, stroke_width=2,
        )
        self.rank_vram_lines = bqplot.Lines(
            x=np.zeros(0), y=np.zeros(0), scales=scales, display_legend=False, stroke_width=2,
            line_style="dashed", visible=False,
        )
        self.rank_band = bqplot.Lines(  # min and max of all ranks, the space between them filled
            x=np.zeros((2, 2)), y=np.zeros((2, 2)), scales=scales, display_legend=False, stroke_width=1,
            fill="between", colors=["#888888", "#888888"], fill_colors=["#bbbbbb"], fill_opacities=[0.35],
            visible=False,
        )
        self.rank_epoch_lines = epoch_marks(self.x_scale, self.marker_scale)
        self.rank_x_axis = bqplot.Axis(scale=self.x_scale, label="time (s)")
        self.rank_y_axis = bqplot.Axis(scale=self.rank_y_scale, side="left", label="MiB", tick_format=",.0f")
        self.rank_figure = bqplot.Figure(
            marks=[self.rank_band, self.rank_lines, self.rank_vram_lines, self.rank_epoch_lines],
            axes=[self.rank_x_axis, self.rank_y_axis], title="ranks",
            animation_duration=0, legend_location="top-left",
            fig_margin={"top": 40, "bottom": 40, "left": 60, "right": 20},
            layout=layout(width="100%", height="300px"),
        )

    def widget_bundle(self) -> dict[str, Any]:
        """The widget's display data, its text form saying what a saved notebook shows instead of the
        live figure (a widget's state is not saved: without a kernel, viewers show the text form)."""
        return {  # what ipywidgets' own bundle holds, without its repr of every widget in the tree
            "application/vnd.jupyter.widget-view+json": {
                "version_major": 2, "version_minor": 0, "model_id": self.widget.model_id,
            },
            "text/plain": "memwatch live figure (shown while a kernel runs it; the static figure below is what stays)",
        }

    def attach(self, requests: StepRequests) -> None:
        """Called on the main thread before the session starts: the buttons' clicks go to `requests`."""
        self.controls.attach(requests)

    # ---------------------------------------------------------------- Listener
    def on_tick(self, view: LiveView) -> None:
        self.draw(view.snapshot())

    def on_finish(self, view: LiveView, report: Report) -> None:
        self.draw(view.snapshot(report))
        self.controls.finish(report)

    def resend(self) -> None:
        """Send every model under the figure in full, as it is now (for a front end that may have
        dropped earlier updates: ipywidgets sends a trait again only when it changes)."""
        with self._lock:
            for model in _models_under(self.widget):
                model.send_state()

    def _on_toggle(self, change: Any) -> None:
        snapshot = self._snapshot
        if snapshot is not None and not snapshot.running:  # while running, the next tick redraws
            self.draw(snapshot)

    # ---------------------------------------------------------------- drawing
    def _rank_curves(self, snapshot: LiveSnapshot, by_steps: bool) -> tuple[RankCurves | None, Any]:
        """The ranks' curves and the worst rank's feed (None, None without ranks)."""
        feeds = list(snapshot.rank_feeds)
        if not feeds:
            return None, None
        worst = snapshot.worst_rank
        worst_pid = worst.pid if worst is not None and worst.via == "stream" else None  # a pid is only a node's
        worst_rank = worst.rank if worst is not None else None
        curves = rank_curves(feeds, rank_numbers(feeds), worst_pid, by_steps, remote=snapshot.remote,
                             worst_rank=worst_rank)
        return curves, next((f for f in feeds if f.pid == worst_pid), feeds[0])

    def draw(self, snapshot: LiveSnapshot) -> None:
        """Draw what `snapshot` holds (against steps or seconds, as the toggle says); it is kept, so the
        toggle can redraw a finished run."""
        self._snapshot = snapshot
        by_steps = self.x_toggle.value == "steps"
        text = status_line(snapshot.status)
        if snapshot.report is not None:
            text = f"{snapshot.report.status} · {text}"
        ranks, worst_feed = self._rank_curves(snapshot, by_steps)
        launcher = ranks is not None and snapshot.clock == "time"  # the ranks train; this process launched them
        # without steps of its own, the tree's curves go on the steps axis at the worst rank's steps
        mapped = by_steps and launcher
        timeline = snapshot.timeline
        series: DecimatingSeries = timeline.by_step if by_steps and not mapped else timeline.by_time
        x_all, columns = _curve_columns(series, "step" if by_steps and not mapped else "t_s")
        if mapped:
            x_all = steps_of_time(x_all, worst_feed)
            keep = np.isfinite(x_all)
            x_all, columns = x_all[keep], {c: v[keep] for c, v in columns.items()}
        x = _decimate(x_all)
        visible = _visible_curves(columns, launcher)
        groups = _strip_groups(visible)
        thresholds = _strip_thresholds(snapshot.guard_thresholds, visible)
        markers = [step if by_steps else t_s for t_s, step in snapshot.epoch_markers]
        with self._lock:
            self.x_label = _x_label(snapshot.clock, by_steps, worst_feed if mapped else None)
            shown = _in_curve_order(list(groups) or [RAM.column])
            for column, curves in groups.items():
                strip = self.strips.get(column) or self.strips.setdefault(column, self._new_strip(column, shown))
                drawn = [StripCurve(label, colour, _decimate(columns[c])) for c, label, colour in curves]
                strip.draw(x, drawn, thresholds.get(column, []), markers)
            self._show_strips(shown)
            if ranks is not None:
                self._draw_ranks(ranks, by_steps, worst_feed)
            # wrap only between the " · " separated parts, never inside one ("shm 0 B")
            parts = (html.escape(part).replace(" ", "&nbsp;") for part in text.split(" · "))
            self.status.value = f"<code>{' · '.join(parts)}</code>"
            self.updates += 1

    def _show_strips(self, columns: list[str]) -> None:
        """Lay out the strips of `columns` (in the curves' order); the box changes only when they do."""
        figures = self._strip_widgets(columns)
        if list(self.strip_box.children) != figures:
            self.strip_box.children = figures

    def _draw_ranks(self, ranks: RankCurves, by_steps: bool, worst_feed: Any) -> None:
        """The ranks' panel (under the lock, on the one writer thread)."""
        entries = len(ranks.memory) + len(ranks.vram) + (2 if ranks.band is not None else 0)
        self.rank_range = steady_range(ranks.low_bytes, ranks.peak_bytes, self.rank_range)
        scaled = with_headroom(self.rank_range, RANK_LEGEND_ROW_SHARE * entries)
        unit, unit_name = unit_of(scaled.high_bytes)
        if self.rank_figure is None:
            self._build_ranks_panel()
        with self.rank_lines.hold_sync():
            if ranks.memory:
                x, y = padded(ranks.memory)
                self.rank_lines.x, self.rank_lines.y = x, y / unit
                self.rank_lines.labels = [c.label for c in ranks.memory]
                self.rank_lines.colors = [c.colour for c in ranks.memory]
                self.rank_lines.opacities = _opacities(ranks.memory)
            self.rank_lines.display_legend = bool(ranks.memory)
        with self.rank_vram_lines.hold_sync():
            if ranks.vram:
                x, y = padded(ranks.vram)
                self.rank_vram_lines.x, self.rank_vram_lines.y = x, y / unit
                self.rank_vram_lines.labels = [c.label for c in ranks.vram]
                self.rank_vram_lines.colors = [c.colour for c in ranks.vram]
                self.rank_vram_lines.opacities = _opacities(ranks.vram)
            self.rank_vram_lines.visible = self.rank_vram_lines.display_legend = bool(ranks.vram)  # a hidden mark keeps its legend entry
        band = ranks.band
        with self.rank_band.hold_sync():
            if band is not None:
                self.rank_band.x = np.vstack([band.x, band.x])
                self.rank_band.y = np.vstack([band.low_bytes, band.high_bytes]) / unit
                self.rank_band.labels = [f"min of {band.ranks} ranks", f"max of {band.ranks} ranks"]
            self.rank_band.visible = self.rank_band.display_legend = band is not None  # a hidden mark keeps its legend entry
        show_epochs(self.rank_epoch_lines, ranks.epochs_x)
        with self.rank_y_scale.hold_sync():
            self.rank_y_scale.min, self.rank_y_scale.max = scaled.low_bytes / unit, scaled.high_bytes / unit
        self.rank_y_axis.label = unit_name
        self.rank_x_axis.label = (
            STEP_AXIS_LABELS.get(worst_feed.clock, "step") + " (each rank's)" if by_steps else "time (s)"
        )
        self.rank_figure.title = _ranks_title(ranks)
        children = self.widget.children
        if self.rank_figure not in children:  # not rendered at all in a single-process run
            self.widget.children = (*children[:2], self.rank_figure, *children[2:])

