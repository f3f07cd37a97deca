"""One strip of the live figure: a resource's curves on a y axis of their own, on the shared x scale.

RAM in hundreds of MiB and a heap leak of a few MiB on one axis draw the leak flat, and an axis from
zero flattens both: each strip's range is fitted to its own curves (`render.axis_range`, the rule the
static figure's strips follow too) and carried from one redraw to the next. The strip only adapts
that range and its readings to bqplot; it decides nothing itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import bqplot
import ipywidgets
import numpy as np

from ..render.axis_range import AxisRange, steady_range, threshold_in_view
from ..render.static import nice_ticks
from ..core.units import format_bytes

MIB, GIB = float(1 << 20), float(1 << 30)
MARGIN_PX = {"top": 30, "bottom": 22, "left": 60, "right": 20}
BOTTOM_MARGIN_PX = 40  # the last strip's x axis also carries its label
TICKS = 4  # round y ticks (the static figure's), few enough for a strip's height


@dataclass(frozen=True)
class StripCurve:
    """One curve of a strip, decimated like the x values it is drawn against.

    Attributes:
        label: the legend's words for it ("heap in use").
        colour: its line's colour.
        y_bytes: its readings (NaN where the source was absent).
    """

    label: str
    colour: str
    y_bytes: np.ndarray


@dataclass(frozen=True)
class Threshold:
    """A guard's threshold on one of the strip's curves: (bytes, label, colour)."""

    bytes: float
    label: str
    colour: str


def unit_of(high_bytes: float) -> tuple[float, str]:
    """The axis unit for a range up to `high_bytes`: GiB from 10 GiB on, else MiB."""
    return (GIB, "GiB") if high_bytes >= 10 * GIB else (MIB, "MiB")


def strip_title(curves: Sequence[StripCurve], drawn: Sequence[Threshold], off_view: Sequence[Threshold]) -> str:
    """The strip's caption: its curves (a second one is the pale line) and its guard's threshold,
    dashed when drawn, else where it is (above the plot until the curve gets half way to it)."""
    parts = [curves[0].label, *(f"{c.label} (pale)" for c in curves[1:])]
    parts += [f"{t.label} (dashed)" for t in drawn]
    parts += [f"{t.label} at {format_bytes(t.bytes)}, above" for t in off_view]
    return " · ".join(parts)


class CurveStrip:
    """A bqplot figure for one resource: its curves, its epoch lines and its guard's threshold.

    The epoch lines and the threshold's line are made when there is a first epoch or a threshold
    to draw (most cells have neither): until then the figure has its curves' mark only.
    """

    def __init__(
        self, x_scale: Any, marker_scale: Any, caption: str = "", colour: str = "#000000", *,
        layout: Any = None, x_label: str | None = None,
    ) -> None:
        """`caption` and `colour`: its title before the first draw. A figure shown before it has a title
        would keep none: bqplot's view misses a title set while it is still being rendered. `layout`:
        its figure's (the live figure's strips share one, all of a height); `x_label`: as `place`'s."""
        self.range: AxisRange | None = None  # the range drawn last, carried to the next redraw
        self._epochs: tuple[float, ...] | None = None
        self._x_scale, self._marker_scale = x_scale, marker_scale
        self.y_scale = bqplot.LinearScale(min=0.0)
        self.lines = bqplot.Lines(x=np.zeros(0), y=np.zeros(0), scales=self._scales(), display_legend=False, stroke_width=2)
        self.guard_lines: Any = None  # made when a threshold is first drawn
        self.epoch_lines: Any = None  # made at the first epoch
        # made placed: a change after the model's comm opened is one more message
        self.x_axis = bqplot.Axis(scale=x_scale, label=x_label or "")
        self.y_axis = bqplot.Axis(scale=self.y_scale, side="left", label="MiB", tick_format=",.2~f")
        self.figure = bqplot.Figure(
            marks=[self.lines], axes=[self.x_axis, self.y_axis],
            animation_duration=0, fig_margin=_margin(x_label), title=caption,
            title_style={"font-size": "13px", "fill": colour},
            layout=layout if layout is not None else ipywidgets.Layout(width="100%", height="190px"),
            scale_x=marker_scale, scale_y=marker_scale,  # what its own default [0, 1] scales would be
        )

    def _scales(self) -> dict[str, Any]:
        return {"x": self._x_scale, "y": self.y_scale}

    @property
    def labels(self) -> list[str]:
        return list(self.lines.labels)

    def place(self, height_px: int, x_label: str | None) -> None:
        """Its height, and the x axis label when it is the bottom strip (None: another one is)."""
        self.figure.layout.height = f"{height_px}px"
        self.x_axis.label = x_label or ""
        margin = _margin(x_label)
        if self.figure.fig_margin != margin:
            self.figure.fig_margin = margin

    def draw(self, x: np.ndarray, curves: Sequence[StripCurve], thresholds: Sequence[Threshold],
             epochs_x: Sequence[float]) -> None:
        """Draw `curves` against `x`, each threshold their readings have come near, and the epochs. One
        reading is no line yet (a start cut short by a Ctrl-C ends with one): bqplot squeezes a 1x1 array
        to a scalar, which its Lines refuse."""
        if len(x) < 2:
            return
        low, high = _finite_bounds(curves)
        drawn = [t for t in thresholds if threshold_in_view(high, t.bytes)]
        self.range = steady_range(low, max([high, *(t.bytes for t in drawn)]), self.range)
        unit, unit_name = unit_of(self.range.high_bytes)
        with self.lines.hold_sync():
            self.lines.x = x
            self.lines.y = np.vstack([c.y_bytes for c in curves]) / unit
            self.lines.labels = [c.label for c in curves]
            self.lines.colors = [c.colour for c in curves]
        self._draw_thresholds(x, drawn, unit)
        low_unit, high_unit = self.range.low_bytes / unit, self.range.high_bytes / unit
        if (self.y_scale.min, self.y_scale.max) != (low_unit, high_unit):  # most redraws keep the range
            with self.y_scale.hold_sync():
                self.y_scale.min, self.y_scale.max = low_unit, high_unit
            with self.y_axis.hold_sync():
                self.y_axis.tick_values = np.asarray(nice_ticks(low_unit, high_unit, TICKS), dtype=np.float64)
                self.y_axis.label = unit_name
        with self.figure.hold_sync():
            self.figure.title = strip_title(curves, drawn, [t for t in thresholds if t not in drawn])
            self.figure.title_style = {"font-size": "13px", "fill": curves[0].colour}
        self._show_epochs(tuple(epochs_x))

    def _draw_thresholds(self, x: np.ndarray, drawn: Sequence[Threshold], unit: float) -> None:
        shown = bool(drawn) and bool(x.size)
        if self.guard_lines is None:
            if shown:  # the first threshold in view: its line, made with what it draws
                self.guard_lines = bqplot.Lines(
                    x=np.tile([x[0], x[-1]], (len(drawn), 1)), y=np.array([[t.bytes / unit] * 2 for t in drawn]),
                    labels=[t.label for t in drawn], colors=[t.colour for t in drawn], scales=self._scales(),
                    line_style="dashed", stroke_width=1.5, display_legend=False,
                )
                self._show_marks()
            return
        with self.guard_lines.hold_sync():
            if shown:
                self.guard_lines.x = np.tile([x[0], x[-1]], (len(drawn), 1))
                self.guard_lines.y = np.array([[t.bytes / unit] * 2 for t in drawn])
                self.guard_lines.labels = [t.label for t in drawn]
                self.guard_lines.colors = [t.colour for t in drawn]
            self.guard_lines.visible = shown

    def _show_epochs(self, xs: tuple[float, ...]) -> None:
        """Move the epoch lines only when they changed: most redraws add no epoch."""
        if xs == self._epochs:
            return
        self._epochs = xs
        if self.epoch_lines is None:
            if xs:  # the first epoch: its lines, made where they go
                self.epoch_lines = epoch_marks(self._x_scale, self._marker_scale, xs)
                self._show_marks()
            return
        show_epochs(self.epoch_lines, xs)

    def _show_marks(self) -> None:
        """The figure's marks, bottom to top: the curves, the epoch lines, the threshold's line."""
        self.figure.marks = [m for m in (self.lines, self.epoch_lines, self.guard_lines) if m is not None]


def _margin(x_label: str | None) -> dict[str, int]:
    """The figure's margins: the bottom strip's (`x_label` not None) also holds the x axis' label."""
    return dict(MARGIN_PX, bottom=BOTTOM_MARGIN_PX if x_label is not None else MARGIN_PX["bottom"])


def epoch_marks(x_scale: Any, marker_scale: Any, xs: Sequence[float] = ()) -> Any:
    """Dashed vertical lines over a panel's whole height at `xs` (hidden while there are none), on the
    [0, 1] `marker_scale`: each panel's height whatever its y axis."""
    return bqplot.Lines(
        x=_epoch_x(xs), y=_epoch_y(xs), scales={"x": x_scale, "y": marker_scale},
        colors=["#999999"], line_style="dashed", stroke_width=1, visible=bool(xs),
    )


def _epoch_x(xs: Sequence[float]) -> np.ndarray:
    return np.repeat(np.asarray(xs, dtype=np.float64)[:, None], 2, axis=1) if xs else np.zeros((1, 2))


def _epoch_y(xs: Sequence[float]) -> np.ndarray:
    return np.tile([0.0, 1.0], (len(xs), 1)) if xs else np.array([[0.0, 1.0]])


def _finite_bounds(curves: Sequence[StripCurve]) -> tuple[float, float]:
    """The lowest and highest finite reading of `curves` (0, 0 without one)."""
    values = np.concatenate([c.y_bytes for c in curves]) if curves else np.zeros(0)
    values = values[np.isfinite(values)]
    return (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)


def show_epochs(marks: Any, xs: Sequence[float]) -> None:
    """Move a panel's epoch lines to `xs` (hidden when there are none), in one message."""
    with marks.hold_sync():
        if xs:
            marks.x, marks.y = _epoch_x(xs), _epoch_y(xs)
        marks.visible = bool(xs)
