"""Leak verdicts from step-aligned memory series (pure: no I/O, no torch, no IPython).

For each resource the series is memory after each sampled step (of the loop's step clock) against the step index.

1. Warm-up: growth concentrated at the start (the optimizer's state at step 1, caches that fill
   over 5 or 50 steps) is cut off when a regular rest (flat or a steady leak, no jumps) follows
   for at least two thirds of the run; where later jumps make the rest irregular, only leading
   jumps far faster than the rest's own growth are.
2. Per-iteration leak: a Theil–Sen slope (median of pairwise slopes) after warm-up, significant
   against the series' own noise (a robust residual scale) *and* with a total growth that noise
   alone cannot make (`MIN_TOTAL_BYTES` and 6 noise scales).
3. Per-epoch leak: most of the growth happens across epoch boundaries (a validation pass that
   keeps its outputs) while the steps inside an epoch are flat: a staircase.
4. Sporadic leak: a few steps, spread over the run, carry the growth as jumps that never come
   back; they are named. A jump is judged against its step gap (thinned sampling reads every k-th
   step, and a steady leak grows k times its rate between two samples: that is no jump).
5. Not leaks: plateaus, sawtooth temporaries (they come back), CUDA reserved growing while
   allocated is flat (the caching allocator; said as a note).

The maths on one series (robust slopes, noise, jumps, the warm-up, a release at the end) is in
`slopes.py`; here are the rules that turn it into verdicts, and their wording.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core import resources
from ..core.model import VerdictName
from ..core.slopes import (
    changes_of,
    evenly_spaced,
    growth_stopped,
    hinge_step,
    mad,
    released_at_the_end,
    robust_slope,
    shows_fitted_growth,
    spread_over_run,
    theil_sen,
    warmup_length,
)
from .epochs import closes_last_epoch, crossing_epochs, flat_within_epochs, per_epoch_growth
from .findings import Diagnosis, Note, ResourceFinding, Series, note, readings_of
from .worker_growth import FIRST_TOUCH_BYTES_PER_WORKER, copy_on_access_projection, still_copying, workers_growth

MIB = 1 << 20
MIN_STEPS = 12  # sampled steps after warm-up needed for any verdict
MIN_TOTAL_BYTES = 2 * MIB  # growth below this over the window is never called a leak
FULL_SHARE = 0.98  # a reading this close to its limit is at it: the resource ran out
FILLED_FROM_SHARE = 0.5  # ... when it was below this share of the limit earlier in the run (it filled in the run)
Z_LEAK = 5.0  # slope / its standard error for "leak"
Z_SUSPECT = 3.0
FLAT_OF_RISE = 0.05  # readings within this share of the rise (or the noise) stay flat: the growth stopped
LATE_FROM_SHARE = 0.2  # growth that began part-way began this share of the steps in at the earliest...
LATE_UNTIL_SHARE = 0.9  # ... and this share at the latest
LATE_OVER_EARLIER_RANGE = 0.25  # ... and ends above all before it by this share of their range at least
LATE_EARLIER_OF_RATE = 0.25  # ... and rose before it at less than this share of its rate
RAMP_READINGS = 5  # jumps at this many readings in a row are a line sampled thinly, not sporadic jumps
LATE_MIN_READINGS = 6  # readings after it, at least (sampling thins out: 160 late steps may be 9 readings)
#: RSS growth is retention only where the heap in use grew by at least this share of it
HEAP_SHARE_OF_RSS = 0.5
#: priority when several resources leak: heap in use is retention itself; RSS may only be fragmentation
RESOURCE_ORDER = resources.leak_order(resources.RESOURCES)


def _ran_out_at(xs: Sequence[float], ys: Sequence[float], limit_bytes: float | None) -> int | None:
    """Index of the first reading at the limit, when the series filled up to it in this run and was still
    there at the end; else None.

    Past that point the series cannot grow: a full /dev/shm mount stays full until the workers die of
    it. Filled within a few steps (workers running ahead of a slow loop), it reads as a warm-up and a
    plateau, so it is judged by how it filled, not by a fit."""
    if not limit_bytes or len(ys) < 2 or ys[-1] < FULL_SHARE * limit_bytes:
        return None
    full = next(i for i, y in enumerate(ys) if y >= FULL_SHARE * limit_bytes)
    if full == 0 or min(ys[: full + 1]) > FILLED_FROM_SHARE * limit_bytes or xs[full] <= xs[0]:
        return None
    return full


@dataclass(frozen=True)
class _LineFit:
    """A robust line through a series: its slope and standard error, and whether its growth shows."""

    slope: float
    error: float
    total: float  # the line's growth over the series' steps
    big_enough: bool  # growth that noise alone cannot make, and that the late readings show too

    def shows_leak(self, z: float) -> bool:
        return self.big_enough and self.slope >= z * self.error


def _fit_line(xs: Sequence[float], ys: Sequence[float], noise: float, max_points: int) -> _LineFit:
    fit_xs, fit_ys = evenly_spaced(xs, ys)  # the fit weighs every stretch of steps alike
    slope, intercept = theil_sen(fit_xs, fit_ys, max_points)
    residual_scale = mad([y - (intercept + slope * x) for x, y in zip(fit_xs, fit_ys)])
    x_mean = statistics.fmean(fit_xs)
    spread = math.sqrt(sum((x - x_mean) ** 2 for x in fit_xs)) or 1.0
    error = max(residual_scale, noise, 1.0) / spread
    total = slope * (xs[-1] - xs[0])
    big_enough = total > max(MIN_TOTAL_BYTES, 6 * max(noise, residual_scale)) and shows_fitted_growth(xs, ys, slope)
    return _LineFit(slope, error, total, big_enough)


def _ran_out(series: Series, xs: Sequence[float], ys: Sequence[float]) -> ResourceFinding | None:
    """A resource that filled up to its limit in the run (where that is fatal): a leak at the rate it filled,
    whatever a fit would say of the plateau at the limit."""
    full = _ran_out_at(xs, ys, series.limit_bytes) if series.resource in _FATAL_WHEN_FULL else None
    if full is None:
        return None
    start = min(range(full + 1), key=lambda i: ys[i])
    fill = ys[full] - ys[start]
    rate = fill / max(xs[full] - xs[start], 1.0)
    return ResourceFinding(
        series.resource, "leak", "per-iteration", rate, None, 0, 0.0, fill, steps_to_exhaustion=0.0,
        net_growth_bytes=fill, full_at_step=xs[full],
    )


@dataclass(frozen=True)
class _Shape:
    """One resource's readings after its warm-up, with what the shape rules look at: the line's fit, the
    jumps, the readings where an epoch began, the growth over them."""

    series: Series
    xs: Sequence[float]
    ys: Sequence[float]
    warmup: int
    noise: float
    fit: _LineFit
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
                fit: _LineFit | None = None, started_at: float | None = None) -> ResourceFinding:
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


def _per_epoch(shape: _Shape) -> ResourceFinding | None:
    """A staircase: the growth comes where epochs begin, flat within them."""
    xs, ys, boundary, net = shape.xs, shape.ys, shape.boundary, shape.net
    boundary_growth = sum(ys[i] - ys[i - 1] for i in boundary)
    staircase = net > MIN_TOTAL_BYTES and len(boundary) >= 2 and boundary_growth > 0.7 * net
    if not (staircase and flat_within_epochs(xs, ys, boundary, net)):
        return None
    per_epoch, epoch_length = per_epoch_growth(xs, shape.epoch_steps, boundary, boundary_growth)
    # spread over the epoch's steps, for the exhaustion
    return shape.finding("leak", "per-epoch", slope=per_epoch / max(epoch_length, 1.0), per_epoch=per_epoch)


def _sporadic(shape: _Shape) -> ResourceFinding | None:
    """A few jumps, spread over the run, make the growth and nothing comes back (many up-jumps with as
    many falls is noise or a sawtooth)."""
    xs, ys, jumps, net = shape.xs, shape.ys, shape.jumps, shape.net
    jump_growth = sum(ys[i] - ys[i - 1] for i in jumps)
    sporadic_jumps = len(jumps) <= max(3, len(ys) // 5) and spread_over_run(xs, jumps)
    if not (sporadic_jumps and 0.7 * net < jump_growth < 1.5 * net and net > MIN_TOTAL_BYTES):
        return None
    # jumps at RAMP_READINGS readings in a row are a ramp sampled thinly (each reading many steps past the
    # last): judged as a line (one that stopped, began late, or runs through) where those rules can judge
    # it; else, with too few readings for that, still as jumps
    if any(later - first == RAMP_READINGS - 1 for first, later in zip(jumps, jumps[RAMP_READINGS - 1:])):
        as_line = _filled_then_flat(shape) or _started_late(shape) or _per_iteration(shape)
        if as_line is not None:
            return as_line
    # with thinned sampling a jump is only known to lie between two sampled steps; one that only the
    # reading after the block shows (it repeats the last step) lies in the last step
    ranges = tuple((min(int(xs[i - 1]) + 1, int(xs[i])), int(xs[i])) for i in jumps)
    # one rise is a level change (a cache filled late, an epoch's end temporaries the allocator kept):
    # only a rise that comes again is a leak
    return shape.finding("leak" if len(jumps) >= 2 else "suspect", "sporadic", slope=net / (xs[-1] - xs[0]),
                         sporadic=ranges)


def _filled_then_flat(shape: _Shape) -> ResourceFinding | None:
    """Growth that stopped: a rise (a cache or memo filling, bounded by the data), then flat within noise
    to the end over at least as many steps as the rise took. Clean: only growth that goes on is a leak."""
    stopped = growth_stopped(shape.xs, shape.ys, shape.noise, FLAT_OF_RISE, LATE_MIN_READINGS)
    return shape.finding("clean", None, slope=0.0) if stopped else None


def _per_iteration(shape: _Shape) -> ResourceFinding | None:
    """A line that rises with the steps, clear of the noise."""
    if not shape.fit.shows_leak(Z_SUSPECT):
        return None
    return shape.finding("leak" if shape.fit.shows_leak(Z_LEAK) else "suspect", "per-iteration")


def _started_late(shape: _Shape) -> ResourceFinding | None:
    """A line that began rising part-way and rose to the end, above everything the readings before it
    reached: a line through the whole run fits such a hockey stick badly, and its residuals hide the rise.

    The part after the hinge is judged alone, with the whole run's noise as its floor (a few exactly
    collinear readings have no error of their own). Ending above every earlier reading by a share of their
    range keeps a sawtooth's last rise, and the slow drift after a cache filled, out."""
    hinge = hinge_step(shape.xs, shape.ys, LATE_FROM_SHARE, LATE_UNTIL_SHARE)
    start = None if hinge is None else next(i for i, x in enumerate(shape.xs) if x >= hinge)
    if start is None or start < 2 or len(shape.ys) - start < LATE_MIN_READINGS:
        return None
    xs, ys, earlier = shape.xs[start:], shape.ys[start:], shape.ys[:start]
    above_earlier = statistics.median(ys[-3:]) - max(earlier)
    clear_of_earlier = max(MIN_TOTAL_BYTES, LATE_OVER_EARLIER_RANGE * (max(earlier) - min(earlier)))
    if above_earlier < clear_of_earlier:  # checked before the fit: most series end below their earlier peak
        return None
    # it rose before as well: one line through the whole run tells it (`_per_iteration`); two linear-time
    # slopes tell it before the robust fit of the part after the hinge
    rose_before = (robust_slope(shape.xs[:start], earlier) or 0.0) > LATE_EARLIER_OF_RATE * (robust_slope(xs, ys) or 0.0)
    if rose_before and shape.fit.shows_leak(Z_SUSPECT):
        return None
    fit = _fit_line(xs, ys, shape.noise, shape.max_points)
    if not (fit.shows_leak(Z_SUSPECT) and above_earlier >= 0.5 * fit.total):
        return None
    verdict: VerdictName = "leak" if fit.shows_leak(Z_LEAK) else "suspect"
    return shape.finding(verdict, "per-iteration", fit=fit, started_at=xs[0])


#: the shapes of growth a resource is judged by, in order: the first that finds one gives the verdict
#: (clean where none does); each can be read, tested and switched off alone
SHAPE_RULES: tuple[Callable[[_Shape], ResourceFinding | None], ...] = (
    _per_epoch, _sporadic, _filled_then_flat, _started_late, _per_iteration)


def analyse(
    series: Series, epoch_steps: Sequence[float] = (), max_points: int = 200, ends_after_block: bool = False
) -> ResourceFinding:
    """The verdict for one resource (`max_points` bounds the Theil–Sen cost: ~n²/2 slopes): ran out at its
    limit, else the first of SHAPE_RULES that finds growth, else clean.

    `ends_after_block`: the last reading was taken after the block, so its interval also holds what ran
    after the last step."""
    xs, ys = readings_of(series)
    ran_out = _ran_out(series, xs, ys)
    if ran_out is not None:
        return ran_out
    released = released_at_the_end(ys)
    if released:
        xs, ys = xs[:-1], ys[:-1]
    whole = changes_of(xs, ys) if len(ys) > MIN_STEPS else None
    warmup = warmup_length(xs, ys, whole) if whole is not None else 0
    xs, ys = xs[warmup:], ys[warmup:]
    if len(ys) < MIN_STEPS:
        return ResourceFinding(series.resource, "unknown", None, None, None, warmup, 0.0, 0.0, released_bytes=released)
    changes = whole if whole is not None and warmup == 0 else changes_of(xs, ys)  # once, where nothing was cut
    boundary = crossing_epochs(xs, epoch_steps)
    if ends_after_block and not released and epoch_steps and closes_last_epoch(ys, boundary):
        boundary.add(len(ys) - 1)
    shape = _Shape(series, xs, ys, warmup, changes.noise, _fit_line(xs, ys, changes.noise, max_points),
                   list(changes.jumps), boundary, released, tuple(epoch_steps), max_points)
    found = (rule(shape) for rule in SHAPE_RULES)
    return next((f for f in found if f is not None), None) or shape.finding("clean", None)


#: the resources for which a reading at the limit means the run ran out of it
_FATAL_WHEN_FULL = frozenset(r.key for r in resources.RESOURCES if r.full_is_fatal)
#: what a resource's leak is reported as, where that is another resource (reserved VRAM as VRAM)
_REPORTED_AS = {r.key: r.reported for r in resources.RESOURCES}


@dataclass
class _Evidence:
    """What the rules that explain growth away read: each resource's series and finding, and the workers'."""

    series: dict[str, Series]
    findings: dict[str, ResourceFinding]
    worker_epochs: Sequence[float]  # where the DataLoader workers start again (none: persistent workers)
    worker_count: int
    first_pass_steps: tuple[int, int] | None

    def grew(self, resource: str) -> float:
        """Last reading minus first of a resource, over the whole run."""
        _, ys = readings_of(self.series[resource])
        return ys[-1] - ys[0] if ys else 0.0

    @functools.cached_property
    def workers_added(self) -> float | None:
        """What the DataLoader workers added, where it is theirs: the kernel's heap explains little of it
        (flat, or a small fraction) and it is more than their first touches of the parent's pages."""
        workers, heap = self.findings.get("workers"), self.findings.get("heap")
        added = workers_growth(self.series["workers"], self.worker_epochs) if workers else 0.0
        heap_aside = heap is not None and (heap.verdict == "clean" or heap.net_growth_bytes < 0.25 * added)
        return added if workers and heap_aside and added >= FIRST_TOUCH_BYTES_PER_WORKER * max(1, self.worker_count) else None


@dataclass(frozen=True)
class _Explained:
    """What a rule says of the run: a note for the advice, resources whose growth it explains (no leak of
    theirs), and a finding that takes a resource's place (the workers still copying: the tree's leak)."""

    note: Note | None = None
    not_leaks: frozenset[str] = frozenset()
    instead: ResourceFinding | None = None


def _caching_allocator(e: _Evidence) -> _Explained | None:
    """CUDA reserved memory grows while allocated memory is flat: the caching allocator keeps it."""
    reserved, allocated = e.findings.get("vram_reserved"), e.findings.get("vram")
    if reserved and allocated and reserved.verdict in ("leak", "suspect") and allocated.verdict == "clean":
        return _Explained(note("caching allocator"))
    return None


def _copy_on_access(e: _Evidence) -> _Explained | None:
    """Workers copying a dataset page by page as they read it: bounded once every page was touched (the
    note says where it stays); while it still goes on, the process tree's leak (the OOM killer counts the
    workers' memory)."""
    added = e.workers_added
    if added is None:
        return None
    workers = e.findings["workers"]
    # "unknown": too few PSS readings for the detector, one short epoch
    still = still_copying(e.series["workers"], e.worker_epochs) if workers.verdict != "clean" else None
    projection = copy_on_access_projection(e.series["workers"], workers, e.first_pass_steps)
    said = note("copy on access", added_bytes=added, **projection)
    return _Explained(said, frozenset({"ram"}) if still is not None else frozenset(), still)


def _allocator_keeps_rss(e: _Evidence) -> _Explained | None:
    """RSS growth that is no retention: the heap in use is flat, or is no leak (too few steps past its
    warm-up, or only suspect) and grew far less than RSS over the run (the allocator kept the rest)."""
    heap, rss = e.findings.get("heap"), e.findings.get("rss") or e.findings.get("ram")
    if heap is None or not (heap.verdict == "clean" or (
        heap.verdict != "leak" and rss is not None and e.grew("heap") < HEAP_SHARE_OF_RSS * e.grew(rss.resource)
    )):
        return None
    said = rss is not None and rss.verdict == "leak" and e.workers_added is None  # else the workers' note says it
    return _Explained(note("allocator keeps RSS", heap_flat=heap.verdict == "clean") if said else None, frozenset({"ram"}))


#: the rules that explain growth away, in the order their notes are given; each can be read, tested and
#: switched off alone
EXPLAINING_RULES: tuple[Callable[[_Evidence], _Explained | None], ...] = (
    _caching_allocator, _copy_on_access, _allocator_keeps_rss,
)


def _leaking(findings: dict[str, ResourceFinding], explained: Sequence[_Explained]) -> ResourceFinding | None:
    """The leaking resource: the first leak (else suspect) in RESOURCE_ORDER that no rule explained; a rule's
    finding instead of one (the workers still copying) where it says more."""
    not_leaks = frozenset().union(*(x.not_leaks for x in explained))
    chosen = None
    for name in RESOURCE_ORDER:
        f = findings.get(name)
        if f is None or f.verdict not in ("leak", "suspect") or name in not_leaks:
            continue
        if chosen is None or (chosen.verdict == "suspect" and f.verdict == "leak"):
            chosen = f
    for instead in (x.instead for x in explained if x.instead is not None):
        if chosen is None or (chosen.verdict == "suspect" and instead.verdict == "leak"):
            chosen = instead
    return chosen


def _too_few_steps(findings: Sequence[ResourceFinding], clock: str) -> Note:
    warm = max((f.warmup_steps for f in findings), default=0)
    return note("too few steps", needs=MIN_STEPS + warm, clock=clock)


def _headline(chosen: ResourceFinding, clock: str) -> Note:
    """The leak, its kind, resource and rate (a sporadic leak's steps, a per-epoch leak's epochs)."""
    return note("leak", leak_kind=chosen.leak_kind, resource=chosen.resource, per_step_bytes=chosen.per_step_bytes or 0,
                error_bytes=chosen.per_step_error_bytes, per_epoch_bytes=chosen.per_epoch_bytes,
                sporadic_steps=chosen.sporadic_steps, started_at_step=chosen.started_at_step, clock=clock)


def _when_it_runs_out(chosen: ResourceFinding, clock: str, seconds: float | None) -> list[Note]:
    """When the leaking resource runs out (or since when it was full), and what the block's end gave back."""
    rate, notes = chosen.per_step_bytes or 0, []
    if chosen.full_at_step is not None:
        notes.append(note("full since", resource=chosen.resource, full_at_step=chosen.full_at_step,
                          per_step_bytes=rate, clock=clock))
    elif chosen.steps_to_exhaustion is not None:
        notes.append(note("runs out in", resource=chosen.resource, per_step_bytes=rate,
                          steps=chosen.steps_to_exhaustion, seconds=seconds if clock != "time" else None, clock=clock))
    if chosen.released_bytes:
        notes.append(note("released at the end", released_bytes=chosen.released_bytes))
    return notes


def decide(
    series: Sequence[Series],
    epoch_steps: Sequence[float] = (),
    steps_per_s: float | None = None,
    max_points: int = 200,
    first_pass_steps: tuple[int, int] | None = None,
    clock: str = "optimizer",
    worker_count: int = 1,
    workers_persistent: bool = False,
    ends_after_block: bool = False,
) -> Diagnosis:
    """The run's verdict from every resource's series: each judged alone (`analyse`), the EXPLAINING_RULES
    applied in order, then the leaking resource chosen and worded.

    Args:
        series: step-aligned series ("heap", "ram" (process tree), "rss" (kernel alone), "workers", "vram",
            "vram_reserved", "shm"). Only heap, vram, ram and shm can be the leaking resource.
        epoch_steps: step counts at which each epoch (DataLoader iterator) started.
        steps_per_s: to turn steps until exhaustion into wall-clock time.
        first_pass_steps: (first, last) step of a multi-worker DataLoader's first pass, to project
            where copy-on-access growth will stop.
        clock: what a step is ("optimizer", "batch", ..., "time": x is seconds), for the wording.
        worker_count: the most DataLoader workers seen at once (their first touches are bounded by their number).
        workers_persistent: the same workers ran through every epoch (no more of them seen than at once): their
            growth is judged over the whole run, not epoch by epoch (an epoch may hold one PSS reading or none).
        ends_after_block: the last row is the reading after the block (the final report), not a step's.
    """
    by_resource = {s.resource: s for s in series}
    findings = {name: analyse(s, epoch_steps, max_points, ends_after_block) for name, s in by_resource.items()}
    evidence = _Evidence(by_resource, findings, () if workers_persistent else epoch_steps, worker_count, first_pass_steps)
    explained = [x for x in (rule(evidence) for rule in EXPLAINING_RULES) if x is not None]
    advice = [x.note for x in explained if x.note is not None]
    chosen = _leaking(findings, explained)
    if chosen is None:
        relevant = [f for f in findings.values() if f.resource in RESOURCE_ORDER]
        verdict: VerdictName = "unknown" if all(f.verdict == "unknown" for f in relevant) else "clean"
        if verdict == "unknown":  # also when no step was sampled at all
            advice.insert(0, _too_few_steps(relevant, clock))
        return Diagnosis(verdict, None, None, None, None, None, None, tuple(advice), tuple(findings.values()))
    seconds = None
    if chosen.steps_to_exhaustion is not None and steps_per_s:
        seconds = chosen.steps_to_exhaustion / steps_per_s
    advice[:0] = [_headline(chosen, clock), *_when_it_runs_out(chosen, clock, seconds)]
    return Diagnosis(
        chosen.verdict, chosen.leak_kind, _REPORTED_AS.get(chosen.resource, chosen.resource),
        chosen.per_step_bytes, chosen.per_step_error_bytes, chosen.steps_to_exhaustion, seconds,
        tuple(advice), tuple(findings.values()), chosen.per_epoch_bytes,
    )
