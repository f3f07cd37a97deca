"""A per-epoch leak's shape: growth across the epochs' boundaries (a validation pass that keeps its outputs)
while the steps inside an epoch stay flat, a staircase (pure)."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence

#: a staircase's epochs are flat inside: their own steps grow less than this share of the net growth
WITHIN_EPOCH_SHARE = 0.3


def crossing_epochs(xs: Sequence[float], epoch_steps: Sequence[float]) -> set[int]:
    """Indices i whose interval (xs[i-1], xs[i]] holds an epoch's start. A binary search per interval:
    a long run has thousands of epochs, and trying each against each interval costs their product."""
    starts = sorted(epoch_steps)
    out = set()
    for i in range(1, len(xs)):
        first_after = bisect.bisect_right(starts, xs[i - 1])  # the first start past the interval's left end
        if first_after < len(starts) and starts[first_after] <= xs[i]:
            out.add(i)
    return out


def _epochs_crossed(xs: Sequence[float], starts: Sequence[float], boundary: set[int]) -> int:
    """How many epochs the boundary intervals hold: an interval sampled thinly (a busy machine) can hold
    two epochs' starts and both their growths; the interval the reading after the block closes holds
    the last epoch's end and no start. `starts`: sorted, each once (train and validation loaders started
    at the same step are one epoch)."""
    crossed = 0
    for i in boundary:
        held = bisect.bisect_right(starts, xs[i]) - bisect.bisect_right(starts, xs[i - 1])
        crossed += max(1, held)
    return crossed


def closes_last_epoch(ys: Sequence[float], boundary: set[int]) -> bool:
    """Whether the last interval, up to the reading after the block, is the last epoch's end: the block's
    end closes that epoch, and what runs after its last step (a validation pass, outputs kept per epoch)
    is read only there. It counts when it grew like the other epochs' ends, by a quarter of their mean."""
    last = len(ys) - 1
    others = [i for i in boundary if i != last]
    if last < 1 or not others:
        return False
    mean_growth = sum(ys[i] - ys[i - 1] for i in others) / len(others)
    return mean_growth > 0 and ys[last] - ys[last - 1] > 0.25 * mean_growth


def flat_within_epochs(xs: Sequence[float], ys: Sequence[float], boundary: set[int], net: float) -> bool:
    """Whether the intervals inside an epoch are flat: their growth, and their growth per step carried
    over the whole run, each under WITHIN_EPOCH_SHARE of the net growth.

    Per step, because with samples further apart than an epoch nearly every interval holds an epoch's
    start: a steady leak then grows mostly across the starts, and only the few intervals left inside
    an epoch (none at all, when none is) still tell that it grows there at the same rate."""
    within = [i for i in range(1, len(ys)) if i not in boundary]
    growth = sum(ys[i] - ys[i - 1] for i in within)
    within_steps = sum(xs[i] - xs[i - 1] for i in within)
    if abs(growth) >= WITHIN_EPOCH_SHARE * net or within_steps <= 0:
        return False
    return abs(growth) / within_steps * (xs[-1] - xs[0]) < WITHIN_EPOCH_SHARE * net


def per_epoch_growth(xs: Sequence[float], epoch_steps: Sequence[float], boundary: set[int], boundary_growth: float) -> tuple[float, float]:
    """(growth per epoch, an epoch's steps) of a staircase: what its boundaries added, per epoch crossed."""
    starts = sorted({e for e in epoch_steps if xs[0] <= e <= xs[-1]})  # train + val loaders: one start
    epoch_length = statistics.median(b - a for a, b in zip(starts, starts[1:])) if len(starts) > 1 else xs[-1] - xs[0]
    return boundary_growth / _epochs_crossed(xs, starts, boundary), epoch_length
