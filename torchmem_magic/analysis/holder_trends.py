"""One holder's size over a run's scans, judged: whether it grows with the steps, gives back, or filled once
and then kept its size (pure).

"The top holder", wherever a line names one, is `top_holder()`'s: the holder with the largest
positive growth per step, among those that explain at least MIN_HOLDER_SHARE of the leak's growth
where that share is known (`Suspect.growth_share`). A flat or shrinking holder never counts as growing;
a caller that must name someone when none grows asks for the largest instead (`or_largest`), and says
"held by", not "grows".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from ..core.model import Suspect
from ..core.slopes import theil_sen


MIN_POINTS = 4  # scans needed before a holder's trend is judged
MIN_GROWTH_BYTES = 256 << 10  # growth below this over the run is not called a leak
STILL_GROWING = 0.3  # the late half's slope must be at least this share of the whole slope
NET_OVER_SLOPE = 0.5  # a slope below this share of the net growth per step is a slope of flats between jumps
MOSTLY_UP = 0.6  # share of scan-to-scan changes that must be increases
BOUNDED_MENTION_BYTES = 1 << 20  # a bounded holder this big is still worth a line
#: a holder's size is exact, and an accumulating one never gives memory back: between the run's scans,
#: its falls may undo at most this share of its rises (a window cleared every N steps falls by all of it)
FALLS_SHARE = 0.1
#: a holder's growth stopped when its later scans all lie within this share of its growth of its last size,
#: for at least as many steps as it took to get there (a cache or memo filled once, bounded by the data)
FILLED_LEVEL_SHARE = 0.05
#: the share of a leak's growth a holder must explain to be named as its holder: a quarter lets two or three
#: holders share one leak, and leaves out a bystander (a constant, a bounded buffer) found beside it
MIN_HOLDER_SHARE = 0.25


@dataclass(frozen=True)
class Fill:
    """Growth that stopped: a holder grew from `first_step` to `full_step`, then stayed the same size to `last_step`."""

    first_step: int
    full_step: int
    last_step: int
    grown_bytes: int


@dataclass(frozen=True)
class HolderTrend:
    """How one holder's size moved over the run's scans."""

    name: str
    growth_per_step: float | None  # Theil–Sen slope (the net growth per step where far above it); None: too few scans
    growing: bool  # grows with the steps and still did at the end
    bounded: bool  # enough scans, and it does not grow (a warm-up that stopped counts as bounded)
    last_bytes: int
    rises: tuple[tuple[int, int], ...] = ()  # (first, last) step of each scan interval it grew in
    sporadic: bool = False  # it grew in jumps, with as many intervals without any change between them
    filled: Fill | None = None  # it grew, then stopped: a cache that filled (bounded)

    @property
    def retained_bytes(self) -> int:
        """Its size at the last scan (what `top_holder` breaks ties with)."""
        return self.last_bytes


class Holder(Protocol):
    """What the top-holder rule reads: a `Suspect` or a `HolderTrend`."""

    @property
    def name(self) -> str: ...
    @property
    def growth_per_step(self) -> float | None: ...
    @property
    def retained_bytes(self) -> int: ...


H = TypeVar("H", bound=Holder)


def grows(holder: Holder) -> bool:
    """Whether a holder grew: a positive growth per step (flat, shrinking or unmeasured: no)."""
    return holder.growth_per_step is not None and holder.growth_per_step > 0


def largest_holder(holders: Iterable[H]) -> H | None:
    """The holder that retains the most bytes (ties: by name), whatever its growth."""
    return min(holders, key=lambda h: (-h.retained_bytes, h.name), default=None)


def explains_too_little(holder: object) -> bool:
    """Whether a holder explains too small a share of the leak's growth to be named as its holder (a
    share that is not known, a trend's or one of no leak, never rules a holder out)."""
    share = getattr(holder, "growth_share", None)
    return share is not None and share < MIN_HOLDER_SHARE


def top_holder(holders: Iterable[H], or_largest: bool = False) -> H | None:
    """The top holder: the one with the largest positive growth per step (ties: the larger, then by
    name), of those that do not explain too little of the growth. When none grows: the largest such
    holder if `or_largest`, else None."""
    candidates = [h for h in holders if not explains_too_little(h)]
    growing = [h for h in candidates if grows(h)]
    if growing:
        return min(growing, key=lambda h: (-(h.growth_per_step or 0.0), -h.retained_bytes, h.name))
    return largest_holder(candidates) if or_largest else None


def top_trend(trends: Iterable[HolderTrend]) -> HolderTrend | None:
    """The top holder among trends judged growing: a live line names a holder only once its own
    series makes the growth clear (enough scans, mostly rises, still rising at the end)."""
    return top_holder(t for t in trends if t.growing)


def _rises(points: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple((a_step + 1, b_step) for (a_step, a), (b_step, b) in zip(points, points[1:]) if b > a)


def _grew_in_jumps(points: Sequence[tuple[int, int]]) -> bool:
    """A holder's size is exact (no noise): an interval without any change means nothing was kept
    then. Growth in a few intervals, with at least as many unchanged ones after the first, is sporadic
    (steady growth changes the size at every scan)."""
    changes = [b - a for (_, a), (_, b) in zip(points, points[1:])]
    first = next((i for i, c in enumerate(changes) if c > 0), len(changes))
    after = changes[first:]
    rises = sum(1 for c in after if c > 0)
    return rises >= 2 and sum(1 for c in after if c == 0) >= rises


def _gives_back(points: Sequence[tuple[int, int]]) -> bool:
    """Whether a holder released memory during the run: more falls between its scans than an
    accumulating holder makes (it never falls). The fall from its size before the cell (step 0) to its
    first scan is a restart (the name reassigned, a list cleared before the loop), not a release."""
    run = list(points[1:]) if points and points[0][0] == 0 else list(points)
    changes = [b - a for (_, a), (_, b) in zip(run, run[1:])]
    return -sum(c for c in changes if c < 0) > FALLS_SHARE * sum(c for c in changes if c > 0)


def filled_then_flat(points: Sequence[tuple[int, int]]) -> Fill | None:
    """A holder that grew and then stopped: from its first scan at its final level (within
    FILLED_LEVEL_SHARE of its growth) on, it stayed there, over two scans at least and for at least as
    many steps as it took to get there, with as many scans during the run as any trend needs. Its sizes
    are exact: no noise to allow for."""
    if sum(1 for step, _ in points if step > 0) < MIN_POINTS:
        return None
    sizes = [b for _, b in points]
    grown = sizes[-1] - min(sizes)
    if grown < MIN_GROWTH_BYTES:
        return None
    full = len(points) - 1
    while full > 0 and at_its_last_level(points, sizes[full - 1]):
        full -= 1
    (first, _), (reached, _), (last, _) = points[0], points[full], points[-1]
    if len(points) - full < 2 or last - reached < reached - first:
        return None
    return Fill(first, reached, last, grown)


def at_its_last_level(points: Sequence[tuple[int, int]], size_bytes: int) -> bool:
    """Whether `size_bytes` is a holder's size at its last scan, within FILLED_LEVEL_SHARE of its growth."""
    sizes = [b for _, b in points]
    return bool(sizes) and abs(size_bytes - sizes[-1]) <= FILLED_LEVEL_SHARE * (max(sizes) - min(sizes))


def _slowed_in_its_last_interval(steps: Sequence[float], sizes: Sequence[float], slope: float) -> bool:
    """Whether the last interval between scans spans at least the steps of all before it and grew there at
    less than STILL_GROWING of the slope: scans thinned out (each costs more as the holder grows), and the
    one long interval, its size exact, says the growth slowed or stopped in it; the earlier, denser scans
    outvote it in any slope."""
    if len(steps) < 3:
        return False
    span = steps[-1] - steps[-2]
    return span >= steps[-2] - steps[0] and (sizes[-1] - sizes[-2]) < STILL_GROWING * slope * span


def holder_trend(name: str, series: Sequence[tuple[int, int]]) -> HolderTrend:
    """Judge one holder from its (step, retained bytes) points."""
    points = sorted(series)
    last = points[-1][1] if points else 0
    steps = [float(s) for s, _ in points]
    if len(points) < MIN_POINTS or steps[-1] - steps[0] < MIN_POINTS:
        return HolderTrend(name, None, False, False, last)
    sizes = [float(b) for _, b in points]
    slope, _ = theil_sen(steps, sizes)
    net_rate = (sizes[-1] - sizes[0]) / (steps[-1] - steps[0])
    if slope < NET_OVER_SLOPE * net_rate:
        # most scans on a flat (dense early scans of a holder kept once an epoch): their slope says nothing of
        # the jumps between them, the net growth does
        slope = net_rate
    growth = slope * (steps[-1] - steps[0])
    late = len(points) // 2
    late_slope, _ = theil_sen(steps[late:], sizes[late:]) if len(points) - late >= 2 else (slope, 0.0)
    changes = [b - a for a, b in zip(sizes, sizes[1:]) if b != a]
    rises = sum(1 for c in changes if c > 0)
    mostly_up = rises >= 2 and rises >= MOSTLY_UP * len(changes)  # one jump is not a trend
    sporadic = _grew_in_jumps(points)
    still_growing = (late_slope >= STILL_GROWING * slope > 0 and not _slowed_in_its_last_interval(steps, sizes, slope)
                     or (sporadic and sizes[-1] > sizes[late]))
    filled = filled_then_flat(points)
    growing = (growth >= MIN_GROWTH_BYTES and (mostly_up or sporadic) and still_growing and not _gives_back(points)
               and filled is None)
    return HolderTrend(
        name, slope, growing, not growing, last, _rises(points) if sporadic else (), sporadic and growing, filled
    )


def rose_in_few_scans(series: Sequence[tuple[int, int]]) -> bool:
    """Whether a holder measured too few times for a trend (`holder_trend` undecided) rose at each of its
    scans, by MIN_GROWTH_BYTES in all: a holder a search found mid-run late in a short run, measured once
    there and once at the end. A dataset alive before the run stays the same size, and is no such holder."""
    sizes = [b for _, b in sorted(series)]
    return len(sizes) >= 2 and all(b >= a for a, b in zip(sizes, sizes[1:])) and sizes[-1] - sizes[0] >= MIN_GROWTH_BYTES


def first_named_step(series: dict[str, list[tuple[int, int]]]) -> int | None:
    """The step at which a holder first showed clear growth in the scans: when the live status line
    names it."""
    named = []
    for name, points in series.items():
        ordered = sorted(points)
        rises = [k for k in range(1, len(ordered)) if ordered[k][1] > ordered[k - 1][1]]
        if len(rises) < 2:
            continue  # growing needs two rises: a flat holder is never named (most are flat)
        for k in range(max(MIN_POINTS, rises[1] + 1), len(ordered) + 1):
            if holder_trend(name, ordered[:k]).growing:
                named.append(ordered[k - 1][0])
                break
    return min(named, default=None)


def with_trends(suspects: Sequence[Suspect], series: dict[str, list[tuple[int, int]]]) -> tuple[Suspect, ...]:
    """The suspects with their scan series and growth per step filled in."""
    out = []
    for suspect in suspects:
        points = tuple(series.get(suspect.name, ()))
        if not points:
            out.append(suspect)
            continue
        trend = holder_trend(suspect.name, points)
        out.append(replace(suspect, series=points, growth_per_step=trend.growth_per_step, first_seen_step=points[0][0]))
    return tuple(out)


#: kinds whose holders are no leak when their own scans show them bounded (the notebook's caches are
#: reported whatever their trend: what they keep is freed by releasing them, not by a fix to the loop)
LOOP_KINDS = frozenset({"autograd-graph", "tensor-cache"})


def stayed_flat(series: Sequence[tuple[int, int]]) -> bool:
    """Whether a holder's scans during the run (its size before the cell, at step 0, aside) found it the
    same size, enough of them to say so: it rose once at most. A leak rises at scan after scan, a
    graph-only one too (by its nodes)."""
    sizes = [b for s, b in sorted(series) if s > 0]
    return len(sizes) >= MIN_POINTS and sum(1 for a, b in zip(sizes, sizes[1:]) if b > a) < 2


def without_flat(suspects: Sequence[Suspect]) -> tuple[Suspect, ...]:
    """The suspects less those that stayed flat while the loop ran, or filled and then stayed flat. What the
    last step left behind (its outputs, with their graph) or a buffer filled once is no leak, however many
    tensors or graphs a single scan finds there; `fuse` still names a big one as bounded, or as a cache
    that filled."""
    return tuple(
        s for s in suspects
        if s.kind not in LOOP_KINDS or not (stayed_flat(s.series) or filled_then_flat(sorted(s.series)) is not None)
    )
