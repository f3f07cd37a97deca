"""The shape of one memory series (pure maths: no I/O, no torch, no IPython).

Robust slopes (Theil–Sen and a linear-time split-half cousin), the noise of sample-to-sample
changes, jumps whose new level holds, the warm-up at the start of a run and the fall of a last
reading that the end of the block released. Each works on plain step/byte sequences; `verdict.py`
turns what they find into verdicts.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: step-to-step changes that are enough to read the typical rate from them alone (twice the
#: sampled steps a verdict needs)
DENSE_CHANGES = 24
JUMP_MIN_BYTES = 256 * 1024  # a level change below this is never a jump nor a warm-up worth cutting
JUMP_NOISE_SCALES = 8.0  # a jump rises this many noise scales beyond the typical rate's growth
JUMP_OVER_RATE = 2.0  # ... and more than twice what the typical rate grows over its step gap
PERSISTENCE_POINTS = 5  # points each side of a jump whose medians tell whether its level holds
RELEASE_OF_SPREAD = 0.5  # a fall at the last reading this big a share of the series' spread...
PATTERN_OF_RELEASE = 0.25  # ...with no earlier fall this big a share of it: the block's end releasing
REST_FRACTION = 2 / 3  # a warm-up leaves a regular rest spanning at least this share of the run's steps
LEVEL_NOISE_SCALES = 4.0  # a point this far below the rest's line is still warming up
LEADING_JUMP_SPEEDUP = 10.0  # a leading jump grows this many times faster than the rest: warm-up
SHOWN_OF_FITTED = 0.5  # a leak's late level lies above its early one by at least this share of its fitted growth


def mad(values: Sequence[float]) -> float:
    """A robust scale: the median absolute deviation, scaled to a normal noise's standard deviation,
    so a few outliers (a temporary, a jump) leave it alone."""
    if not values:
        return 0.0
    center = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - center) for v in values)


def theil_sen(xs: Sequence[float], ys: Sequence[float], max_points: int = 200) -> tuple[float, float]:
    """(slope, intercept): median of all pairwise slopes over an even subsample of the points."""
    n = len(xs)
    if n > max_points:
        idx = [round(i * (n - 1) / (max_points - 1)) for i in range(max_points)]
        xs, ys = [xs[i] for i in idx], [ys[i] for i in idx]
        n = max_points
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(n) for j in range(i + 1, n) if xs[j] != xs[i]
    ]
    slope = statistics.median(slopes) if slopes else 0.0
    intercept = statistics.median(y - slope * x for x, y in zip(xs, ys))
    return slope, intercept


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


def noise_scale(xs: Sequence[float], ys: Sequence[float], rate: float = 0.0) -> float:
    """A robust scale of sample-to-sample noise: MAD of the growth beyond `rate` per interval / sqrt(2).

    Measured beyond the rate so that thinned sampling (an interval of 70 steps grows 70 times a
    one-step interval) is not mistaken for noise."""
    return mad(_excess_growth(xs, ys, rate)) / math.sqrt(2)


def _excess_growth(xs: Sequence[float], ys: Sequence[float], rate: float) -> list[float]:
    """Each interval's growth beyond `rate` times its step gap (entry i-1: from point i-1 to i)."""
    return [(y1 - y0) - rate * (x1 - x0) for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:])]


def typical_rate(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The growth rate of the typical step: the median step-to-step change where the series has enough
    of them, else the median of the intervals' rates, each weighted by its steps.

    Weighting by steps lets a thinned stretch count for the steps it covers; a median lets a few
    jumps or temporaries (a minority of the steps) leave it alone, unlike a fitted slope."""
    single = sorted(y1 - y0 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]) if x1 - x0 == 1)
    if len(single) >= DENSE_CHANGES:
        # enough step-by-step evidence (the densely sampled start): a thinned stretch's few long
        # intervals must not outvote it, or jumps every 40th step read as a steady rate
        return statistics.median(single)
    rated = sorted(((y1 - y0) / (x1 - x0), x1 - x0) for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]) if x1 > x0)
    half = sum(gap for _, gap in rated) / 2
    walked = 0.0
    for rate, gap in rated:
        walked += gap
        if walked >= half:
            return rate
    return 0.0


def _detrended(xs: Sequence[float], ys: Sequence[float], rate: float) -> list[float]:
    return [y - rate * x for x, y in zip(xs, ys)]


def persistent_jumps(xs: Sequence[float], ys: Sequence[float], noise: float, rate: float) -> list[int]:
    """Indices i where memory rose from point i-1 to i far beyond what `rate` grows over that step gap,
    and the new level holds (detrended median after vs before).

    Judging the rise against the gap keeps a steady leak sampled every 70 steps (each interval
    growing 70 times the rate) from reading as a series of jumps."""
    floor = max(JUMP_NOISE_SCALES * noise, JUMP_MIN_BYTES)
    per_step_floor = JUMP_OVER_RATE * max(rate, 0.0)
    level = _detrended(xs, ys, rate)
    out = []
    for i, excess in enumerate(_excess_growth(xs, ys, rate), start=1):
        if excess <= floor or excess <= per_step_floor * (xs[i] - xs[i - 1]):
            continue
        after = level[i : i + PERSISTENCE_POINTS]
        before = level[max(0, i - PERSISTENCE_POINTS) : i]
        if statistics.median(after) - statistics.median(before) > 0.5 * excess:
            out.append(i)
    return out


@dataclass(frozen=True)
class Changes:
    """What a series' step-to-step changes say: the typical step's rate, the noise beyond it, and the
    jumps whose level holds. The warm-up cut and the verdict both read them: where the cut leaves the
    series whole, they are worked out once."""

    rate: float
    noise: float
    jumps: tuple[int, ...]


def changes_of(xs: Sequence[float], ys: Sequence[float]) -> Changes:
    """`typical_rate`, then `noise_scale` beyond it, then `persistent_jumps` against both."""
    rate = typical_rate(xs, ys)
    noise = noise_scale(xs, ys, rate)
    return Changes(rate, noise, tuple(persistent_jumps(xs, ys, noise, rate)))


def _rest_start(xs: Sequence[float]) -> int:
    """Index of the first point of the run's last REST_FRACTION of steps: what a warm-up must leave."""
    bound = xs[0] + (1 - REST_FRACTION) * (xs[-1] - xs[0])
    return next(i for i, x in enumerate(xs) if x >= bound)


def _thirds_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Slope between the medians of the first and the last third of the points."""
    third = max(1, len(xs) // 3)
    run = statistics.median(xs[-third:]) - statistics.median(xs[:third])
    return (statistics.median(ys[-third:]) - statistics.median(ys[:third])) / run if run > 0 else 0.0


def _resistant_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Slope of Tukey's resistant line, polished once on its residuals.

    Linear time (but for the medians), unmoved by temporaries, and precise with thinned sampling:
    a dense start gives one third a well-measured level however few points the thinned end has.
    The polish matters on a steep line, where a third's median is only its middle point's value."""
    slope = _thirds_slope(xs, ys)
    return slope + _thirds_slope(xs, _detrended(xs, ys, slope))


def _line_floor(xs: Sequence[float], ys: Sequence[float], fit_from: int) -> tuple[list[float], float]:
    """The series detrended by the line of points[fit_from:], and the level under which a point lies
    below that line by more than noise."""
    rate = _resistant_slope(xs[fit_from:], ys[fit_from:])
    level = _detrended(xs, ys, rate)
    margin = max(LEVEL_NOISE_SCALES * noise_scale(xs[fit_from:], ys[fit_from:], rate), JUMP_MIN_BYTES)
    return level, statistics.median(level[fit_from:]) - margin


def _holds_from(level: Sequence[float], floor: float, i: int) -> bool:
    """Whether the series sits on the line from point i on (a median, so one temporary does not count)."""
    return statistics.median(level[i : i + PERSISTENCE_POINTS]) >= floor


def _rise_before_rest(xs: Sequence[float], ys: Sequence[float], rest: int) -> int:
    """Points before the series reaches its rest's line for good (0: it never lies below it).

    A first line, fitted to the last REST_FRACTION of the steps, only says roughly where the series
    reaches it: with thinned sampling that end has few points, far from the dense start. The line is
    refitted from there on, and the warm-up ends after the last point below it. A rise that goes on
    into the rest is no warm-up, nor is one that reached the line and fell back below it for a while
    (what a cycle sampled at every step at first shows)."""
    level, floor = _line_floor(xs, ys, rest)
    reached = next((i for i in range(rest) if _holds_from(level, floor, i)), rest)
    level, floor = _line_floor(xs, ys, reached)
    cut = next((i + 1 for i in range(rest - 1, -1, -1) if level[i] < floor), 0)
    if cut == 0 or not _holds_from(level, floor, cut):
        return 0
    on_line = next((i for i in range(cut) if _holds_from(level, floor, i)), cut)
    if any(not _holds_from(level, floor, j) for j in range(on_line + 1, cut)):
        return 0  # it was on the line already and fell back below it: a cycle (a list cleared each epoch)
    return cut


def _leading_jumps(xs: Sequence[float], ys: Sequence[float], jumps: Sequence[int], rest: int) -> int:
    """Points before the rest that carry jumps far faster than the rest grows on average.

    When later jumps make the rest irregular, only a rise at the start that dwarfs the run's own
    growth (the optimizer's state at its first step) is told apart as warm-up."""
    # the end's level from the last quarter of the steps: with a thinned tail of one or two samples, the
    # last points are mostly the dense start's, and the rest's growth would read as none
    end_level = statistics.median(ys[max(_late_from(xs), len(ys) - PERSISTENCE_POINTS):])
    cut = 0
    for j in jumps:
        if j >= rest:
            break
        rest_rate = max(0.0, (end_level - ys[j]) / max(xs[-1] - xs[j], 1e-9))
        if ys[j] - ys[cut] <= LEADING_JUMP_SPEEDUP * rest_rate * (xs[j] - xs[cut]):
            break
        cut = j
    return cut


def warmup_length(xs: Sequence[float], ys: Sequence[float], changes: Changes | None = None) -> int:
    """Points to drop at the start: growth concentrated early, however many steps it took.

    The warm-up ends where the series reaches the line of its rest (flat or a steady leak) for good,
    when that rest spans at least REST_FRACTION of the steps and holds no jump (a rest shorter than
    the sampled steps a verdict needs leaves no verdict yet). With jumps in the rest (a sporadic
    leak, a staircase) only leading jumps much faster than the rest's growth are warm-up: jumps
    spread over the run are the finding, not a warm-up. `changes`: `changes_of(xs, ys)`, where the
    caller has it already.
    """
    if len(ys) < 3:
        return 0
    rest = _rest_start(xs)
    jumps = (changes_of(xs, ys) if changes is None else changes).jumps
    cut = _rise_before_rest(xs, ys, rest) if len(ys) - rest >= 3 else 0
    if all(j <= cut for j in jumps):
        return cut
    return _leading_jumps(xs, ys, jumps, rest)


def released_at_the_end(ys: Sequence[float]) -> float:
    """The fall of the last reading when it is what the end of the block released; else 0.

    The last reading is taken when the block ends, after the loop: a list local to a function that
    returned, or one freed after the loop, is gone by then. That fall says nothing of the loop's own
    growth, and judged with the rest it reads as growth that stopped (a warm-up) or as no net
    growth. A fall that repeats earlier ones (a list cleared at every epoch's end) is the loop's own
    pattern and stays."""
    if len(ys) < 3:
        return 0.0
    rest = ys[:-1]
    fall = rest[-1] - ys[-1]
    if fall <= max(RELEASE_OF_SPREAD * (max(rest) - min(rest)), JUMP_MIN_BYTES):
        return 0.0
    earlier = max((a - b for a, b in zip(rest, rest[1:])), default=0.0)
    return fall if earlier < PATTERN_OF_RELEASE * fall else 0.0


def shows_fitted_growth(xs: Sequence[float], ys: Sequence[float], slope: float) -> bool:
    """Whether the series' late level is above its early level by at least SHOWN_OF_FITTED of what `slope`
    grows between them (each level the median of a few points at its end, so one temporary does not count).

    A fit leans on where the samples are: a cycle's rising part sampled at every step at first (a list
    cleared at each epoch's end) gives a steep slope with no noise, while the thinned later samples, and
    the end, lie back near the start. A steady leak's later samples lie on its line: its growth shows."""
    k = max(1, min(PERSISTENCE_POINTS // 2 + 1, len(xs) // 3))
    early_x, early_y = statistics.median(xs[:k]), statistics.median(ys[:k])
    late_x, late_y = statistics.median(xs[-k:]), statistics.median(ys[-k:])
    return late_y - early_y >= SHOWN_OF_FITTED * slope * (late_x - early_x)


def spread_over_run(xs: Sequence[float], jumps: Sequence[int]) -> bool:
    """Whether some jump lies past the first (1 - REST_FRACTION) of the steps: a sporadic leak keeps
    jumping; jumps only at the start are a warm-up's."""
    return bool(jumps) and max(jumps) >= _rest_start(xs)


def new_readings(xs: Sequence[float], values: Sequence[float]) -> tuple[list[float], list[float]]:
    """The positive samples where a new reading shows (and the last): a sparse source (the workers' PSS,
    read about once a second) is carried into every step sample in between, and a steady rise must not
    read as a staircase."""
    out_x: list[float] = []
    out_y: list[float] = []
    for i, (x, y) in enumerate(zip(xs, values)):
        if not y > 0:
            continue
        if not out_y or y != out_y[-1] or i == len(values) - 1:
            out_x.append(x)
            out_y.append(y)
    return out_x, out_y


def _late_from(xs: Sequence[float]) -> int:
    """Index of the first sample in the run's last quarter of steps (not of samples: step samples come at
    every step at first and thin out later, so the last samples by count may all lie in the dense start)."""
    return bisect.bisect_left(xs, xs[-1] - 0.25 * (xs[-1] - xs[0]))


def evenly_spaced(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """The samples thinned to the spacing of the run's last quarter of steps (at least its last 4
    samples), the first and the last kept. Step samples come at every step at first and thin out as the
    run goes on, and a robust slope (and the spread of its residuals) weighs each stretch of steps by
    its number of samples: a cycle's rising part, sampled at every step at the start (a window cleared
    every 64 steps), would read as steady growth with no noise. Thinned, every stretch of steps counts
    alike."""
    n = len(xs)
    late = xs[min(_late_from(xs), max(0, n - 4)):] if n else []
    gaps = sorted(b - a for a, b in zip(late, late[1:]))
    gap = gaps[len(gaps) // 2] if gaps else 0.0
    if n < 16 or gap <= 1:
        return list(xs), list(ys)
    out_x, out_y = [xs[0]], [ys[0]]
    for x, y in zip(xs[1:-1], ys[1:-1]):
        if x - out_x[-1] >= gap:
            out_x.append(x)
            out_y.append(y)
    out_x.append(xs[-1])
    out_y.append(ys[-1])
    return out_x, out_y


def hinge_step(xs: Sequence[float], ys: Sequence[float], first_share: float, last_share: float,
               candidates: int = 40, max_points: int = 200) -> float | None:
    """The step at which a level, then a line rising from it, fits the series best (least squares, over the
    evenly spaced samples), among the steps from `first_share` to `last_share` of the run; None where no such
    hinge rises.

    A leak that starts part-way is a hockey stick: a line through the whole run fits it so badly that its
    own residuals hide the rise. The hinge says where to judge the rise from."""
    fit_xs, fit_ys = evenly_spaced(xs, ys)
    if len(fit_xs) > max_points:  # every step sampled: an even subsample costs the same however long the run
        keep = [round(i * (len(fit_xs) - 1) / (max_points - 1)) for i in range(max_points)]
        fit_xs, fit_ys = [fit_xs[i] for i in keep], [fit_ys[i] for i in keep]
    n = len(fit_xs)
    span = fit_xs[-1] - fit_xs[0] if fit_xs else 0.0
    if n < 8 or span <= 0:
        return None
    y_mean = statistics.fmean(fit_ys)
    centred = [y - y_mean for y in fit_ys]
    best: tuple[float, float] | None = None  # (the squared error the hinge takes away, step)
    for i in range(candidates):
        step = fit_xs[0] + (first_share + i * (last_share - first_share) / (candidates - 1)) * span
        tail = bisect.bisect_right(fit_xs, step)
        rise = [x - step for x in fit_xs[tail:]]  # the hinge's regressor, 0 before the step
        rise_sum, rise_squares = sum(rise), sum(r * r for r in rise)
        spread = rise_squares - rise_sum * rise_sum / n
        covariance = sum(r * y for r, y in zip(rise, centred[tail:]))
        if spread > 0 and covariance > 0:  # a rising line; least squares removes covariance² / spread
            explained = covariance * covariance / spread
            if best is None or explained > best[0]:
                best = (explained, step)
    return None if best is None else best[1]


def growth_stopped(xs: Sequence[float], ys: Sequence[float], noise: float, share_of_rise: float,
                   min_flat_points: int, flat_over_before: float) -> bool:
    """Whether the run's growth stopped: the readings since `flat_from` stay within the larger of
    LEVEL_NOISE_SCALES noises and `share_of_rise` of the rise of their end level (medians of 3, so one
    temporary does not end the flat), over at least as many steps as the rise took and `flat_over_before`
    times the steps before it began (a rise late in a run is too soon to call stopped), with no trend that
    grows more than that band over them; not where they do not (growth that goes on, or a rest too short yet
    to tell)."""
    n = len(ys)
    if n < min_flat_points + 2:
        return False
    end_level = statistics.median(ys[-min(PERSISTENCE_POINTS, n):])
    if end_level - min(ys) <= LEVEL_NOISE_SCALES * noise:  # no rise beyond the noise: nothing stopped
        return False
    level = [ys[0], *(max(min(a, b), min(max(a, b), c)) for a, b, c in zip(ys, ys[1:], ys[2:])), ys[-1]]
    rise_bytes = end_level - min(level)
    tolerance = max(LEVEL_NOISE_SCALES * noise, share_of_rise * rise_bytes)
    if rise_bytes <= tolerance:
        return False
    flat_from = n
    while flat_from > 0 and abs(level[flat_from - 1] - end_level) <= tolerance:
        flat_from -= 1
    below = [i for i in range(flat_from) if level[i] <= end_level - rise_bytes + tolerance]
    rise_from = below[-1] if below else 0
    if n - flat_from < min_flat_points:
        return False
    if xs[-1] - xs[flat_from] < max(xs[flat_from] - xs[rise_from], flat_over_before * (xs[rise_from] - xs[0])):
        return False
    flat_slope, _ = theil_sen(xs[flat_from:], ys[flat_from:], PERSISTENCE_POINTS * 8)
    if flat_slope * (xs[-1] - xs[flat_from]) > tolerance:  # a line that fits in the band: still growing
        return False
    return True
