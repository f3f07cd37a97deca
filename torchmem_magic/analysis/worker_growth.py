"""DataLoader workers' growth: how much the workers added, whether they are still copying a dataset page by page
(copy-on-access) and where their memory will end up once the first pass touched it all (pure)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from .findings import ResourceFinding, Series, readings_of

MIB = 1 << 20
#: a forked worker copies pages of the parent's heap as refcounts and the collector first touch them, a
#: rise at its start that stops once touched (~11 MiB each measured in a kernel); workers' growth below
#: this much per worker is that first touch, not a dataset copied
FIRST_TOUCH_BYTES_PER_WORKER = 16 * MIB
#: copying still goes on when the late half of the current workers' readings grew at least this share of
#: their average rate, and by at least STILL_COPYING_MIN_BYTES (a first touch's tail moves a few KiB)
STILL_COPYING_SHARE = 0.3
STILL_COPYING_MIN_BYTES = 4 * MIB


def workers_growth(series: Series, epoch_steps: Sequence[float] = ()) -> float:
    """What the workers added, warm-up included (what copying a dataset page by page adds): the most
    any one epoch's workers added, last reading minus first (workers that are not persistent start
    again each epoch, so the run's first and last readings belong to different processes)."""
    xs, ys = readings_of(series)
    if not ys:
        return 0.0
    bounds = [e for e in sorted(epoch_steps) if xs[0] < e <= xs[-1]]
    edges = [xs[0], *bounds, math.inf]
    # each reading goes to its epoch by a binary search: a long run has thousands of epochs
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for x, y in zip(xs, ys):
        epoch = bisect.bisect_right(edges, x) - 1  # the epoch of edges[epoch] <= x < edges[epoch + 1]
        if epoch >= 0:  # before the first reading's step: in no epoch
            first.setdefault(epoch, y)
            last[epoch] = y
    growths = [last[epoch] - first[epoch] for epoch in sorted(first)]
    return max(growths, default=ys[-1] - ys[0])


def _value_at(readings: Sequence[tuple[float, float]], x: float) -> float:
    """The workers' memory at step x, between two readings (linear)."""
    for (x0, y0), (x1, y1) in zip(readings, readings[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return readings[-1][1] if x > readings[-1][0] else readings[0][1]


def still_copying(series: Series, epoch_steps: Sequence[float] = ()) -> ResourceFinding | None:
    """Workers whose memory was still rising in the late half of their readings: a leak of the process
    tree while it goes on, at the current workers' average rate since their first reading (copying
    pages slows down as fewer are left, so a fitted slope of the early readings would overstate it;
    PSS is read only a few times a second, often too few readings for the detector).

    Copy-on-access goes on with the batches read; a first touch stops once the pages are touched. So the
    rise is judged over the current workers (from the last epoch's start: workers that are not
    persistent start again each epoch, and so does their first touch), in the late half of their readings."""
    xs, ys = readings_of(series)
    readings = [(x, y) for i, (x, y) in enumerate(zip(xs, ys)) if i == 0 or y != ys[i - 1]]
    if len(readings) < 3 or readings[-1][1] <= readings[-2][1] or xs[-1] <= xs[0]:
        return None
    start = max((e for e in epoch_steps if e <= readings[-1][0]), default=readings[0][0])
    current = [r for r in readings if r[0] >= start]
    current = current if len(current) >= 2 else readings
    first_x, last_x = current[0][0], current[-1][0]
    middle = (first_x + last_x) / 2
    late = current[-1][1] - _value_at(current, middle)
    average = (current[-1][1] - current[0][1]) / (last_x - first_x) if last_x > first_x else 0.0
    if late < max(STILL_COPYING_MIN_BYTES, STILL_COPYING_SHARE * average * (last_x - middle)):
        return None
    growth, rate = current[-1][1] - current[0][1], average
    exhaustion = max(0.0, (series.limit_bytes - ys[-1]) / rate) if series.limit_bytes and rate > 0 else None
    return ResourceFinding("ram", "leak", "per-iteration", rate, None, 0, 0.0, growth, (), exhaustion, growth)


def copy_on_access_projection(
    series: Series, finding: ResourceFinding, first_pass: tuple[int, int] | None
) -> dict[str, float]:
    """Where the workers' memory ends up once the first pass has touched the whole dataset:
    `settled_bytes` once that pass is complete, else `projected_bytes` by its last step
    (`first_pass_end`); nothing where it cannot be told."""
    xs, ys = readings_of(series)
    if first_pass is None or not ys:
        return {}
    first, last = first_pass
    now = xs[-1]
    if now >= last:
        return {"settled_bytes": ys[-1]}
    if not finding.per_step_bytes:
        return {}
    return {"projected_bytes": ys[-1] + finding.per_step_bytes * (last - now), "first_pass_end": last}
