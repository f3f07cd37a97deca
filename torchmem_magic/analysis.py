"""Pure analysis of sampled series (stdlib only: no torch, no IPython, no I/O)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .timeline import DecimatingSeries


def _evenly(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n), first and last included."""
    if n <= k:
        return list(range(n))
    return [round(i * (n - 1) / (k - 1)) for i in range(k)]


def robust_slope(xs: Sequence[float], ys: Sequence[float], max_points: int = 1024) -> float | None:
    """Median of split-half pairwise slopes (a linear-time cousin of Theil–Sen).

    Pairs each point with the one half a series later, so one jump (an optimizer's first-step
    state, a single big temporary) touches only the few pairs that straddle it. NaNs are skipped.
    Returns None with fewer than 3 usable points.
    """
    points = [(x, y) for x, y in zip(xs, ys) if not (math.isnan(x) or math.isnan(y))]
    if len(points) < 3:
        return None
    points = [points[i] for i in _evenly(len(points), max_points)]
    half = len(points) // 2
    slopes = sorted(
        (y2 - y1) / (x2 - x1)
        for (x1, y1), (x2, y2) in zip(points, points[half:])
        if x2 != x1
    )
    if not slopes:
        return None
    mid = len(slopes) // 2
    return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2


def growth_per_step(series: DecimatingSeries, column: str, max_points: int = 1024) -> float | None:
    """Bytes per optimizer step of `column` in a step-aligned series (None if it cannot say)."""
    cols = series.columns("step", column)
    return robust_slope(cols["step"], cols[column], max_points)
