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
from typing import TYPE_CHECKING, Any

import bqplot
import ipywidgets
import numpy as np

from ..timeline import DecimatingSeries
from .controls import Controls
from .text import status_line

if TYPE_CHECKING:
    from ..results import Report
    from ..session import MemwatchSession

MIB, GIB = float(1 << 20), float(1 << 30)
STEP_AXIS_LABELS = {"optimizer": "optimizer step", "backward": "backward pass", "batch": "batch", "forward": "forward call"}
MAX_POINTS = 2000
LEGEND_ROW_SHARE = 0.07  # headroom per legend entry, so the top-left legend does not hide the curves

#: (column, legend label, colour) of every curve the figure can show; absent sources are left out.
CURVES: tuple[tuple[str, str, str], ...] = (
    ("ram_bytes", "RAM (process tree)", "#1f77b4"),
    ("rss_bytes", "RSS (kernel)", "#9ecae1"),
    ("heap_bytes", "heap in use", "#2ca02c"),
    ("workers_bytes", "workers (PSS)", "#8c564b"),
    ("vram_allocated_bytes", "VRAM allocated", "#d62728"),
    ("vram_reserved_bytes", "VRAM reserved", "#ff9896"),
    ("shm_used_bytes", "/dev/shm used", "#9467bd"),
)


def _decimate(values: np.ndarray) -> np.ndarray:
    if len(values) <= MAX_POINTS:
        return values
    return values[:: math.ceil(len(values) / MAX_POINTS)]


def _has_data(column: np.ndarray) -> bool:
    return bool(column.size) and bool(np.isfinite(column).any()) and bool(np.nanmax(column) > 0)


def _visible_curves(data: dict[str, np.ndarray]) -> list[tuple[str, str, str]]:
    """Curves with data; the kernel's own RSS only when children make it differ from the tree's RAM."""
    curves = [c for c in CURVES if _has_data(data[c[0]])]
    if np.array_equal(data["rss_bytes"], data["ram_bytes"]):
        curves = [c for c in curves if c[0] != "rss_bytes"]
    return curves


class LiveFigure:
    """Status line + figure + x-axis toggle (time or steps). Implements the session's Listener."""

    tick_period_s = 0.25  # at most 4 updates a second

    def __init__(self, title: str = "memwatch") -> None:
        self._session: MemwatchSession | None = None
        self._lock = threading.Lock()  # the final draw and a late tick never interleave
        self.updates = 0
        self.x_scale = bqplot.LinearScale()
        self.y_scale = bqplot.LinearScale(min=0.0)
        self.marker_scale = bqplot.LinearScale(min=0.0, max=1.0)
        self.lines = bqplot.Lines(
            x=np.zeros(0), y=np.zeros(0), scales={"x": self.x_scale, "y": self.y_scale},
            display_legend=True, stroke_width=2,
        )
        self.epoch_lines = bqplot.Lines(
            x=np.zeros((1, 2)), y=np.array([[0.0, 1.0]]), scales={"x": self.x_scale, "y": self.marker_scale},
            colors=["#999999"], line_style="dashed", stroke_width=1, visible=False,
        )
        self.x_axis = bqplot.Axis(scale=self.x_scale, label="time (s)")
        self.y_axis = bqplot.Axis(scale=self.y_scale, side="left", label="MiB", tick_format=",.0f")
        self.figure = bqplot.Figure(
            marks=[self.lines, self.epoch_lines], axes=[self.x_axis, self.y_axis], title=title,
            animation_duration=0, legend_location="top-left",
            fig_margin={"top": 40, "bottom": 40, "left": 60, "right": 20},
            layout=ipywidgets.Layout(width="100%", height="320px"),
        )
        self.status = ipywidgets.HTML(value="<code>starting…</code>")
        self.x_toggle = ipywidgets.ToggleButtons(
            options=[("time", "time"), ("steps", "steps")], value="time",
            tooltips=["x axis: seconds since the cell started", "x axis: steps (optimizer steps, else backward passes, batches or forward calls)"],
            style={"button_width": "60px"},
        )
        self.x_toggle.observe(self._on_toggle, names="value")
        self.x_toggle.layout = ipywidgets.Layout(flex="0 0 auto")
        self.status.layout = ipywidgets.Layout(flex="1 1 auto", margin="0 0 0 1em")
        self.controls = Controls()
        self.widget = ipywidgets.VBox(
            [
                ipywidgets.HBox([self.x_toggle, self.status], layout=ipywidgets.Layout(align_items="center")),
                self.figure,
                self.controls.widget,
            ],
            layout=ipywidgets.Layout(width="100%"),
        )

    def attach(self, session: MemwatchSession) -> None:
        """Called on the main thread before the session starts: the buttons can reach it."""
        self._session = session
        self.controls.attach(session)

    # ---------------------------------------------------------------- Listener
    def on_tick(self, session: MemwatchSession) -> None:
        self._session = session
        self._draw(session, final=False)

    def on_finish(self, session: MemwatchSession, report: Report) -> None:
        self._session = session
        self._draw(session, final=True, report=report)
        self.controls.finish(report)

    def _on_toggle(self, change: Any) -> None:
        session = self._session
        if session is not None and not session.running:  # while running, the next tick redraws
            self._draw(session, final=True, report=session.report)

    # ---------------------------------------------------------------- drawing
    def _draw(self, session: MemwatchSession, final: bool, report: Report | None = None) -> None:
        by_steps = self.x_toggle.value == "steps"
        series: DecimatingSeries = session.timeline.by_step if by_steps else session.timeline.by_time
        x_name = "step" if by_steps else "t_s"
        data = series.columns(x_name, *(c for c, _, _ in CURVES))
        x = _decimate(np.frombuffer(data[x_name], dtype=np.float64))
        columns = {c: np.frombuffer(data[c], dtype=np.float64) for c, _, _ in CURVES}
        visible = _visible_curves(columns)
        peak = max((float(np.nanmax(columns[c])) for c, _, _ in visible), default=0.0)
        unit, unit_name = (GIB, "GiB") if peak >= 10 * GIB else (MIB, "MiB")
        curves = [(_decimate(columns[c]) / unit, label, colour) for c, label, colour in visible]
        markers = [step if by_steps else t_s for t_s, step in session.epoch_markers()]
        text = status_line(session.live_status())
        if final and report is not None:
            text = f"{report.status} · {text}"
        with self._lock:
            with self.lines.hold_sync():
                if curves:
                    self.lines.x = x
                    self.lines.y = np.vstack([c[0] for c in curves])
                    self.lines.labels = [c[1] for c in curves]
                    self.lines.colors = [c[2] for c in curves]
            self.y_scale.max = peak / unit * (1.05 + LEGEND_ROW_SHARE * len(curves)) if peak > 0 else None
            self.y_axis.label = unit_name
            with self.epoch_lines.hold_sync():
                if markers:
                    self.epoch_lines.x = np.repeat(np.asarray(markers, dtype=np.float64)[:, None], 2, axis=1)
                    self.epoch_lines.y = np.tile([0.0, 1.0], (len(markers), 1))
                self.epoch_lines.visible = bool(markers)
            self.x_axis.label = STEP_AXIS_LABELS.get(session.clock, "step") if by_steps else "time (s)"
            # wrap only between the " · " separated parts, never inside one ("shm 0 B")
            parts = (html.escape(part).replace(" ", "&nbsp;") for part in text.split(" · "))
            self.status.value = f"<code>{' · '.join(parts)}</code>"
            self.updates += 1

