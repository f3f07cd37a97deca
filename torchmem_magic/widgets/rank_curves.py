"""The ranks' curves for the live figure, as plain arrays (no widgets: testable on synthetic feeds).

Each rank shows its heap in use where every rank has one (a rank's leak shows there first; RSS lags
and fragments), else its RAM, plus its VRAM allocated when it has CUDA. The time axis is the
watcher's (each rank's seconds shifted by when it started); the steps axis is each rank's own.
Beyond `MAX_RANK_LINES` ranks one line each is unreadable: the worst rank's line and the spread of
all ranks (min and max at each point, where a rank has readings) are shown instead.

In a multi-node job the other nodes' ranks are drawn too, from their histories (`RankHistory`: a
point each time the job's store showed a new summary, about a second apart) on the same axes: the
watcher's seconds when the summary came, the steps it said. They are labelled with their host and
node and drawn lighter (`Curve.remote`). Where the ranks span several nodes, the node whose ranks
peak highest is named when it is more than `merge.IMBALANCE_SHARE` above the median node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..render.advice.ranks import imbalance_line
from ..report.merge import above_median
from ..report.assemble import training_loader
from ..core.resources import HEAP, RAM, VRAM
from ..core.timeline import DecimatingSeries
from ..stream.feed import RankFeed
from ..ranks.remote import RankHistory

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
    remote: bool = False  # another node's rank: a point a second, from the job's store


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
    imbalance: str | None = None  # the node that peaks well above the median node, where there are several

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


@dataclass(frozen=True)
class _Line:
    """One rank as the panel draws it: this node's from its feed, another node's from its history."""

    rank: int
    label: str
    x: np.ndarray
    columns: dict[str, np.ndarray]
    feed: RankFeed | None = None  # None: another node's rank

    @property
    def remote(self) -> bool:
        return self.feed is None


def remote_label(history: RankHistory) -> str:
    """'rank 5 @host-b (node 1)': a rank of another node, recognisable among this node's."""
    where = f" @{history.host}" if history.host else ""
    return f"rank {history.rank}{where}" + (f" (node {history.node})" if history.node is not None else "")


def _remote_line(history: RankHistory, by_steps: bool) -> _Line:
    """Its points at the watcher's seconds when each summary came, or at the steps each one said
    (none on a steps axis for a rank that counts no steps)."""
    columns = {name: np.frombuffer(values, dtype=np.float64) for name, values in history.columns.items()}
    readings = {name: values for name, values in columns.items() if name not in ("t_s", "step")}
    if by_steps and history.clock == "time":
        return _Line(history.rank, remote_label(history), np.zeros(0), {n: np.zeros(0) for n in readings})
    return _Line(history.rank, remote_label(history), columns["step" if by_steps else "t_s"], readings)


def _local_peak(feed: RankFeed) -> tuple[float, str]:
    """(peak, of what) as the report's imbalance line counts it: VRAM allocated where it has CUDA, else RAM."""
    vram = feed.timeline.by_time.max(VRAM.column)
    if not math.isnan(vram) and vram > 0:
        return vram, "VRAM"
    ram = feed.timeline.by_time.max(RAM.column)
    return (0.0 if math.isnan(ram) else ram), "RAM"


def node_imbalance(peaks: Sequence[tuple[int | None, float, str]]) -> str | None:
    """'imbalance: peak VRAM 3.0 GiB on node 1, median of 2 nodes 2.0 GiB (+50%)' from each rank's
    (node, peak, of what): a node's peak is its ranks' highest; None on one node, or none well above."""
    by_node: dict[int, tuple[float, str]] = {}
    for node, peak_bytes, what in peaks:
        if node is not None and (node not in by_node or peak_bytes > by_node[node][0]):
            by_node[node] = (peak_bytes, what)
    top = above_median([(node, peak) for node, (peak, _) in sorted(by_node.items())])
    if top is None:
        return None
    node, peak_bytes, median_bytes = top
    return imbalance_line(by_node[node][1], peak_bytes, f"node {node}", median_bytes, of=f"of {len(by_node)} nodes")


def rank_curves(
    feeds: Sequence[RankFeed], numbers: dict[int, int], worst_pid: int | None, by_steps: bool,
    max_lines: int = MAX_RANK_LINES, remote: Sequence[RankHistory] = (), worst_rank: int | None = None,
) -> RankCurves:
    """Every rank's curves, this node's (`feeds`) and the other nodes' (`remote`): at most `max_lines`,
    else the worst one and the spread of all. The worst is rank number `worst_rank` where given (it
    may be another node's), else the rank of `worst_pid`."""
    lines = [_Line(numbers[f.pid], f"rank {numbers[f.pid]}", *_columns(f, by_steps), feed=f) for f in feeds]
    lines += [_remote_line(h, by_steps) for h in remote]
    lines.sort(key=lambda line: line.rank)
    with_data = [line for line in lines if has_data(line.columns[HEAP.column]) or has_data(line.columns[RAM.column])]
    heap = bool(with_data) and all(has_data(line.columns[HEAP.column]) for line in with_data)
    column, quantity = (HEAP.column, HEAP.label) if heap else (RAM.column, RAM.short)
    target = worst_rank if worst_rank is not None else numbers.get(worst_pid) if worst_pid is not None else None
    worst = next((line for line in lines if line.rank == target), lines[0] if lines else None)
    epochs_feed = worst.feed if worst is not None and worst.feed is not None else next(
        (line.feed for line in lines if line.feed is not None), None)
    epochs = _epochs_x(epochs_feed, by_steps) if epochs_feed is not None else []
    imbalance = node_imbalance(
        [(None if f.job is None else f.job.get("node"), *_local_peak(f)) for f in feeds]
        + [(h.node, h.peak_bytes, h.peak_of) for h in remote]
    )
    if len(lines) > max_lines:
        assert worst is not None
        band = _band([_finite(line.x, line.columns[column]) for line in lines])
        colour, label = WORST_COLOUR, f"{worst.label} (worst)"
        memory = [Curve(label, *_finite(worst.x, worst.columns[column]), colour, worst.remote)]
        vram = [Curve(f"{label} VRAM", *_finite(worst.x, worst.columns[VRAM.column]), colour, worst.remote)] \
            if has_data(worst.columns[VRAM.column]) else []
        return RankCurves(quantity, [c for c in memory if c.x.size], [c for c in vram if c.x.size], band, epochs,
                          imbalance)
    memory, vram = [], []
    for i, line in enumerate(lines):
        colour = PALETTE[i % len(PALETTE)]
        curve = Curve(line.label, *_finite(line.x, line.columns[column]), colour, line.remote)
        if curve.x.size:
            memory.append(curve)
        if has_data(line.columns[VRAM.column]):
            vram_curve = Curve(f"{line.label} VRAM", *_finite(line.x, line.columns[VRAM.column]), colour, line.remote)
            if vram_curve.x.size:
                vram.append(vram_curve)
    return RankCurves(quantity, memory, vram, None, epochs, imbalance)


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
