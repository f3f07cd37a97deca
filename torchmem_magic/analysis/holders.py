"""One verdict from the curves and the holders' own growth (pure).

The leak finder measures each holder (a name in the namespace that keeps tensors or autograd graphs
alive) at scans during the run. A holder's own size is the strongest evidence there is: it is exact
where the curves are noisy, and it shows leaks no curve can (graph nodes piling up after backward,
a few KiB a step). A holder that grows with the steps is a leak; one that is new but stays the same
size is not, however big; one whose growth the curves contradict is no suspect. Where no holder grew,
what the search beyond the names found (`HolderSearch`) says where the memory goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.model import Suspect
from ..core.resources import HEAP, SHM, VRAM
from .findings import Diagnosis, Note, note
from .holder_share import HolderMemory, curves_rate, net_growth_per_step
from .holder_trends import (
    BOUNDED_MENTION_BYTES,
    LOOP_KINDS,
    Fill,
    HolderTrend,
    explains_too_little,
    holder_trend,
    top_trend,
)

#: the curves rule a holder's growth out when the memory it lives in grew by less than this share of
#: its rate, beyond RULED_OUT_Z standard errors of their slope: scans that landed on the rising part of a cycle
RULED_OUT_SHARE = 0.5
RULED_OUT_Z = 3.0


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
    #: entries the run added to registries that live in C, where no search can follow (("atexit", 150)):
    #: where the memory may be when the search found nothing
    opaque_grown: tuple[tuple[str, int], ...] = ()

    def covered(self) -> dict[str, Any]:
        """What was searched, as the facts of the advice that says it."""
        return {"rescanned": self.rescanned, "storages_searched": self.storages_searched,
                "storages_live": self.storages_live, "cut_short": self.cut_short}


def _search_lines(search: HolderSearch, curve_rate: float | None, clock: str, by_name: dict[str, Suspect]) -> list[Note]:
    """What the search says: the holder it found (where the memory goes), a candidate that explains too
    little of the growth to be that (said as partial), or what it covered."""
    if not search.found:
        return [note("search found nothing", searched=search.covered(), opaque=search.opaque_grown)]
    top = by_name.get(search.found[0].name, search.found[0])
    return [note("search found partial" if explains_too_little(top) else "search found", name=top.name,
                 retained_bytes=top.retained_bytes, growth_per_step=top.growth_per_step, path=top.path,
                 curve_rate=curve_rate, clock=clock, searched=search.covered(), share=top.growth_share)]


def _partial_lines(diagnosis: Diagnosis, partial: Sequence[Suspect], clock: str) -> list[Note]:
    """Holders that grow with the leak but explain too little of it to be its holder, said as such."""
    if diagnosis.verdict != "leak" or not partial:
        return []
    explained = min(sum(s.growth_share or 0.0 for s in partial), 1.0)
    return [note("partial holders", resource=diagnosis.resource, curve_rate=diagnosis.per_step_bytes or 0.0,
                 clock=clock, explained=explained,
                 candidates=tuple((s.name, s.growth_share or 0.0) for s in partial[:3]))]


def _filled_line(name: str, fill: Fill, clock: str) -> Note:
    return note("cache filled", name=name, grown_bytes=fill.grown_bytes, first_step=fill.first_step,
                full_step=fill.full_step, last_step=fill.last_step, clock=clock)


def without_ruled_out(
    suspects: Sequence[Suspect], diagnosis: Diagnosis, memory: HolderMemory | None = None
) -> tuple[Suspect, ...]:
    """The suspects less the loop's holders whose growth the curves ruled out (`ruled_out`: `fuse` says
    so in the advice): a window cycling between scans, or a cache whose last scans came before it filled."""
    memory = memory or {}
    return tuple(
        s for s in suspects
        if s.kind not in LOOP_KINDS or not s.series
        or not ruled_out(holder_trend(s.name, s.series), curves_rate(diagnosis, memory.get(s.name)))
    )


def _bounded_lines(trends: dict[str, HolderTrend], aliased: Sequence[str], clock: str) -> list[Note]:
    """Big holders that did not grow (or filled, then stayed), and holders the curves rule out."""
    return [
        _filled_line(t.name, t.filled, clock) if t.filled is not None
        else note("bounded holder", name=t.name, held_bytes=t.last_bytes)
        for t in trends.values() if t.bounded and t.last_bytes >= BOUNDED_MENTION_BYTES
    ] + [note("cycling holder", name=name) for name in aliased]


def _where_the_leak_goes(diagnosis: Diagnosis, top: HolderTrend, holder: Suspect, advice: list[Note],
                         clock: str) -> Diagnosis:
    """The curves' leak and the top holder's growth, said together: where it goes when the rates agree (a
    holder's exact jumps make a blurred slope sporadic), the holder's share when they do not. The holder's
    rate is its net growth over its scans, the one its share is measured with (a slope swings with where the
    scans fell between the steps of a holder that grows once an epoch)."""
    rate, share = net_growth_per_step(holder), holder.growth_share
    curve_rate = diagnosis.per_step_bytes or 0.0
    agree = curve_rate > 0 and 0.5 <= rate / curve_rate <= 2.0
    advice.insert(1, note("where it goes" if agree else "holder's share", resource=diagnosis.resource,
                          curve_rate=curve_rate, name=top.name, holder_rate=rate, clock=clock, share=share))
    if agree and diagnosis.leak_kind == "per-iteration" and top.sporadic:
        # thinned step samples blur jumps into a slope; the holder's exact sizes do not
        return replace(diagnosis, leak_kind="sporadic", advice=tuple(advice))
    return replace(diagnosis, advice=tuple(advice))


@dataclass(frozen=True)
class _Headroom:
    """What a leak found from a holder alone runs out against."""

    host_bytes: float | None
    device_bytes: float | None
    shm_bytes: float | None
    steps_per_s: float | None
    memory: HolderMemory


def _leak_from_holder(diagnosis: Diagnosis, top: HolderTrend, advice: list[Note], clock: str, room: _Headroom) -> Diagnosis:
    """A holder that grows although no curve shows it: a leak at its own rate, in VRAM where its tensors are
    mostly on an accelerator (against the device's headroom), in /dev/shm where they are shared-memory
    segments, else in the heap."""
    rate = top.growth_per_step or 0.0
    resource, headroom = {"vram": (VRAM, room.device_bytes), "shm": (SHM, room.shm_bytes)}.get(
        room.memory.get(top.name, ""), (HEAP, room.host_bytes))
    exhaustion = headroom / rate if headroom and rate > 0 else None
    seconds = exhaustion / room.steps_per_s if exhaustion is not None and room.steps_per_s else None
    kind = "sporadic" if top.sporadic else "per-iteration"
    lines = [note("holder leak", leak_kind=kind, name=top.name, holder_rate=rate, clock=clock,
                  rises=top.rises if top.sporadic else None)]
    if exhaustion is not None:
        lines.append(note("runs out in", resource=resource.key, per_step_bytes=rate, steps=exhaustion, seconds=seconds,
                          clock=clock, signed=True))
    return replace(
        diagnosis, verdict="leak", leak_kind=kind, resource=resource.key, per_step_bytes=rate,
        per_step_error_bytes=None, steps_to_exhaustion=exhaustion, seconds_to_exhaustion=seconds,
        advice=(*lines, *advice),
    )


def _new_graphs_decide(
    diagnosis: Diagnosis, new_graphs: list[str], trends: dict[str, HolderTrend], aliased: Sequence[str], advice: list[Note]
) -> Diagnosis:
    """Graphs new in the cell are the only evidence where the curves say clean or too few steps: clean when
    each is judged bounded, else suspect (too few scans to tell)."""
    rest = advice[1:] if diagnosis.verdict == "unknown" else advice  # drop "too few steps for a verdict"
    if all(name in trends and (trends[name].bounded or name in aliased) for name in new_graphs):
        return replace(diagnosis, verdict="clean", advice=tuple(rest))
    return replace(diagnosis, verdict="suspect", advice=(note("new graphs unjudged", names=tuple(new_graphs)), *rest))


def fuse(
    diagnosis: Diagnosis,
    suspects: Sequence[Suspect],
    clock: str,
    headroom_bytes: float | None,
    steps_per_s: float | None,
    tracked: bool = True,
    memory: HolderMemory | None = None,
    device_headroom_bytes: float | None = None,
    searched: HolderSearch | None = None,
    shm_headroom_bytes: float | None = None,
) -> Diagnosis:
    """One verdict from the curves' diagnosis and the holders' own growth.

    - A holder that grows with the steps is a leak even when no curve can show it; its rate and an
      exhaustion projection come from its own series.
    - A holder that does not grow is not a leak (mentioned when it is big, as bounded); graphs new in
      the cell that too few scans could judge make the verdict "suspect".
    - Agreement and disagreement between the two are said plainly (`tracked`: the holders were
      scanned during the run, so "no holder grows" means something).
    - Each holder is judged against the memory its tensors live in (`memory`: an accelerator's, /dev/shm,
      else the heap's). A leak found from a holder alone is in VRAM when its tensors are mostly on an
      accelerator, and runs out against the device (`device_headroom_bytes`), in /dev/shm against the
      mount (`shm_headroom_bytes`), else in the heap.
    - Where no holder grew in the scans, `searched` says where the memory was found instead, or what
      was searched.
    """
    memory = memory or {}
    trends = {s.name: holder_trend(s.name, s.series) for s in suspects if s.series}
    aliased = sorted(name for name, t in trends.items() if ruled_out(t, curves_rate(diagnosis, memory.get(name))))
    by_name = {s.name: s for s in suspects}
    candidates = [t for t in trends.values() if t.name not in aliased]
    top = top_trend(t for t in candidates if not explains_too_little(by_name[t.name]))
    advice = list(diagnosis.advice)
    bounded = _bounded_lines(trends, aliased, clock)
    if top is not None:
        if diagnosis.verdict == "leak":
            fused = _where_the_leak_goes(diagnosis, top, by_name[top.name], advice, clock)
        else:
            room = _Headroom(headroom_bytes, device_headroom_bytes, shm_headroom_bytes, steps_per_s, memory)
            fused = _leak_from_holder(diagnosis, top, advice, clock, room)
        return replace(fused, advice=(*fused.advice, *bounded))
    new_graphs = [s.name for s in suspects if s.kind == "autograd-graph" and s.new_in_cell]
    if diagnosis.verdict in ("clean", "unknown") and new_graphs:
        fused = _new_graphs_decide(diagnosis, new_graphs, trends, aliased, advice)
        return replace(fused, advice=(*fused.advice, *bounded))
    judged = all(trends.get(s.name) is not None and trends[s.name].growth_per_step is not None
                 for s in suspects if s.new_in_cell)
    partial = _partial_lines(diagnosis, sorted((by_name[t.name] for t in candidates if t.growing),
                                               key=lambda s: -(s.growth_share or 0.0)), clock)
    advice[1:1] = partial
    if searched is not None and diagnosis.verdict in ("leak", "suspect"):
        at = 1 + len(partial)
        advice[at:at] = _search_lines(searched, diagnosis.per_step_bytes, clock, by_name)
    elif diagnosis.verdict == "leak" and tracked and judged and not partial:
        advice.append(note("held elsewhere"))
    return replace(diagnosis, advice=(*advice, *bounded))


def needs_holder_search(verdict: str, suspects: Sequence[Suspect]) -> bool:
    """Whether a report's memory has no holder yet: a leak (or suspect), and no suspect that is new in the
    cell or grew in its scans."""
    return verdict in ("leak", "suspect") and not any(
        s.new_in_cell or (s.series and holder_trend(s.name, s.series).growing) for s in suspects
    )
