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
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from . import resources
from .model import VerdictName
from .units import format_bytes, format_duration, plural_noun, rate_unit

MIB = 1 << 20
MIN_STEPS = 12  # sampled steps after warm-up needed for any verdict
MIN_TOTAL_BYTES = 2 * MIB  # growth below this over the window is never called a leak
Z_LEAK = 5.0  # slope / its standard error for "leak"
Z_SUSPECT = 3.0
COPY_ON_ACCESS_MIN_BYTES = 16 * MIB  # workers' growth below this is page-cache noise, not a dataset copied
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


def _mad(values: Sequence[float]) -> float:
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


JUMP_MIN_BYTES = 256 * 1024  # a level change below this is never a jump nor a warm-up worth cutting
JUMP_NOISE_SCALES = 8.0  # a jump rises this many noise scales beyond the typical rate's growth
JUMP_OVER_RATE = 2.0  # ... and more than twice what the typical rate grows over its step gap
PERSISTENCE_POINTS = 5  # points each side of a jump whose medians tell whether its level holds
RELEASE_OF_SPREAD = 0.5  # a fall at the last reading this big a share of the series' spread...
PATTERN_OF_RELEASE = 0.25  # ...with no earlier fall this big a share of it: the block's end releasing
REST_FRACTION = 2 / 3  # a warm-up leaves a regular rest spanning at least this share of the run's steps
LEVEL_NOISE_SCALES = 4.0  # a point this far below the rest's line is still warming up
LEADING_JUMP_SPEEDUP = 10.0  # a leading jump grows this many times faster than the rest: warm-up


def _noise(xs: Sequence[float], ys: Sequence[float], rate: float = 0.0) -> float:
    """A robust scale of sample-to-sample noise: MAD of the growth beyond `rate` per interval / sqrt(2).

    Measured beyond the rate so that thinned sampling (an interval of 70 steps grows 70 times a
    one-step interval) is not mistaken for noise."""
    return _mad(_excess_growth(xs, ys, rate)) / math.sqrt(2)


def _excess_growth(xs: Sequence[float], ys: Sequence[float], rate: float) -> list[float]:
    """Each interval's growth beyond `rate` times its step gap (entry i-1: from point i-1 to i)."""
    return [(y1 - y0) - rate * (x1 - x0) for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:])]


def _typical_rate(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The growth rate of the typical step: the median step-to-step change where the series has enough
    of them, else the median of the intervals' rates, each weighted by its steps.

    Weighting by steps lets a thinned stretch count for the steps it covers; a median lets a few
    jumps or temporaries (a minority of the steps) leave it alone, unlike a fitted slope."""
    single = sorted(y1 - y0 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]) if x1 - x0 == 1)
    if len(single) >= 2 * MIN_STEPS:
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


def _persistent_jumps(xs: Sequence[float], ys: Sequence[float], noise: float, rate: float) -> list[int]:
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
    margin = max(LEVEL_NOISE_SCALES * _noise(xs[fit_from:], ys[fit_from:], rate), JUMP_MIN_BYTES)
    return level, statistics.median(level[fit_from:]) - margin


def _holds_from(level: Sequence[float], floor: float, i: int) -> bool:
    """Whether the series sits on the line from point i on (a median, so one temporary does not count)."""
    return statistics.median(level[i : i + PERSISTENCE_POINTS]) >= floor


def _rise_before_rest(xs: Sequence[float], ys: Sequence[float], rest: int) -> int:
    """Points before the series reaches its rest's line for good (0: it never lies below it).

    A first line, fitted to the last REST_FRACTION of the steps, only says roughly where the series
    reaches it: with thinned sampling that end has few points, far from the dense start. The line is
    refitted from there on, and the warm-up ends after the last point below it. A rise that goes on
    into the rest is no warm-up."""
    level, floor = _line_floor(xs, ys, rest)
    reached = next((i for i in range(rest) if _holds_from(level, floor, i)), rest)
    level, floor = _line_floor(xs, ys, reached)
    cut = next((i + 1 for i in range(rest - 1, -1, -1) if level[i] < floor), 0)
    return cut if cut == 0 or _holds_from(level, floor, cut) else 0


def _leading_jumps(xs: Sequence[float], ys: Sequence[float], jumps: Sequence[int], rest: int) -> int:
    """Points before the rest that carry jumps far faster than the rest grows on average.

    When later jumps make the rest irregular, only a rise at the start that dwarfs the run's own
    growth (the optimizer's state at its first step) is told apart as warm-up."""
    end_level = statistics.median(ys[-PERSISTENCE_POINTS:])
    cut = 0
    for j in jumps:
        if j >= rest:
            break
        rest_rate = max(0.0, (end_level - ys[j]) / max(xs[-1] - xs[j], 1e-9))
        if ys[j] - ys[cut] <= LEADING_JUMP_SPEEDUP * rest_rate * (xs[j] - xs[cut]):
            break
        cut = j
    return cut


def warmup_length(xs: Sequence[float], ys: Sequence[float]) -> int:
    """Points to drop at the start: growth concentrated early, however many steps it took.

    The warm-up ends where the series reaches the line of its rest (flat or a steady leak) for good,
    when that rest spans at least REST_FRACTION of the steps and holds no jump (a rest shorter than
    MIN_STEPS points leaves no verdict yet). With jumps in the rest (a sporadic leak, a staircase) only
    leading jumps much faster than the rest's growth are warm-up: jumps spread over the run are the
    finding, not a warm-up.
    """
    if len(ys) < 3:
        return 0
    rest = _rest_start(xs)
    rate = _typical_rate(xs, ys)
    jumps = _persistent_jumps(xs, ys, _noise(xs, ys, rate), rate)
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


def _spread_over_run(xs: Sequence[float], jumps: Sequence[int]) -> bool:
    """Whether some jump lies past the first (1 - REST_FRACTION) of the steps: a sporadic leak keeps
    jumping; jumps only at the start are a warm-up's."""
    return bool(jumps) and max(jumps) >= _rest_start(xs)


def analyse(series: Series, epoch_steps: Sequence[float] = (), max_points: int = 200) -> ResourceFinding:
    """The verdict for one resource (`max_points` bounds the Theil–Sen cost: ~n²/2 slopes)."""
    xs, ys = _clean(series)
    released = released_at_the_end(ys)
    if released:
        xs, ys = xs[:-1], ys[:-1]
    warmup = warmup_length(xs, ys) if len(ys) > MIN_STEPS else 0
    xs, ys = xs[warmup:], ys[warmup:]
    if len(ys) < MIN_STEPS:
        return ResourceFinding(series.resource, "unknown", None, None, None, warmup, 0.0, 0.0, released_bytes=released)
    typical_rate = _typical_rate(xs, ys)
    noise = _noise(xs, ys, typical_rate)
    slope, intercept = theil_sen(xs, ys, max_points)
    residual_scale = _mad([y - (intercept + slope * x) for x, y in zip(xs, ys)])
    x_mean = statistics.fmean(xs)
    spread = math.sqrt(sum((x - x_mean) ** 2 for x in xs)) or 1.0
    error = max(residual_scale, noise, 1.0) / spread
    total = slope * (xs[-1] - xs[0])
    big_enough = total > max(MIN_TOTAL_BYTES, 6 * max(noise, residual_scale))
    jumps = _persistent_jumps(xs, ys, noise, typical_rate)
    jump_growth = sum(ys[i] - ys[i - 1] for i in jumps)
    boundary = {i for i in range(1, len(xs)) if any(xs[i - 1] < e <= xs[i] for e in epoch_steps)}
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
        within = [ys[i] - ys[i - 1] for i in range(1, len(ys)) if i not in boundary]
        if abs(sum(within)) < 0.3 * net:
            starts = sorted({e for e in epoch_steps if xs[0] <= e <= xs[-1]})  # train + val loaders: one start
            epoch_length = statistics.median(b - a for a, b in zip(starts, starts[1:])) if len(starts) > 1 else xs[-1] - xs[0]
            per_epoch = boundary_growth / len(boundary)
            slope = per_epoch / max(epoch_length, 1.0)  # spread over the epoch's steps, for the exhaustion
            return finding("leak", "per-epoch", per_epoch=per_epoch)
    # the jumps make the growth and nothing comes back: many up-jumps with as many falls is noise or sawtooth
    sporadic_jumps = len(jumps) <= max(3, len(ys) // 5) and _spread_over_run(xs, jumps)
    if sporadic_jumps and 0.7 * net < jump_growth < 1.5 * net and net > MIN_TOTAL_BYTES:
        # with thinned sampling a jump is only known to lie between two sampled steps
        ranges = tuple((int(xs[i - 1]) + 1, int(xs[i])) for i in jumps)
        slope = net / (xs[-1] - xs[0])
        return finding("leak", "sporadic", ranges)
    z = slope / error
    if big_enough and z >= Z_LEAK:
        return finding("leak", "per-iteration")
    if big_enough and z >= Z_SUSPECT:
        return finding("suspect", "per-iteration")
    return finding("clean", None)


_KILLED_BY = {r.key: r.runs_out for r in resources.RESOURCES if r.leak_rank is not None}
#: what a resource's leak is reported as, where that is another resource (reserved VRAM as VRAM)
_REPORTED_AS = {r.key: r.reported for r in resources.RESOURCES}


def _total_growth(series: Series) -> float:
    """Last minus first reading, warm-up included (what copying a dataset page by page adds)."""
    _, ys = _clean(series)
    return ys[-1] - ys[0] if ys else 0.0


def _still_copying(series: Series) -> ResourceFinding | None:
    """Workers whose memory was still rising at their last readings: a leak of the process tree while
    it goes on, at the average rate since the first reading (copying pages slows down as fewer are
    left, so a fitted slope of the early readings would overstate it; PSS is read only a few times a
    second, often too few readings for the detector)."""
    xs, ys = _clean(series)
    readings = [(x, y) for i, (x, y) in enumerate(zip(xs, ys)) if i == 0 or y != ys[i - 1]]
    if len(readings) < 3 or readings[-1][1] <= readings[-2][1] or xs[-1] <= xs[0]:
        return None
    growth = ys[-1] - ys[0]
    rate = growth / (xs[-1] - xs[0])
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
    """
    unit, steps_word = rate_unit(clock), plural_noun(clock)
    by_resource = {s.resource: s for s in series}
    findings = {name: analyse(s, epoch_steps, max_points) for name, s in by_resource.items()}
    advice: list[str] = []
    reserved, allocated = findings.get("vram_reserved"), findings.get("vram")
    if reserved and allocated and reserved.verdict in ("leak", "suspect") and allocated.verdict == "clean":
        advice.append(
            "CUDA reserved memory grows while allocated memory is flat: that is the caching allocator "
            "(or fragmentation), not a leak. torch.cuda.empty_cache() returns it; "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation."
        )
    heap, rss, workers = findings.get("heap"), findings.get("rss") or findings.get("ram"), findings.get("workers")
    copy_on_access = None
    workers_growth = _total_growth(by_resource["workers"]) if workers else 0.0
    # the kernel's heap explains little of it: flat, or a small fraction of what the workers added
    heap_aside = heap is not None and (heap.verdict == "clean" or heap.net_growth_bytes < 0.25 * workers_growth)
    if workers and heap_aside and workers_growth >= COPY_ON_ACCESS_MIN_BYTES:
        # growth that stopped after the first pass is bounded (the advice says where it stays); growth
        # still going on is the process tree's leak: the OOM killer counts the workers' memory
        if workers.verdict != "clean":  # "unknown": too few PSS readings for the detector, one short epoch
            copy_on_access = _still_copying(by_resource["workers"])
        advice.append(
            f"DataLoader workers' memory grew by {format_bytes(workers_growth)} (by PSS) while "
            "the kernel's heap stayed nearly flat: workers copying a dataset of Python objects page by page as they read "
            "it (copy-on-access) grows until every worker has touched everything; numpy/torch arrays (or "
            "np.frombuffer / pyarrow for strings) avoid it."
            + _copy_on_access_projection(by_resource["workers"], workers, first_pass_steps)
        )
    elif rss and rss.verdict == "leak" and heap and heap.verdict == "clean":
        advice.append(
            "RSS grows while the heap in use is flat: not memory your objects hold, but freed memory the "
            "allocator keeps (fragmentation) or libraries and buffers loaded on first use. The first kind "
            "comes back with ctypes.CDLL('libc.so.6').malloc_trim(0) (the 'return heap to OS' button)."
        )
    chosen = None
    for name in RESOURCE_ORDER:
        f = findings.get(name)
        if f is None or f.verdict not in ("leak", "suspect"):
            continue
        if name == "ram" and (copy_on_access is not None or (findings.get("heap") and findings["heap"].verdict == "clean")):
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
    if chosen.steps_to_exhaustion is not None:
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
