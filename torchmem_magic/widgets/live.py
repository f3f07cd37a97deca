"""The live figure: one bqplot figure under the cell, mutated in place while the cell runs.

Created and displayed once on the main thread; afterwards only the sampler thread writes to it
(throttled by the session to `tick_period_s`), each update batched with `hold_sync()` into one
message per widget. After the session stopped, the main thread draws the final state. Every series
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

from .. import resources
from ..ranks.feed import rank_numbers
from ..ranks.live import worst_live
from ..render.text import status_line
from ..resources import RAM, RSS
from ..timeline import DecimatingSeries
from .controls import Controls
from .rank_curves import RankCurves, padded, rank_curves, steps_of_time

if TYPE_CHECKING:
    from ..results import Report
    from ..live_view import LiveView
    from ..step_requests import StepRequests

MIB, GIB = float(1 << 20), float(1 << 30)
STEP_AXIS_LABELS = {"optimizer": "optimizer step", "backward": "backward pass", "batch": "batch", "forward": "forward call"}
MAX_POINTS = 2000
LEGEND_ROW_SHARE = 0.07  # headroom per legend entry, so the top-left legend does not hide the curves
RANK_LEGEND_ROW_SHARE = 0.12  # the same, of the ranks' span (their panel is zoomed to it)
MIN_ZOOM_SPAN_BYTES = 4 << 20  # a flat heap is drawn flat, not as its noise blown up to the panel's height
#: a guard's threshold is drawn once its curve reaches this share of it: before, the line would squash the curves
GUARD_LINE_FROM = 0.5

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


def _guard_lines(
    thresholds: Sequence[tuple[str, float, str]], columns: dict[str, np.ndarray]
) -> list[tuple[float, str, str]]:
    """(bytes, label, colour) of each guard threshold worth drawing: its curve has reached half of it."""
    colours = {column: colour for column, _, colour in CURVES}
    out = []
    for column, threshold_bytes, label in thresholds:
        values = columns.get(column)
        if values is None or not _has_data(values) or not threshold_bytes > 0:
            continue
        if float(np.nanmax(values)) >= GUARD_LINE_FROM * threshold_bytes:
            out.append((threshold_bytes, label, colours.get(column, "#000000")))
    return out


def _zoomed(low: float, peak: float, unit: float, entries: int) -> tuple[float, float | None]:
    """The ranks' y range: their readings' own span, not from zero, so that a rank's growth of a few
    MiB on a heap of a hundred shows as a slope; headroom above for the legend."""
    if peak <= 0:
        return 0.0, None
    span = max(peak - low, MIN_ZOOM_SPAN_BYTES)
    bottom = max(0.0, low - 0.1 * span)
    return bottom / unit, (peak + span * (0.1 + RANK_LEGEND_ROW_SHARE * entries)) / unit


def _y_max(peak: float, unit: float, entries: int) -> float | None:
    return peak / unit * (1.05 + LEGEND_ROW_SHARE * entries) if peak > 0 else None


class LiveFigure:
    """Status line + figure + x-axis toggle (time or steps). Implements the session's Listener."""

    tick_period_s = 0.25  # at most 4 updates a second ...
    tick_cpu_share: float | None = 0.004  # ... and fewer when a redraw costs more than 0.4% of the time between two
    tick_max_period_s = 2.0  # ... but at least one every 2 s: a figure that stops moving looks like a hung cell

    def __init__(self, title: str = "memwatch") -> None:
        self._view: LiveView | None = None  # the last run drawn (the x-axis toggle redraws it)
        self._lock = threading.Lock()  # the final draw and a late tick never interleave
        self.updates = 0
        self.x_scale = bqplot.LinearScale()
        self.y_scale = bqplot.LinearScale(min=0.0)
        self.marker_scale = bqplot.LinearScale(min=0.0, max=1.0)
        self.lines = bqplot.Lines(
            x=np.zeros(0), y=np.zeros(0), scales={"x": self.x_scale, "y": self.y_scale},
            display_legend=True, stroke_width=2,
        )
        self.epoch_lines = self._epoch_marks()
        self.guard_lines = bqplot.Lines(  # the memory guard's thresholds (hidden without --guard)
            x=np.zeros((1, 2)), y=np.zeros((1, 2)), scales={"x": self.x_scale, "y": self.y_scale},
            line_style="dashed", stroke_width=1.5, display_legend=False, visible=False,
        )
        self.x_axis = bqplot.Axis(scale=self.x_scale, label="time (s)")
        self.y_axis = bqplot.Axis(scale=self.y_scale, side="left", label="MiB", tick_format=",.0f")
        self.figure = bqplot.Figure(
            marks=[self.lines, self.epoch_lines, self.guard_lines], axes=[self.x_axis, self.y_axis], title=title,
            animation_duration=0, legend_location="top-left",
            fig_margin={"top": 40, "bottom": 40, "left": 60, "right": 20},
            layout=ipywidgets.Layout(width="100%", height="320px"),
            scale_x=self.marker_scale, scale_y=self.marker_scale,  # what its own default [0, 1] scales would be
        )
        self.rank_figure: Any = None  # built when the first rank streams: most runs have none
        # layouts given at construction: a widget made without one opens a default one first
        self.status = ipywidgets.HTML(
            value="<code>starting…</code>", layout=ipywidgets.Layout(flex="1 1 auto", margin="0 0 0 1em")
        )
        self.x_toggle = ipywidgets.ToggleButtons(
            options=[("time", "time"), ("steps", "steps")], value="time",
            tooltips=["x axis: seconds since the cell started", "x axis: steps (optimizer steps, else backward passes, batches or forward calls)"],
            style={"button_width": "60px"}, layout=ipywidgets.Layout(flex="0 0 auto"),
        )
        self.x_toggle.observe(self._on_toggle, names="value")
        self.controls = Controls()
        self.widget = ipywidgets.VBox(
            [
                ipywidgets.HBox([self.x_toggle, self.status], layout=ipywidgets.Layout(align_items="center")),
                self.figure,
                self.controls.widget,
            ],
            layout=ipywidgets.Layout(width="100%"),
        )

    def _epoch_marks(self) -> Any:
        """Dashed vertical lines over a panel's whole height, one per epoch (hidden until there are some)."""
        return bqplot.Lines(
            x=np.zeros((1, 2)), y=np.array([[0.0, 1.0]]), scales={"x": self.x_scale, "y": self.marker_scale},
            colors=["#999999"], line_style="dashed", stroke_width=1, visible=False,
        )

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
        self.rank_epoch_lines = self._epoch_marks()
        self.rank_x_axis = bqplot.Axis(scale=self.x_scale, label="time (s)")
        self.rank_y_axis = bqplot.Axis(scale=self.rank_y_scale, side="left", label="MiB", tick_format=",.0f")
        self.rank_figure = bqplot.Figure(
            marks=[self.rank_band, self.rank_lines, self.rank_vram_lines, self.rank_epoch_lines],
            axes=[self.rank_x_axis, self.rank_y_axis], title="ranks",
            animation_duration=0, legend_location="top-left",
            fig_margin={"top": 40, "bottom": 40, "left": 60, "right": 20},
            layout=ipywidgets.Layout(width="100%", height="300px"),
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
        self._view = view
        self._draw(view, final=False)

    def on_finish(self, view: LiveView, report: Report) -> None:
        self._view = view
        self._draw(view, final=True, report=report)
        self.controls.finish(report)

    def _on_toggle(self, change: Any) -> None:
        view = self._view
        if view is not None and not view.running:  # while running, the next tick redraws
            self._draw(view, final=True, report=view.report)

    # ---------------------------------------------------------------- drawing
    def _rank_curves(self, view: LiveView, by_steps: bool) -> tuple[RankCurves | None, Any]:
        """The ranks' curves and the worst rank's feed (None, None without ranks)."""
        feeds = view.rank_feeds()
        if not feeds:
            return None, None
        numbers = rank_numbers(feeds)
        worst = worst_live(view.live_ranks())
        worst_pid = worst.pid if worst is not None else None
        curves = rank_curves(feeds, numbers, worst_pid, by_steps)
        return curves, next((f for f in feeds if f.pid == worst_pid), feeds[0])

    def _draw(self, view: LiveView, final: bool, report: Report | None = None) -> None:
        by_steps = self.x_toggle.value == "steps"
        text = status_line(view.live_status())
        if final and report is not None:
            text = f"{report.status} · {text}"
        ranks, worst_feed = self._rank_curves(view, by_steps)
        launcher = ranks is not None and view.clock == "time"  # the ranks train; this process launched them
        # without steps of its own, the tree's curves go on the steps axis at the worst rank's steps
        mapped = by_steps and launcher
        series: DecimatingSeries = view.timeline.by_step if by_steps and not mapped else view.timeline.by_time
        x_name = "step" if by_steps and not mapped else "t_s"
        data = series.columns(x_name, *(c for c, _, _ in CURVES))
        x_all = np.frombuffer(data[x_name], dtype=np.float64)
        columns = {c: np.frombuffer(data[c], dtype=np.float64) for c, _, _ in CURVES}
        if mapped:
            x_all = steps_of_time(x_all, worst_feed)
            keep = np.isfinite(x_all)
            x_all, columns = x_all[keep], {c: v[keep] for c, v in columns.items()}
        x = _decimate(x_all)
        visible = _visible_curves(columns, launcher)
        peak = max((float(np.nanmax(columns[c])) for c, _, _ in visible), default=0.0)
        guard = _guard_lines(view.guard_thresholds(), columns) if x_all.size else []
        peak = max([peak, *(threshold for threshold, _, _ in guard)])
        unit, unit_name = (GIB, "GiB") if peak >= 10 * GIB else (MIB, "MiB")
        curves = [(_decimate(columns[c]) / unit, label, colour) for c, label, colour in visible]
        markers = [step if by_steps else t_s for t_s, step in view.epoch_markers()]
        with self._lock:
            with self.lines.hold_sync():
                if curves:
                    self.lines.x = x
                    self.lines.y = np.vstack([c[0] for c in curves])
                    self.lines.labels = [c[1] for c in curves]
                    self.lines.colors = [c[2] for c in curves]
            with self.guard_lines.hold_sync():
                if guard:
                    self.guard_lines.x = np.tile([x_all[0], x_all[-1]], (len(guard), 1))
                    self.guard_lines.y = np.array([[t / unit, t / unit] for t, _, _ in guard])
                    self.guard_lines.labels = [label for _, label, _ in guard]
                    self.guard_lines.colors = [colour for _, _, colour in guard]
                self.guard_lines.visible = self.guard_lines.display_legend = bool(guard)  # a hidden mark keeps its legend entry
            self.y_scale.max = _y_max(peak, unit, len(curves) + len(guard))
            self.y_axis.label = unit_name
            _show_epochs(self.epoch_lines, markers)
            self.x_axis.label = self._x_label(view, by_steps, worst_feed if mapped else None)
            if ranks is not None:
                self._draw_ranks(ranks, by_steps, worst_feed)
            # wrap only between the " · " separated parts, never inside one ("shm 0 B")
            parts = (html.escape(part).replace(" ", "&nbsp;") for part in text.split(" · "))
            self.status.value = f"<code>{' · '.join(parts)}</code>"
            self.updates += 1


    @staticmethod
    def _x_label(view: LiveView, by_steps: bool, worst_feed: Any) -> str:
        if not by_steps:
            return "time (s)"
        if worst_feed is not None:
            return f"{STEP_AXIS_LABELS.get(worst_feed.clock, 'step')} (worst rank)"
        return STEP_AXIS_LABELS.get(view.clock, "step")

    def _draw_ranks(self, ranks: RankCurves, by_steps: bool, worst_feed: Any) -> None:
        """The ranks' panel (under the lock, on the one writer thread)."""
        peak = ranks.peak_bytes
        unit, unit_name = (GIB, "GiB") if peak >= 10 * GIB else (MIB, "MiB")
        entries = len(ranks.memory) + len(ranks.vram) + (2 if ranks.band is not None else 0)
        if self.rank_figure is None:
            self._build_ranks_panel()
        with self.rank_lines.hold_sync():
            if ranks.memory:
                x, y = padded(ranks.memory)
                self.rank_lines.x, self.rank_lines.y = x, y / unit
                self.rank_lines.labels = [c.label for c in ranks.memory]
                self.rank_lines.colors = [c.colour for c in ranks.memory]
            self.rank_lines.display_legend = bool(ranks.memory)
        with self.rank_vram_lines.hold_sync():
            if ranks.vram:
                x, y = padded(ranks.vram)
                self.rank_vram_lines.x, self.rank_vram_lines.y = x, y / unit
                self.rank_vram_lines.labels = [c.label for c in ranks.vram]
                self.rank_vram_lines.colors = [c.colour for c in ranks.vram]
            self.rank_vram_lines.visible = self.rank_vram_lines.display_legend = bool(ranks.vram)  # a hidden mark keeps its legend entry
        band = ranks.band
        with self.rank_band.hold_sync():
            if band is not None:
                self.rank_band.x = np.vstack([band.x, band.x])
                self.rank_band.y = np.vstack([band.low_bytes, band.high_bytes]) / unit
                self.rank_band.labels = [f"min of {band.ranks} ranks", f"max of {band.ranks} ranks"]
            self.rank_band.visible = self.rank_band.display_legend = band is not None  # a hidden mark keeps its legend entry
        _show_epochs(self.rank_epoch_lines, ranks.epochs_x)
        self.rank_y_scale.min, self.rank_y_scale.max = _zoomed(ranks.low_bytes, peak, unit, entries)
        self.rank_y_axis.label = unit_name
        self.rank_x_axis.label = (
            STEP_AXIS_LABELS.get(worst_feed.clock, "step") + " (each rank's)" if by_steps else "time (s)"
        )
        self.rank_figure.title = f"ranks: {ranks.quantity}" + (", VRAM allocated (dashed)" if ranks.vram else "")
        children = self.widget.children
        if self.rank_figure not in children:  # not rendered at all in a single-process run
            self.widget.children = (*children[:2], self.rank_figure, *children[2:])


def _show_epochs(marks: Any, xs: Sequence[float]) -> None:
    """Move a panel's epoch lines to `xs` (hidden when there are none), in one message."""
    with marks.hold_sync():
        if xs:
            marks.x = np.repeat(np.asarray(xs, dtype=np.float64)[:, None], 2, axis=1)
            marks.y = np.tile([0.0, 1.0], (len(xs), 1))
        marks.visible = bool(xs)
