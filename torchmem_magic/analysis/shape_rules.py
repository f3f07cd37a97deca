"""The shapes of growth one resource is judged by (pure). Each rule reads only the resource's readings after
its warm-up (a `Shape`) and the thresholds of the table in force; no rule calls another. They are tried in
SHAPE_RULES' order on one resource, and the first that finds one gives its verdict (clean where none does)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.model import VerdictName
from ..core.slopes import evenly_spaced, growth_stopped, hinge_step, mad, robust_slope, shows_fitted_growth, spread_over_run, theil_sen
from .epochs import flat_within_epochs, per_epoch_growth
from .findings import ResourceFinding, Series
from .verdict_table import Thresholds


@dataclass(frozen=True)
class LineFit:
    """A robust line through a series: its slope and standard error, and whether its growth shows."""

    slope: float
    error: float
    total: float  # the line's growth over the series' steps
    big_enough: bool  # growth that noise alone cannot make, and that the late readings show too

    def shows_leak(self, z: float) -> bool:
        return self.big_enough and self.slope >= z * self.error


def fit_line(xs: Sequence[float], ys: Sequence[float], noise: float, max_points: int, t: Thresholds) -> LineFit:
    """The Theil–Sen line through the readings, weighing every stretch of steps alike, and its error."""
    fit_xs, fit_ys = evenly_spaced(xs, ys)
    slope, intercept = theil_sen(fit_xs, fit_ys, max_points)
    residual_scale = mad([y - (intercept + slope * x) for x, y in zip(fit_xs, fit_ys)])
    x_mean = statistics.fmean(fit_xs)
    spread = math.sqrt(sum((x - x_mean) ** 2 for x in fit_xs)) or 1.0
    error = max(residual_scale, noise, 1.0) / spread
    total = slope * (xs[-1] - xs[0])
    floor = max(t.min_total_bytes, t.fit_noise_scales * max(noise, residual_scale))
    return LineFit(slope, error, total, total > floor and shows_fitted_growth(xs, ys, slope))


@dataclass(frozen=True)
class Shape:
    """One resource's readings after its warm-up, with what the shape rules look at: the line's fit, the
    jumps, the readings where an epoch began, the growth over them."""

    series: Series
    xs: Sequence[float]
    ys: Sequence[float]
    warmup: int
    noise: float
    fit: LineFit
    jumps: list[int]
    boundary: set[int]  # readings that are the first of an epoch
    released: float
    epoch_steps: tuple[float, ...]  # the steps each epoch began at
    max_points: int  # bounds the cost of a robust fit

    @property
    def net(self) -> float:
        return self.ys[-1] - self.ys[0]

    def finding(self, verdict: VerdictName, kind: str | None, slope: float | None = None,
                sporadic: tuple[tuple[int, int], ...] = (), per_epoch: float | None = None,
                fit: LineFit | None = None, started_at: float | None = None) -> ResourceFinding:
        """The finding at `slope` (the fit's by default: the whole run's, or `fit`, a part's from `started_at`),
        with when the resource runs out at that rate."""
        fit = fit or self.fit
        slope = fit.slope if slope is None else slope
        exhaustion = None
        if verdict in ("leak", "suspect") and self.series.limit_bytes and slope > 0:
            exhaustion = max(0.0, (self.series.limit_bytes - self.ys[-1]) / slope)
        return ResourceFinding(
            self.series.resource, verdict, kind, slope, fit.error, self.warmup, self.noise, fit.total,
            sporadic, exhaustion, self.net, per_epoch, self.released, started_at_step=started_at,
        )


def per_epoch(shape: Shape, t: Thresholds) -> ResourceFinding | None:
    """A staircase: the growth comes where epochs begin, flat within them."""
    xs, ys, boundary, net = shape.xs, shape.ys, shape.boundary, shape.net
    boundary_growth = sum(ys[i] - ys[i - 1] for i in boundary)
    staircase = net > t.min_total_bytes and len(boundary) >= 2 and boundary_growth > t.epoch_growth_share * net
    if not (staircase and flat_within_epochs(xs, ys, boundary, net)):
        return None
    grown, epoch_length = per_epoch_growth(xs, shape.epoch_steps, boundary, boundary_growth)
    # spread over the epoch's steps, for the exhaustion
    return shape.finding("leak", "per-epoch", slope=grown / max(epoch_length, 1.0), per_epoch=grown)


def _jumps_make_growth(shape: Shape, t: Thresholds) -> bool:
    """A few jumps, spread over the run, make the growth, and nothing comes back (many up-jumps with as
    many falls is noise or a sawtooth)."""
    xs, ys, jumps, net = shape.xs, shape.ys, shape.jumps, shape.net
    jump_growth = sum(ys[i] - ys[i - 1] for i in jumps)
    few = len(jumps) <= max(3, int(len(ys) * t.jumps_per_reading)) and spread_over_run(xs, jumps)
    return few and t.jump_growth_low * net < jump_growth < t.jump_growth_high * net and net > t.min_total_bytes


def _a_ramp(shape: Shape, t: Thresholds) -> bool:
    """Jumps at `ramp_readings` readings in a row: a line sampled thinly (each reading many steps past the last)."""
    jumps, run = shape.jumps, t.ramp_readings
    return any(later - first == run - 1 for first, later in zip(jumps, jumps[run - 1:]))


def _jumps_finding(shape: Shape, t: Thresholds) -> ResourceFinding:
    """A sporadic finding at the jumps. With thinned sampling a jump is only known to lie between two sampled
    steps; one that only the reading after the block shows (it repeats the last step) lies in the last step.
    One rise is a level change (a cache filled late, an epoch's end temporaries the allocator kept): only a
    rise that comes again is a leak."""
    xs = shape.xs
    ranges = tuple((min(int(xs[i - 1]) + 1, int(xs[i])), int(xs[i])) for i in shape.jumps)
    verdict: VerdictName = "leak" if len(shape.jumps) >= t.sporadic_leak_jumps else "suspect"
    return shape.finding(verdict, "sporadic", slope=shape.net / (xs[-1] - xs[0]), sporadic=ranges)


def level_change(shape: Shape, t: Thresholds) -> ResourceFinding | None:
    """One jump carries the growth, and the readings stay level after it for at least as long as the run ran
    before it: a buffer resized once, a cache allocated late, a model grown mid-run. One jump is no pattern:
    clean (tried before the jump rules, which need it to come again)."""
    xs, ys, jumps = shape.xs, shape.ys, shape.jumps
    if len(jumps) != 1 or shape.net <= t.min_total_bytes:
        return None
    at = jumps[0]
    jump = ys[at] - ys[at - 1]
    if not t.jump_growth_low * shape.net < jump < t.jump_growth_high * shape.net:
        return None
    band = max(t.level_flat_of_jump * jump, 3 * shape.noise)
    level = ys[at:]  # its two ends by medians of 3: one temporary (a copy made as the buffer grew) is no trend
    moved = statistics.median(level[-3:]) - statistics.median(level[:3])
    if abs(moved) > band or xs[-1] - xs[at] < t.level_after_over_before * (xs[at - 1] - xs[0]):
        return None
    return shape.finding("clean", None, slope=0.0)


def sporadic(shape: Shape, t: Thresholds) -> ResourceFinding | None:
    """A few jumps make the growth; a ramp read thinly is left to the line rules (and `ramp_read_thinly`)."""
    if not _jumps_make_growth(shape, t) or _a_ramp(shape, t):
        return None
    return _jumps_finding(shape, t)


def ramp_read_thinly(shape: Shape, t: Thresholds) -> ResourceFinding | None:
    """Jumps at readings in a row that no line rule judged (too few readings for a line): still a leak by its
    jumps (tried after the line rules)."""
    if not _jumps_make_growth(shape, t) or not _a_ramp(shape, t):
        return None
    return _jumps_finding(shape, t)


def filled_then_flat(shape: Shape, t: Thresholds) -> ResourceFinding | None:
    """Growth that stopped: a rise (a cache or memo filling, bounded by the data), then flat within noise
    to the end over at least as many steps as the rise took and as the run before it. Clean: only growth
    that goes on is a leak. Tried before the jumps rules: a fill read as a few jumps is no sporadic leak,
    which keeps jumping. One jump is the level-change rule's to judge."""
    if len(shape.jumps) == 1:
        return None
    stopped = growth_stopped(shape.xs, shape.ys, shape.noise, t.flat_of_rise, t.late_min_readings,
                             t.level_after_over_before)
    return shape.finding("clean", None, slope=0.0) if stopped else None


def per_iteration(shape: Shape, t: Thresholds) -> ResourceFinding | None:
    """A line that rises with the steps, clear of the noise."""
    if not shape.fit.shows_leak(t.z_suspect):
        return None
    return shape.finding("leak" if shape.fit.shows_leak(t.z_leak) else "suspect", "per-iteration")


def started_late(shape: Shape, t: Thresholds) -> ResourceFinding | None:
    """A line that began rising part-way and rose to the end, above everything the readings before it
    reached: a line through the whole run fits such a hockey stick badly, and its residuals hide the rise.

    The part after the hinge is judged alone, with the whole run's noise as its floor (a few exactly
    collinear readings have no error of their own). Ending above every earlier reading by a share of their
    range keeps a sawtooth's last rise, and the slow drift after a cache filled, out."""
    hinge = hinge_step(shape.xs, shape.ys, t.late_from_share, t.late_until_share)
    start = None if hinge is None else next(i for i, x in enumerate(shape.xs) if x >= hinge)
    if start is None or start < 2 or len(shape.ys) - start < t.late_min_readings:
        return None
    xs, ys, earlier = shape.xs[start:], shape.ys[start:], shape.ys[:start]
    above_earlier = statistics.median(ys[-3:]) - max(earlier)
    clear_of_earlier = max(t.min_total_bytes, t.late_over_earlier_range * (max(earlier) - min(earlier)))
    if above_earlier < clear_of_earlier:  # checked before the fit: most series end below their earlier peak
        return None
    # it rose before as well: one line through the whole run tells it (`per_iteration`); two linear-time
    # slopes tell it before the robust fit of the part after the hinge
    rate_after = robust_slope(xs, ys) or 0.0
    rose_before = (robust_slope(shape.xs[:start], earlier) or 0.0) > t.late_earlier_of_rate * rate_after
    if rose_before and shape.fit.shows_leak(t.z_suspect):
        return None
    fit = fit_line(xs, ys, shape.noise, shape.max_points, t)
    if not (fit.shows_leak(t.z_suspect) and above_earlier >= t.late_shown_share * fit.total):
        return None
    verdict: VerdictName = "leak" if fit.shows_leak(t.z_leak) else "suspect"
    return shape.finding(verdict, "per-iteration", fit=fit, started_at=xs[0])


ShapeRule = Callable[[Shape, Thresholds], "ResourceFinding | None"]

#: the shape rules by their name in the verdict table, in the order they are tried
SHAPE_RULES: tuple[tuple[str, ShapeRule], ...] = (
    ("per-epoch", per_epoch), ("level-change", level_change), ("filled-then-flat", filled_then_flat),
    ("sporadic", sporadic),
    ("started-late", started_late), ("per-iteration", per_iteration), ("ramp-read-thinly", ramp_read_thinly),
)
