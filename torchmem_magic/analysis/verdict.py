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

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core import resources
from ..core.model import VerdictName
from ..core.slopes import (
    changes_of,
    evenly_spaced,
    mad,
    released_at_the_end,
    shows_fitted_growth,
    spread_over_run,
    theil_sen,
    warmup_length,
)
from ..core.units import format_bytes, format_duration, plural_noun, rate_unit, singular_noun

MIB = 1 << 20
MIN_STEPS = 12  # sampled steps after warm-up needed for any verdict
MIN_TOTAL_BYTES = 2 * MIB  # growth below this over the window is never called a leak
FULL_SHARE = 0.98  # a reading this close to its limit is at it: the resource ran out
FILLED_FROM_SHARE = 0.5  # ... when it was below this share of the limit earlier in the run (it filled in the run)
Z_LEAK = 5.0  # slope / its standard error for "leak"
Z_SUSPECT = 3.0
#: a staircase's epochs are flat inside: their own steps grow less than this share of the net growth
WITHIN_EPOCH_SHARE = 0.3
#: a forked worker copies pages of the parent's heap as refcounts and the collector first touch them, a
#: rise at its start that stops once touched (~11 MiB each measured in a kernel); workers' growth below
#: this much per worker is that first touch, not a dataset copied
FIRST_TOUCH_BYTES_PER_WORKER = 16 * MIB
#: copying still goes on when the late half of the current workers' readings grew at least this share of
#: their average rate, and by at least STILL_COPYING_MIN_BYTES (a first touch's tail moves a few KiB)
STILL_COPYING_SHARE = 0.3
STILL_COPYING_MIN_BYTES = 4 * MIB
#: RSS growth is retention only where the heap in use grew by at least this share of it
HEAP_SHARE_OF_RSS = 0.5
#: priority when several resources leak: heap in use is retention itself; RSS may only be fragmentation
RESOURCE_ORDER = resources.leak_order(resources.RESOURCES)


@dataclass(frozen=True)
class Series:
    """One resource's step-aligned samples: steps (x) and bytes (y), plus what the limit is."""

    resource: str  # "heap", "ram", "vram", "vram_reserved", "shm"
    steps: Sequence[float]
    values: Sequence[float]
    limit_bytes: float | None = None  # exhaustion point (RAM limit, device memory, /dev/shm size)


@dataclass(frozen=True)
class ResourceFinding:
    resource: str
    verdict: VerdictName
    leak_kind: str | None
    per_step_bytes: float | None
    per_step_error_bytes: float | None
    warmup_steps: int
    noise_bytes: float
    total_growth_bytes: float
    sporadic_steps: tuple[tuple[int, int], ...] = ()  # (first, last) step each jump may have happened at
    steps_to_exhaustion: float | None = None
    net_growth_bytes: float = 0.0  # last minus first value after warm-up
    per_epoch_bytes: float | None = None  # a staircase's growth per epoch
    released_bytes: float = 0.0  # what the last reading gave back, left out of the judgement (see `released_at_the_end`)
    full_at_step: float | None = None  # the first step whose reading was at the limit (see `_ran_out_at`)


@dataclass(frozen=True)
class Diagnosis:
    """The run's verdict: the leaking resource (if any), its rate, when it runs out, and why."""

    verdict: VerdictName
    leak_kind: str | None
    resource: str | None
    per_step_bytes: float | None
    per_step_error_bytes: float | None
    steps_to_exhaustion: float | None
    seconds_to_exhaustion: float | None
    advice: tuple[str, ...]
    findings: tuple[ResourceFinding, ...] = field(default=())
    per_epoch_bytes: float | None = None

    @property
    def sporadic_steps(self) -> tuple[tuple[int, int], ...]:
        chosen = next((f for f in self.findings if f.leak_kind == "sporadic" and f.resource == self.resource), None)
        return () if chosen is None else chosen.sporadic_steps


def _clean(series: Series) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for x, y in zip(series.steps, series.values):
        if not (math.isnan(x) or math.isnan(y)):
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys


def _crossing_epochs(xs: Sequence[float], epoch_steps: Sequence[float]) -> set[int]:
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


def _closes_last_epoch(ys: Sequence[float], boundary: set[int]) -> bool:
    """Whether the last interval, up to the reading after the block, is the last epoch's end: the block's
    end closes that epoch, and what runs after its last step (a validation pass, outputs kept per epoch)
    is read only there. It counts when it grew like the other epochs' ends, by a quarter of their mean."""
    last = len(ys) - 1
    others = [i for i in boundary if i != last]
    if last < 1 or not others:
        return False
    mean_growth = sum(ys[i] - ys[i - 1] for i in others) / len(others)
    return mean_growth > 0 and ys[last] - ys[last - 1] > 0.25 * mean_growth


def _flat_within_epochs(xs: Sequence[float], ys: Sequence[float], boundary: set[int], net: float) -> bool:
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


def analyse(
    series: Series, epoch_steps: Sequence[float] = (), max_points: int = 200, ends_after_block: bool = False
) -> ResourceFinding:
    """The verdict for one resource (`max_points` bounds the Theil–Sen cost: ~n²/2 slopes).

    `ends_after_block`: the last reading was taken after the block, so its interval also holds what ran
    after the last step."""
    xs, ys = _clean(series)
    full = _ran_out_at(xs, ys, series.limit_bytes) if series.resource in _FATAL_WHEN_FULL else None
    if full is not None:
        start = min(range(full + 1), key=lambda i: ys[i])
        fill = ys[full] - ys[start]
        rate = fill / max(xs[full] - xs[start], 1.0)
        return ResourceFinding(
            series.resource, "leak", "per-iteration", rate, None, 0, 0.0, fill, steps_to_exhaustion=0.0,
            net_growth_bytes=fill, full_at_step=xs[full],
        )
    released = released_at_the_end(ys)
    if released:
        xs, ys = xs[:-1], ys[:-1]
    whole = changes_of(xs, ys) if len(ys) > MIN_STEPS else None
    warmup = warmup_length(xs, ys, whole) if whole is not None else 0
    xs, ys = xs[warmup:], ys[warmup:]
    if len(ys) < MIN_STEPS:
        return ResourceFinding(series.resource, "unknown", None, None, None, warmup, 0.0, 0.0, released_bytes=released)
    changes = whole if whole is not None and warmup == 0 else changes_of(xs, ys)  # once, where nothing was cut
    rate, noise = changes.rate, changes.noise
    fit = _fit_line(xs, ys, noise, max_points)
    slope, error, total = fit.slope, fit.error, fit.total
    jumps = list(changes.jumps)
    jump_growth = sum(ys[i] - ys[i - 1] for i in jumps)
    boundary = _crossing_epochs(xs, epoch_steps)
    if ends_after_block and not released and epoch_steps and _closes_last_epoch(ys, boundary):
        boundary.add(len(ys) - 1)
    boundary_growth = sum(ys[i] - ys[i - 1] for i in boundary)
    net = ys[-1] - ys[0]

    def finding(
        verdict: VerdictName, kind: str | None, sporadic: tuple[tuple[int, int], ...] = (), per_epoch: float | None = None
    ) -> ResourceFinding:
        exhaustion = None
        if verdict in ("leak", "suspect") and series.limit_bytes and slope > 0:
            exhaustion = max(0.0, (series.limit_bytes - ys[-1]) / slope)
        return ResourceFinding(
            series.resource, verdict, kind, slope, error, warmup, noise, total, sporadic, exhaustion, net, per_epoch,
            released,
        )

    if net > MIN_TOTAL_BYTES and len(boundary) >= 2 and boundary_growth > 0.7 * net:
        if _flat_within_epochs(xs, ys, boundary, net):
            starts = sorted({e for e in epoch_steps if xs[0] <= e <= xs[-1]})  # train + val loaders: one start
            epoch_length = statistics.median(b - a for a, b in zip(starts, starts[1:])) if len(starts) > 1 else xs[-1] - xs[0]
            per_epoch = boundary_growth / _epochs_crossed(xs, starts, boundary)
            slope = per_epoch / max(epoch_length, 1.0)  # spread over the epoch's steps, for the exhaustion
            return finding("leak", "per-epoch", per_epoch=per_epoch)
    # the jumps make the growth and nothing comes back: many up-jumps with as many falls is noise or sawtooth
    sporadic_jumps = len(jumps) <= max(3, len(ys) // 5) and spread_over_run(xs, jumps)
    if sporadic_jumps and 0.7 * net < jump_growth < 1.5 * net and net > MIN_TOTAL_BYTES:
        # with thinned sampling a jump is only known to lie between two sampled steps; one that only the
        # reading after the block shows (it repeats the last step) lies in the last step
        ranges = tuple((min(int(xs[i - 1]) + 1, int(xs[i])), int(xs[i])) for i in jumps)
        slope = net / (xs[-1] - xs[0])
        # one rise is a level change (a cache filled late, an epoch's end temporaries the allocator kept):
        # only a rise that comes again is a leak
        return finding("leak" if len(jumps) >= 2 else "suspect", "sporadic", ranges)
    if fit.shows_leak(Z_SUSPECT):
        return finding("leak" if fit.shows_leak(Z_LEAK) else "suspect", "per-iteration")
    return finding("clean", None)


#: the resources for which a reading at the limit means the run ran out of it
_FATAL_WHEN_FULL = frozenset(r.key for r in resources.RESOURCES if r.full_is_fatal)
_KILLED_BY = {r.key: r.runs_out for r in resources.RESOURCES if r.leak_rank is not None}
#: what a resource's leak is reported as, where that is another resource (reserved VRAM as VRAM)
_REPORTED_AS = {r.key: r.reported for r in resources.RESOURCES}


def _run_growth(series: Series) -> float:
    """Last reading minus first, over the whole run."""
    _, ys = _clean(series)
    return ys[-1] - ys[0] if ys else 0.0


def _workers_growth(series: Series, epoch_steps: Sequence[float] = ()) -> float:
    """What the workers added, warm-up included (what copying a dataset page by page adds): the most
    any one epoch's workers added, last reading minus first (workers that are not persistent start
    again each epoch, so the run's first and last readings belong to different processes)."""
    xs, ys = _clean(series)
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


def _still_copying(series: Series, epoch_steps: Sequence[float] = ()) -> ResourceFinding | None:
    """Workers whose memory was still rising in the late half of their readings: a leak of the process
    tree while it goes on, at the current workers' average rate since their first reading (copying
    pages slows down as fewer are left, so a fitted slope of the early readings would overstate it;
    PSS is read only a few times a second, often too few readings for the detector).

    Copy-on-access goes on with the batches read; a first touch stops once the pages are touched. So the
    rise is judged over the current workers (from the last epoch's start: workers that are not
    persistent start again each epoch, and so does their first touch), in the late half of their readings."""
    xs, ys = _clean(series)
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


def _copy_on_access_projection(
    series: Series, finding: ResourceFinding, first_pass: tuple[int, int] | None
) -> str:
    """Where the workers' memory ends up once the first pass has touched the whole dataset."""
    xs, ys = _clean(series)
    if first_pass is None or not ys:
        return ""
    first, last = first_pass
    now = xs[-1]
    if now >= last:
        return f" The first pass is complete: the workers should stay near {format_bytes(ys[-1])}."
    if not finding.per_step_bytes:
        return ""
    projected = ys[-1] + finding.per_step_bytes * (last - now)
    return f" Projected: ~{format_bytes(projected)} for the workers by the end of the first pass (step {last})."


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
    """The run's verdict from every resource's series, plus the leak finder's evidence.

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
    unit, steps_word = rate_unit(clock), plural_noun(clock)
    by_resource = {s.resource: s for s in series}
    findings = {name: analyse(s, epoch_steps, max_points, ends_after_block) for name, s in by_resource.items()}
    advice: list[str] = []
    reserved, allocated = findings.get("vram_reserved"), findings.get("vram")
    if reserved and allocated and reserved.verdict in ("leak", "suspect") and allocated.verdict == "clean":
        advice.append(
            "CUDA reserved memory grows while allocated memory is flat: that is the caching allocator "
            "(or fragmentation), not a leak. torch.cuda.empty_cache() returns it; "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation."
        )
    heap, rss, workers = findings.get("heap"), findings.get("rss") or findings.get("ram"), findings.get("workers")
    # the heap in use says whether RSS growth is retention: not where it is flat, nor where it is no leak
    # (too few steps past its warm-up, or only suspect) and grew far less than RSS over the run: RSS then
    # grew by what the allocator kept
    rss_not_retention = heap is not None and (heap.verdict == "clean" or (
        heap.verdict != "leak" and rss is not None
        and _run_growth(by_resource["heap"]) < HEAP_SHARE_OF_RSS * _run_growth(by_resource[rss.resource])
    ))
    copy_on_access = None
    worker_epochs = () if workers_persistent else epoch_steps  # where the workers start again
    workers_growth = _workers_growth(by_resource["workers"], worker_epochs) if workers else 0.0
    # the kernel's heap explains little of it: flat, or a small fraction of what the workers added
    heap_aside = heap is not None and (heap.verdict == "clean" or heap.net_growth_bytes < 0.25 * workers_growth)
    if workers and heap_aside and workers_growth >= FIRST_TOUCH_BYTES_PER_WORKER * max(1, worker_count):
        # growth that stopped after the first pass is bounded (the advice says where it stays); growth
        # still going on is the process tree's leak: the OOM killer counts the workers' memory
        if workers.verdict != "clean":  # "unknown": too few PSS readings for the detector, one short epoch
            copy_on_access = _still_copying(by_resource["workers"], worker_epochs)
        advice.append(
            f"DataLoader workers' memory grew by {format_bytes(workers_growth)} (by PSS) while "
            "the kernel's heap stayed nearly flat: workers copying a dataset of Python objects page by page as they read "
            "it (copy-on-access) grows until every worker has touched everything; numpy/torch arrays (or "
            "np.frombuffer / pyarrow for strings) avoid it. Where the dataset holds arrays already, the workers' "
            "garbage collector copied the pages of the notebook's other objects once: gc.freeze() just before "
            "the loop avoids that."
            + _copy_on_access_projection(by_resource["workers"], workers, first_pass_steps)
        )
    elif rss and rss.verdict == "leak" and heap is not None and rss_not_retention:
        advice.append(
            f"RSS grows while the heap in use {'is flat' if heap.verdict == 'clean' else 'grew far less'}: "
            "not memory your objects hold, but freed memory the "
            "allocator keeps (fragmentation) or libraries and buffers loaded on first use. The first kind "
            "comes back with ctypes.CDLL('libc.so.6').malloc_trim(0) (the 'return heap to OS' button)."
        )
    chosen = None
    for name in RESOURCE_ORDER:
        f = findings.get(name)
        if f is None or f.verdict not in ("leak", "suspect"):
            continue
        if name == "ram" and (copy_on_access is not None or rss_not_retention):
            continue  # explained above: fragmentation or the workers' copy-on-access
        if chosen is None or (chosen.verdict == "suspect" and f.verdict == "leak"):
            chosen = f
    if copy_on_access is not None and (chosen is None or (chosen.verdict == "suspect" and copy_on_access.verdict == "leak")):
        chosen = copy_on_access
    relevant = [f for f in findings.values() if f.resource in RESOURCE_ORDER]
    if chosen is None:
        if all(f.verdict == "unknown" for f in relevant):  # also when no step was sampled at all
            warm = max((f.warmup_steps for f in relevant), default=0)
            needs = MIN_STEPS + warm
            advice.insert(0, f"too few {steps_word} for a verdict: needs at least {needs} sampled {steps_word}"
                          if clock != "time" else f"too short for a verdict: needs at least {needs} samples")
            return Diagnosis("unknown", None, None, None, None, None, None, tuple(advice), tuple(findings.values()))
        return Diagnosis("clean", None, None, None, None, None, None, tuple(advice), tuple(findings.values()))
    seconds = None
    if chosen.steps_to_exhaustion is not None and steps_per_s:
        seconds = chosen.steps_to_exhaustion / steps_per_s
    rate = f"{format_bytes(chosen.per_step_bytes or 0)}/{unit}"
    if chosen.per_epoch_bytes is not None:
        headline = f"{chosen.leak_kind} leak in {chosen.resource}: {format_bytes(chosen.per_epoch_bytes)} per epoch"
    else:
        error = chosen.per_step_error_bytes
        headline = f"{chosen.leak_kind} leak in {chosen.resource}: {rate}" + (
            f" ± {format_bytes(error)}" if chosen.leak_kind == "per-iteration" and error is not None else ""
        )
    if chosen.sporadic_steps:
        named = [str(b) if a == b else f"{a}–{b}" for a, b in chosen.sporadic_steps[:10]]
        headline += f", at {'seconds' if clock == 'time' else steps_word} {', '.join(named)}"
    advice.insert(0, headline)
    if chosen.full_at_step is not None:
        at = f"{singular_noun(clock)} {chosen.full_at_step:,.0f}"
        advice.insert(1, f"it was at its limit from {at} on (it filled at {rate}), where "
                         f"{_KILLED_BY.get(chosen.resource, 'it runs out')}")
    elif chosen.steps_to_exhaustion is not None:
        if clock == "time":
            when = f"~{format_duration(chosen.steps_to_exhaustion, rough=True)}"
        else:
            when = f"~{chosen.steps_to_exhaustion:,.0f} {steps_word}" + (
                f" (~{format_duration(seconds, rough=True)})" if seconds else ""
            )
        advice.insert(1, f"at {rate} {_KILLED_BY.get(chosen.resource, 'it runs out')} in {when}")
    if chosen.released_bytes:
        advice.insert(2 if chosen.steps_to_exhaustion is not None else 1, (
            f"{format_bytes(chosen.released_bytes)} of it came back when the block ended: what held it was freed "
            "after the loop or went out of scope (a list local to a function that returned); the loop itself "
            "grows it at this rate"
        ))
    verdict = chosen.verdict
    return Diagnosis(
        verdict, chosen.leak_kind, _REPORTED_AS.get(chosen.resource, chosen.resource),
        chosen.per_step_bytes, chosen.per_step_error_bytes, chosen.steps_to_exhaustion, seconds,
        tuple(advice), tuple(findings.values()), chosen.per_epoch_bytes,
    )
