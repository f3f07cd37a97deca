"""The holders' notes: where a leak's memory goes, what grew and what only filled, what a search found."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...analysis.holder_trends import HolderTrend, top_trend
from ...core.units import format_bytes, plural_noun, rate_unit
from .phrases import rate, steps_named

def _searched(rescanned: int, storages_searched: int, storages_live: int, cut_short: bool) -> str:
    """What the search back from live tensors covered, in words."""
    searched = f"rescanned {rescanned} {'name' if rescanned == 1 else 'names'} afresh"
    if storages_searched:
        searched += (f", then searched back from the {storages_searched} largest of "
                     f"{storages_live} live tensor storages no scan reached")
    return searched + (" (cut short: a limit was reached)" if cut_short else "")


def _search_found_nothing(searched: dict[str, Any], opaque: tuple[tuple[str, int], ...] = ()) -> str:
    said = (f"no holder grows in the scans, and none was found ({_searched(**searched)}): the memory is held "
            "where Python cannot see it (a C extension's buffers) or kept by the allocator")
    for registry, added in opaque:
        said += (f"; {registry} gained {added:,} entries during the run, and what they were registered with stays "
                 f"alive where no search can follow ({registry} keeps it in C): {OPAQUE_FIXES.get(registry, '')}")
    return said


#: what to do about a registry that lives in C and grew with the run
OPAQUE_FIXES = {"atexit": "register once, or atexit.unregister(fn) what is no longer needed"}


def _search_found(name: str, retained_bytes: int, growth_per_step: float | None, path: str,
                  curve_rate: float | None, clock: str, searched: dict[str, Any], share: float | None = None) -> str:
    unit = rate_unit(clock)
    grew = "" if growth_per_step is None else f", +{format_bytes(growth_per_step)}/{unit} over the run"
    of_curve = "" if not curve_rate else f" of the {rate(curve_rate, clock, signed=True)}"
    if of_curve and share is not None:
        of_curve = f": {share:.0%}{of_curve}"
    return (f"{name} holds {format_bytes(retained_bytes)}{grew} at {path}: that is where the memory "
            f"goes{of_curve} (found where the scans had not looked: {_searched(**searched)})")


def _search_found_partial(name: str, retained_bytes: int, growth_per_step: float | None, path: str,
                          curve_rate: float | None, clock: str, searched: dict[str, Any], share: float | None = None) -> str:
    of_curve = "" if not curve_rate else f" of the {rate(curve_rate, clock, signed=True)}"
    return (f"no holder found explains the growth: the closest, {name} at {path}, holds "
            f"{format_bytes(retained_bytes)}, {_share(share)}{of_curve} at most (a partial candidate, not the "
            f"holder; searched: {_searched(**searched)})")


def _share(share: float | None) -> str:
    return "an unknown share" if share is None else f"{share:.0%}"


def _explains(share: float | None) -> str:
    return "" if share is None else f" ({share:.0%} of it)"


def _partial_holders(resource: str, curve_rate: float, clock: str, explained: float,
                     candidates: tuple[tuple[str, float], ...]) -> str:
    named = ", ".join(f"{name} ({share:.0%})" for name, share in candidates)
    return (f"the holders that grow explain only {explained:.0%} of the {resource}'s "
            f"{rate(curve_rate, clock, signed=True)}: {named} — partial candidates, not the holder; "
            "most of it is held elsewhere (a function's local variables, a library's cache) or kept by the allocator")


def _cache_filled(name: str, grown_bytes: float, first_step: float, full_step: float, last_step: float,
                  clock: str) -> str:
    steps_word = plural_noun(clock)
    return (
        f"{name} is a cache that filled: it grew by {format_bytes(grown_bytes)} over {steps_word} "
        f"{first_step:,.0f}–{full_step:,.0f}, then stayed the same size for "
        f"{last_step - full_step:,.0f} {steps_word} (bounded by the data: not a leak)"
    )


def _bounded_holder(name: str, held_bytes: float) -> str:
    return f"{name} holds {format_bytes(held_bytes)} (bounded: it did not grow over the run)"


def _cycling_holder(name: str) -> str:
    return (f"{name}'s scans rose, but the memory it lives in did not grow with it: its size cycles between scans "
            "(not a leak)")


def _where_it_goes(resource: str, curve_rate: float, name: str, holder_rate: float, clock: str,
                   share: float | None = None) -> str:
    return (f"{resource} {rate(curve_rate, clock, signed=True)}, and {name} grows "
            f"{rate(holder_rate, clock, signed=True)}: that is where it goes{_explains(share)}")


def _holder_share(resource: str, curve_rate: float, name: str, holder_rate: float, clock: str,
                  share: float | None = None) -> str:
    return (f"{name} grows {rate(holder_rate, clock, signed=True)} of the {resource}'s "
            f"{rate(curve_rate, clock, signed=True)}{_explains(share)}")


def _holder_leak(leak_kind: str, name: str, holder_rate: float, clock: str,
                 rises: tuple[tuple[int, int], ...] | None = None) -> str:
    """`rises`: where a sporadic holder's jumps lie (None: it grows steadily)."""
    line = f"{leak_kind} leak: {name} grows {rate(holder_rate, clock, signed=True)}, too little for the curves to show yet"
    return line + (f" (in jumps, between {plural_noun(clock)} {steps_named(rises)})" if rises is not None else "")


def _new_graphs_unjudged(names: tuple[str, ...]) -> str:
    return f"{', '.join(names)} holds autograd graphs new in this run; too few scans to tell whether they grow"


def _held_elsewhere() -> str:
    return ("no variable in the namespace grows with the steps: the memory is held elsewhere "
            "(a function's local variables, a library's cache) or kept by the allocator")


def live_holder_line(trends: Sequence[HolderTrend], kinds: dict[str, str], clock: str) -> str | None:
    """'val_outputs +2.9 MiB/step, autograd graphs': the fastest-growing holder, once one is clear."""
    top = top_trend(trends)
    if top is None:
        return None
    what = {"autograd-graph": "autograd graphs", "tensor-cache": "tensors"}.get(kinds.get(top.name, ""), "tensors")
    return f"{top.name} {format_bytes(top.growth_per_step, signed=True)}/{rate_unit(clock)}, {what}"


#: the wording of each note, by its key
WORDS: dict[str, Callable[..., str]] = {
    "search found nothing": _search_found_nothing,
    "search found": _search_found,
    "search found partial": _search_found_partial,
    "partial holders": _partial_holders,
    "cache filled": _cache_filled,
    "bounded holder": _bounded_holder,
    "cycling holder": _cycling_holder,
    "where it goes": _where_it_goes,
    "holder's share": _holder_share,
    "holder leak": _holder_leak,
    "new graphs unjudged": _new_graphs_unjudged,
    "held elsewhere": _held_elsewhere,
}
