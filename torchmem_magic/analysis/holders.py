"""Whether a holder grows with the steps, and one verdict from the curves and the holders (pure).

The leak finder measures each holder (a name in the namespace that keeps tensors or autograd graphs
alive) at scans during the run. A holder's own size is the strongest evidence there is: it is exact
where the curves are noisy, and it shows leaks no curve can (graph nodes piling up after backward,
a few KiB a step). A holder that grows with the steps is a leak; one that is new but stays the same
size is not, however big.

"The top holder", wherever a line names one, is `top_holder()`'s: the holder with the largest
positive growth per step. A flat or shrinking holder never counts as growing; a caller that must
name someone when none grows asks for the largest instead (`or_largest`), and says "held by", not
"grows".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from ..core.model import Suspect
from ..core.resources import HEAP, VRAM
from ..core.slopes import theil_sen
from ..core.units import format_bytes, format_duration, plural_noun, rate_unit
from .verdict import Diagnosis

MIN_POINTS = 4  # scans needed before a holder's trend is judged
MIN_GROWTH_BYTES = 256 << 10  # growth below this over the run is not called a leak
STILL_GROWING = 0.3  # the late half's slope must be at least this share of the whole slope
MOSTLY_UP = 0.6  # share of scan-to-scan changes that must be increases
BOUNDED_MENTION_BYTES = 1 << 20  # a bounded holder this big is still worth a line
#: a holder's size is exact, and an accumulating one never gives memory back: between the run's scans,
#: its falls may undo at most this share of its rises (a window cleared every N steps falls by all of it)
FALLS_SHARE = 0.1
#: a holder's growth stopped when its later scans all lie within this share of its growth of its last size,
#: for at least as many steps as it took to get there (a cache or memo filled once, bounded by the data)
FILLED_LEVEL_SHARE = 0.05
#: the curves rule a holder's growth out when the memory it lives in grew by less than this share of
#: its rate, beyond RULED_OUT_Z standard errors of their slope: scans that landed on the rising part of a cycle
RULED_OUT_SHARE = 0.5
RULED_OUT_Z = 3.0


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
    growth_per_step: float | None  # Theil–Sen slope, bytes per step; None with too few scans
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


def top_holder(holders: Iterable[H], or_largest: bool = False) -> H | None:
    """The top holder: the one with the largest positive growth per step (ties: the larger, then by
    name). When none grows: the largest holder if `or_largest`, else None."""
    candidates = list(holders)
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


def holder_trend(name: str, series: Sequence[tuple[int, int]]) -> HolderTrend:
    """Judge one holder from its (step, retained bytes) points."""
    points = sorted(series)
    last = points[-1][1] if points else 0
    steps = [float(s) for s, _ in points]
    if len(points) < MIN_POINTS or steps[-1] - steps[0] < MIN_POINTS:
        return HolderTrend(name, None, False, False, last)
    sizes = [float(b) for _, b in points]
    slope, _ = theil_sen(steps, sizes)
    growth = slope * (steps[-1] - steps[0])
    late = len(points) // 2
    late_slope, _ = theil_sen(steps[late:], sizes[late:]) if len(points) - late >= 2 else (slope, 0.0)
    changes = [b - a for a, b in zip(sizes, sizes[1:]) if b != a]
    rises = sum(1 for c in changes if c > 0)
    mostly_up = rises >= 2 and rises >= MOSTLY_UP * len(changes)  # one jump is not a trend
    sporadic = _grew_in_jumps(points)
    still_growing = late_slope >= STILL_GROWING * slope > 0 or (sporadic and sizes[-1] > sizes[late])
    filled = filled_then_flat(points)
    growing = (growth >= MIN_GROWTH_BYTES and (mostly_up or sporadic) and still_growing and not _gives_back(points)
               and filled is None)
    return HolderTrend(
        name, slope, growing, not growing, last, _rises(points) if sporadic else (), sporadic and growing, filled
    )


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


def live_holder_line(trends: Sequence[HolderTrend], kinds: dict[str, str], clock: str) -> str | None:
    """'val_outputs +2.9 MiB/step, autograd graphs': the fastest-growing holder, once one is clear."""
    top = top_trend(trends)
    if top is None:
        return None
    what = {"autograd-graph": "autograd graphs", "tensor-cache": "tensors"}.get(kinds.get(top.name, ""), "tensors")
    return f"{top.name} {format_bytes(top.growth_per_step, signed=True)}/{rate_unit(clock)}, {what}"


def curves_rate(diagnosis: Diagnosis, on_device: bool = False) -> tuple[float, float] | None:
    """(growth per step, its standard error) of the memory a holder's objects can live in: the heap in
    use (the kernel's RSS where the heap is not read) plus accelerator memory, or for a holder whose
    tensors are on a device (`on_device`), that device's memory alone; None when no curve had enough
    steps to measure it (what no curve measures, no curve can rule out)."""
    measured = {f.resource: f for f in diagnosis.findings if f.verdict != "unknown" and f.per_step_bytes is not None}
    host = measured.get("heap") or measured.get("rss") or measured.get("ram")
    parts = [] if on_device else [host] if host is not None else []
    if "vram" in measured and (parts or on_device):
        parts.append(measured["vram"])
    if not parts:
        return None
    return sum(p.per_step_bytes or 0.0 for p in parts), sum(p.per_step_error_bytes or 0.0 for p in parts)


def ruled_out(trend: HolderTrend, curves: tuple[float, float] | None) -> bool:
    """Whether the curves contradict a holder's growth: at its rate they would have grown, measurably,
    and did not. Scans are few and far apart, so they can land on the rising part of a cycle (a window
    cleared every N steps) every time; the curves are read at every sampled step and cannot be fooled
    that way. A graph-only leak (a few KiB a step) is below what the curves can rule out, so its
    own series decides."""
    if curves is None or not trend.growing or trend.sporadic:  # exact unchanged scans between jumps: no cycle
        return False
    rate, error = curves
    return rate + RULED_OUT_Z * error < RULED_OUT_SHARE * (trend.growth_per_step or 0.0)


@dataclass(frozen=True)
class HolderSearch:
    """Where a leak's memory was looked for when no holder grew in the scans: the names a memo stood in for,
    scanned afresh, then a search back from the live tensors no scan reached to what holds them."""

    found: tuple[Suspect, ...]  # the closest to what the run grew first; growth_per_step where a size before is known
    rescanned: int  # names scanned afresh
    storages_searched: int  # storages searched back from (0: the rescan found the holder)
    storages_live: int  # live storages no scan reached
    cut_short: bool
    elapsed_s: float

    def said(self) -> str:
        """What was searched, in words."""
        searched = f"rescanned {self.rescanned} {'name' if self.rescanned == 1 else 'names'} afresh"
        if self.storages_searched:
            searched += (f", then searched back from the {self.storages_searched} largest of "
                         f"{self.storages_live} live tensor storages no scan reached")
        return searched + (" (cut short: a limit was reached)" if self.cut_short else "")


def _search_lines(search: HolderSearch, curve_rate: float | None, unit: str) -> list[str]:
    """What the search says: the holder it found (where the memory goes), or what it covered."""
    if not search.found:
        return [f"no holder grows in the scans, and none was found ({search.said()}): the memory is held "
                "where Python cannot see it (a C extension's buffers) or kept by the allocator"]
    top = search.found[0]
    grew = "" if top.growth_per_step is None else f", +{format_bytes(top.growth_per_step)}/{unit} over the run"
    rate = "" if not curve_rate else f" of the {format_bytes(curve_rate, signed=True)}/{unit}"
    return [f"{top.name} holds {format_bytes(top.retained_bytes)}{grew} at {top.path}: that is where the memory "
            f"goes{rate} (found where the scans had not looked: {search.said()})"]


def _filled_line(name: str, fill: Fill, steps_word: str) -> str:
    return (
        f"{name} is a cache that filled: it grew by {format_bytes(fill.grown_bytes)} over {steps_word} "
        f"{fill.first_step:,.0f}–{fill.full_step:,.0f}, then stayed the same size for "
        f"{fill.last_step - fill.full_step:,.0f} {steps_word} (bounded by the data: not a leak)"
    )


def without_ruled_out(
    suspects: Sequence[Suspect], diagnosis: Diagnosis, on_accelerator: frozenset[str] = frozenset()
) -> tuple[Suspect, ...]:
    """The suspects less the loop's holders whose growth the curves ruled out (`ruled_out`: `fuse` says
    so in the advice): a window cycling between scans, or a cache whose last scans came before it filled."""
    return tuple(
        s for s in suspects
        if s.kind not in LOOP_KINDS or not s.series
        or not ruled_out(holder_trend(s.name, s.series), curves_rate(diagnosis, s.name in on_accelerator))
    )


def fuse(
    diagnosis: Diagnosis,
    suspects: Sequence[Suspect],
    clock: str,
    headroom_bytes: float | None,
    steps_per_s: float | None,
    tracked: bool = True,
    on_accelerator: frozenset[str] = frozenset(),
    device_headroom_bytes: float | None = None,
    searched: HolderSearch | None = None,
) -> Diagnosis:
    """One verdict from the curves' diagnosis and the holders' own growth.

    - A holder that grows with the steps is a leak even when no curve can show it; its rate and an
      exhaustion projection come from its own series.
    - A holder that does not grow is not a leak (mentioned when it is big, as bounded); graphs new in
      the cell that too few scans could judge make the verdict "suspect".
    - Agreement and disagreement between the two are said plainly (`tracked`: the holders were
      scanned during the run, so "no holder grows" means something).
    - A leak found from a holder alone is in VRAM when its tensors are mostly on an accelerator
      (`on_accelerator`), and runs out against the device (`device_headroom_bytes`), else in the heap.
    - Where no holder grew in the scans, `searched` says where the memory was found instead, or what
      was searched.
    """
    unit, steps_word = rate_unit(clock), plural_noun(clock)
    trends = {s.name: holder_trend(s.name, s.series) for s in suspects if s.series}
    aliased = sorted(name for name, t in trends.items() if ruled_out(t, curves_rate(diagnosis, name in on_accelerator)))
    top = top_trend(t for t in trends.values() if t.name not in aliased)
    advice = list(diagnosis.advice)
    bounded = [
        _filled_line(t.name, t.filled, steps_word) if t.filled is not None
        else f"{t.name} holds {format_bytes(t.last_bytes)} (bounded: it did not grow over the run)"
        for t in trends.values() if t.bounded and t.last_bytes >= BOUNDED_MENTION_BYTES
    ] + [
        f"{name}'s scans rose, but the memory it lives in did not grow with it: its size cycles between scans "
        "(not a leak)" for name in aliased
    ]
    if top is not None:
        rate = top.growth_per_step or 0.0
        holder_rate = f"{format_bytes(rate, signed=True)}/{unit}"
        if diagnosis.verdict == "leak":
            curve_rate = diagnosis.per_step_bytes or 0.0
            if curve_rate > 0 and 0.5 <= rate / curve_rate <= 2.0:
                advice.insert(1, f"{diagnosis.resource} {format_bytes(curve_rate, signed=True)}/{unit}, and "
                                 f"{top.name} grows {holder_rate}: that is where it goes")
                if diagnosis.leak_kind == "per-iteration" and top.sporadic:
                    # thinned step samples blur jumps into a slope; the holder's exact sizes do not
                    return replace(diagnosis, leak_kind="sporadic", advice=(*advice, *bounded))
            else:
                advice.insert(1, f"{top.name} grows {holder_rate} of the {diagnosis.resource}'s "
                                 f"{format_bytes(curve_rate, signed=True)}/{unit}")
            return replace(diagnosis, advice=(*advice, *bounded))
        on_device = top.name in on_accelerator
        resource = VRAM if on_device else HEAP
        room = device_headroom_bytes if on_device else headroom_bytes
        exhaustion = room / rate if room and rate > 0 else None
        seconds = exhaustion / steps_per_s if exhaustion is not None and steps_per_s else None
        kind = "sporadic" if top.sporadic else "per-iteration"
        lines = [f"{kind} leak: {top.name} grows {holder_rate}, too little for the curves to show yet"]
        if top.sporadic:
            named = [str(b) if a == b else f"{a}–{b}" for a, b in top.rises[:10]]
            lines[0] += f" (in jumps, between {steps_word} {', '.join(named)})"
        if exhaustion is not None:
            if clock == "time":
                when = f"~{format_duration(exhaustion, rough=True)}"
            else:
                when = f"~{exhaustion:,.0f} {steps_word}" + (f" (~{format_duration(seconds, rough=True)})" if seconds else "")
            lines.append(f"at {holder_rate} {resource.runs_out} in {when}")
        return replace(
            diagnosis, verdict="leak", leak_kind=kind, resource=resource.key, per_step_bytes=rate,
            per_step_error_bytes=None, steps_to_exhaustion=exhaustion, seconds_to_exhaustion=seconds,
            advice=(*lines, *advice, *bounded),
        )
    new_graphs = [s.name for s in suspects if s.kind == "autograd-graph" and s.new_in_cell]
    if diagnosis.verdict in ("clean", "unknown") and new_graphs:
        # graphs new in the cell are the only evidence: they decide, whatever the curves had too few steps for
        rest = advice[1:] if diagnosis.verdict == "unknown" else advice  # drop "too few steps for a verdict"
        if all(name in trends and (trends[name].bounded or name in aliased) for name in new_graphs):
            return replace(diagnosis, verdict="clean", advice=(*rest, *bounded))
        lines = [f"{', '.join(new_graphs)} holds autograd graphs new in this run; too few scans to tell whether "
                 "they grow"]
        return replace(diagnosis, verdict="suspect", advice=(*lines, *rest, *bounded))
    judged = all(trends.get(s.name) is not None and trends[s.name].growth_per_step is not None
                 for s in suspects if s.new_in_cell)
    if searched is not None and diagnosis.verdict in ("leak", "suspect"):
        advice[1:1] = _search_lines(searched, diagnosis.per_step_bytes, unit)
    elif diagnosis.verdict == "leak" and tracked and judged:
        advice.append("no variable in the namespace grows with the steps: the memory is held elsewhere "
                      "(a function's local variables, a library's cache) or kept by the allocator")
    return replace(diagnosis, advice=(*advice, *bounded))


def needs_holder_search(verdict: str, suspects: Sequence[Suspect]) -> bool:
    """Whether a report's memory has no holder yet: a leak (or suspect), and no suspect that is new in the
    cell or grew in its scans."""
    return verdict in ("leak", "suspect") and not any(
        s.new_in_cell or (s.series and holder_trend(s.name, s.series).growing) for s in suspects
    )
