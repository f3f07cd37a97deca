"""The ranks' curves for the live figure, as plain arrays (no widgets: testable on synthetic feeds).

Each rank shows its heap in use where every rank has one (a rank's leak shows there first; RSS lags
and fragments), else its RAM, plus its VRAM allocated when it has CUDA. The time axis is the
watcher's (each rank's seconds shifted by when it started); the steps axis is each rank's own.
Beyond `MAX_RANK_LINES` ranks one line each is unreadable: the worst rank's line and the spread of
all ranks (min and max at each point, where a rank has readings) are shown instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..report import training_loader
from ..resources import HEAP, RAM, VRAM
from ..timeline import DecimatingSeries
from ..ranks.feed import RankFeed

MAX_RANK_LINES = 8
MAX_POINTS = 2000
BAND_POINTS = 400
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WORST_COLOUR = "#d62728"
BAND_COLOUR = "#888888"


@dataclass(frozen=True)
class Curve:
    label: str
    x: np.ndarray
    y_bytes: np.ndarray
    colour: str


@dataclass(frozen=True)
class Band:
    """The spread of all ranks: lowest and highest reading at each x."""

    ranks: int
    x: np.ndarray
    low_bytes: np.ndarray
    high_bytes: np.ndarray


@dataclass(frozen=True)
class RankCurves:
    quantity: str  # "heap in use" or "RAM"
    memory: list[Curve] = field(default_factory=list)
    vram: list[Curve] = field(default_factory=list)
    band: Band | None = None
    epochs_x: list[float] = field(default_factory=list)  # the worst rank's epoch starts

    @property
    def peak_bytes(self) -> float:
        values = [float(np.max(c.y_bytes)) for c in (*self.memory, *self.vram) if c.y_bytes.size]
        if self.band is not None and self.band.high_bytes.size:
            values.append(float(np.max(self.band.high_bytes)))
        return max(values, default=0.0)

    @property
    def low_bytes(self) -> float:
        values = [float(np.min(c.y_bytes)) for c in (*self.memory, *self.vram) if c.y_bytes.size]
        if self.band is not None and self.band.low_bytes.size:
            values.append(float(np.min(self.band.low_bytes)))
        return min(values, default=0.0)


def has_data(column: np.ndarray) -> bool:
    return bool(column.size) and bool(np.isfinite(column).any()) and bool(np.nanmax(column) > 0)


def decimate(values: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    if len(values) <= max_points:
        return values
    return values[:: math.ceil(len(values) / max_points)]


def _columns(feed: RankFeed, by_steps: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    series: DecimatingSeries = feed.timeline.by_step if by_steps else feed.timeline.by_time
    x_name = "step" if by_steps else "t_s"
    data = series.columns(x_name, HEAP.column, RAM.column, VRAM.column)
    x = np.frombuffer(data[x_name], dtype=np.float64)
    x = x if by_steps else x + feed.offset_s
    return x, {name: np.frombuffer(values, dtype=np.float64) for name, values in data.items() if name != x_name}


def _finite(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(x) & np.isfinite(y)
    return decimate(x[keep]), decimate(y[keep])


def _band(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> Band | None:
    """Min and max over the ranks that have a reading at each x (no rank is extended past its span)."""
    spans = [(x, y) for x, y in curves if x.size >= 2]
    if not spans:
        return None
    grid = np.linspace(min(float(x[0]) for x, _ in spans), max(float(x[-1]) for x, _ in spans), BAND_POINTS)
    stack = np.full((len(spans), grid.size), np.nan)
    for i, (x, y) in enumerate(spans):
        inside = (grid >= x[0]) & (grid <= x[-1])
        stack[i, inside] = np.interp(grid[inside], x, y)
    covered = np.isfinite(stack).any(axis=0)
    if not covered.any():
        return None
    stack = stack[:, covered]
    low = np.where(np.isfinite(stack), stack, np.inf).min(axis=0)
    high = np.where(np.isfinite(stack), stack, -np.inf).max(axis=0)
    return Band(len(curves), grid[covered], low, high)


def _epochs_x(feed: RankFeed, by_steps: bool) -> list[float]:
    timeline = feed.timeline
    loader = training_loader("time", {}, timeline.passes)  # the loader with the most passes
    clock = feed.clock
    return [
        float(m.step_of(clock)) if by_steps else m.t_s + feed.offset_s  # type: ignore[arg-type]
        for m in timeline.epochs_of(loader)
    ]


def rank_curves(
    feeds: Sequence[RankFeed], numbers: dict[int, int], worst_pid: int | None, by_steps: bool,
    max_lines: int = MAX_RANK_LINES,
) -> RankCurves:
    """Every rank's curves (at most `max_lines`, else the worst one and the spread of all)."""
    columns = {feed.pid: _columns(feed, by_steps) for feed in feeds}
    with_data = [pid for pid, (_, cols) in columns.items() if has_data(cols[HEAP.column]) or has_data(cols[RAM.column])]
    heap = bool(with_data) and all(has_data(columns[pid][1][HEAP.column]) for pid in with_data)
    column, quantity = (HEAP.column, HEAP.label) if heap else (RAM.column, RAM.short)
    ordered = sorted(feeds, key=lambda f: numbers.get(f.pid, 0))
    if worst_pid is None or worst_pid not in columns:
        worst_pid = ordered[0].pid if ordered else None
    worst = next((f for f in ordered if f.pid == worst_pid), None)
    epochs = _epochs_x(worst, by_steps) if worst is not None else []
    if len(ordered) > max_lines:
        assert worst is not None
        band = _band([_finite(columns[f.pid][0], columns[f.pid][1][column]) for f in ordered])
        x, cols = columns[worst.pid]
        label = f"rank {numbers[worst.pid]} (worst)"
        memory = [Curve(label, *_finite(x, cols[column]), WORST_COLOUR)]
        vram = [Curve(f"{label} VRAM", *_finite(x, cols[VRAM.column]), WORST_COLOUR)] if has_data(cols[VRAM.column]) else []
        return RankCurves(quantity, [c for c in memory if c.x.size], [c for c in vram if c.x.size], band, epochs)
    memory, vram = [], []
    for i, feed in enumerate(ordered):
        x, cols = columns[feed.pid]
        colour = PALETTE[i % len(PALETTE)]
        label = f"rank {numbers[feed.pid]}"
        curve = Curve(label, *_finite(x, cols[column]), colour)
        if curve.x.size:
            memory.append(curve)
        if has_data(cols[VRAM.column]):
            vram_curve = Curve(f"{label} VRAM", *_finite(x, cols[VRAM.column]), colour)
            if vram_curve.x.size:
                vram.append(vram_curve)
    return RankCurves(quantity, memory, vram, None, epochs)


def padded(curves: Sequence[Curve]) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) as 2-D arrays of one length (a Lines mark's shape): shorter curves repeat their last point."""
    length = max(c.x.size for c in curves)

    def pad(values: np.ndarray) -> np.ndarray:
        return np.concatenate([values, np.full(length - values.size, values[-1])])

    return np.vstack([pad(c.x) for c in curves]), np.vstack([pad(c.y_bytes) for c in curves])


def steps_of_time(t_s: np.ndarray, feed: RankFeed) -> np.ndarray:
    """The watcher's seconds as `feed`'s steps (NaN outside the span its step samples cover): how the
    watcher's own curves are drawn on a steps axis when the watcher made no steps itself."""
    data = feed.timeline.by_step.columns("t_s", "step")
    rank_t = np.frombuffer(data["t_s"], dtype=np.float64) + feed.offset_s
    steps = np.frombuffer(data["step"], dtype=np.float64)
    keep = np.isfinite(rank_t) & np.isfinite(steps)
    rank_t, steps = rank_t[keep], steps[keep]
    if rank_t.size < 2:
        return np.full(t_s.shape, np.nan)
    out: np.ndarray = np.interp(t_s, rank_t, steps)
    out[(t_s < rank_t[0]) | (t_s > rank_t[-1])] = np.nan
    return out
