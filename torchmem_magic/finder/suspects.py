"""From a scan to suspects and memcheck results: which holder leaks, of what kind, and the fix.

Pure (numbers, paths and source text in; dataclasses out). A holder is a suspect when it keeps
autograd graphs beyond the last step's (several graph tensors, a long chain, or >= 1 MiB), when a
builtin container new in the cell caches >= 1 MiB of tensors (held by name, or kept by a function
between calls: a default argument, a captured variable, a bound method's attribute), or when
IPython's output cache or last traceback holds tensors. A fix for what a function keeps names the
function and its variable, as the user wrote them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..core.model import Suspect, by_retained
from ..render.advice import fixes
from ..render.advice.memcheck import memcheck_advice, skipped_objects, truncated_scan
from ..render.results import MemcheckResult
from .scan.results import NODE_BYTES, RootStats, ScanResult, SlotStats

MIB = 1 << 20
CHAIN_NODES = 100  # one tensor with this many graph nodes is a chain growing step by step
CONTAINER_TYPES = {"list", "dict", "tuple", "deque", "set", "defaultdict", "OrderedDict"}
_LAST_SUBSCRIPT = re.compile(r"(\[[^\[\]]*\]|\{…\}|\.keys\(\)\[[^\[\]]*\])$")


def container_path(tensor_path: str) -> str:
    """`history[17]` -> `history`; `logger.hist[3]` -> `logger.hist`; `metrics['val'][0]` -> `metrics['val']`."""
    return _LAST_SUBSCRIPT.sub("", tensor_path) or tensor_path


def classify(stats: RootStats) -> str | None:
    """The suspect kind of a holder, or None when it is not suspect."""
    if stats.tensors == 0:
        return None
    if stats.kind in ("output-cache", "traceback"):
        return stats.kind
    if stats.graph_tensors and (
        stats.graph_tensors >= 2 or stats.graph_nodes >= CHAIN_NODES or stats.retained_bytes >= MIB
    ):
        return "autograd-graph"
    if stats.holder_type in CONTAINER_TYPES and stats.tensors >= 2 and stats.retained_bytes >= MIB:
        return "tensor-cache"
    if cache_slot(stats) is not None:
        return "tensor-cache"
    return None


def cache_slot(stats: RootStats) -> SlotStats | None:
    """The largest builtin container a function keeps between calls (`store=[]`, a captured `cache`, a
    method's `self.outputs`) that holds >= 2 tensors and >= 1 MiB: a cache, whatever holds the function."""
    caches = [
        held for held in stats.slots.values()
        if held.slot.holds in CONTAINER_TYPES and held.tensors >= 2 and held.tensor_bytes >= MIB
    ]
    return max(caches, key=lambda held: held.tensor_bytes, default=None)


def suspect_path(stats: RootStats, kind: str) -> str:
    """Where a suspect is shown: the cache a function keeps, else a graph-holding tensor, else the first."""
    cache = cache_slot(stats) if kind == "tensor-cache" else None
    if cache is not None and cache.first_tensor_path is not None:
        return cache.first_tensor_path
    return (stats.graph_paths or [stats.first_tensor_path or stats.path])[0]


def slot_holding(stats: RootStats, path: str) -> tuple[str, SlotStats] | None:
    """The innermost function slot on `path` (by the slot's own path), or None."""
    entered = [
        (slot_path, held) for slot_path, held in stats.slots.items()
        if path == slot_path or (path.startswith(slot_path) and path[len(slot_path)] in ".[{")
    ]
    return max(entered, key=lambda found: len(found[0]), default=None)


def fix_for(stats: RootStats, kind: str, sources: list[str]) -> str:
    """The line to change, specific to what was found; from the user's own code where it is found."""
    if kind in fixes.RELEASE_FIXES:
        return fixes.RELEASE_FIXES[kind]
    path = suspect_path(stats, kind)
    held = slot_holding(stats, path)
    if held is None:
        return fixes.holder_fix(stats, kind, container_path(path), sources)
    slot_path, slot_stats = held
    inner = None if path == slot_path else container_path(path)[len(slot_path):]
    return fixes.function_fix(kind, stats, slot_stats, inner, sources)


def fix_elsewhere(name: str, path: str, kind: str) -> str:
    """The fix for a holder found searching back from its tensors (`kind`: the root it was found at)."""
    return fixes.fix_elsewhere(name, container_path(path), kind)


def suspects_from_scan(
    result: ScanResult, sources: list[str], baseline: dict[str, int] | None = None
) -> list[Suspect]:
    """Suspects, largest first. `baseline` (retained bytes per name at cell start) sets `new_in_cell`."""
    return suspects_from_stats(result.roots, sources, baseline)


def suspects_from_stats(
    measured: Sequence[RootStats], sources: list[str], baseline: dict[str, int] | None = None
) -> list[Suspect]:
    """Suspects among the roots a scan measured, largest first (`by_retained`; see `suspects_from_scan`)."""
    suspects = []
    for stats in measured:
        kind = classify(stats)
        if kind is None:
            continue
        before = None if baseline is None else baseline.get(stats.name)
        new_in_cell = baseline is not None and (before is None or stats.retained_bytes > before * 1.1 + 65536)
        if kind == "tensor-cache" and baseline is not None and not new_in_cell:
            continue  # a cache that did not grow here is the user's data, not this cell's leak
        suspects.append(
            Suspect(
                name=stats.name,
                path=suspect_path(stats, kind),
                kind=kind,
                tensors=stats.tensors,
                graph_nodes=stats.graph_nodes,
                retained_bytes=stats.retained_bytes,
                new_in_cell=new_in_cell,
                fix=fix_for(stats, kind, sources),
                retained_by_resource=stats.retained_by_resource(),
            )
        )
    return list(by_retained(suspects))


def grown_place(stats: RootStats, before: dict[str, int] | None) -> str | None:
    """Where a holder's tensors grew most since `before` (its places then). The items of one container
    (places that differ in their last index only: a list of `(embedding, label)` pairs) grew together,
    so they count as one, named at the last of its items the scan met: hundreds of small items outgrow
    one larger place filled once (an optimizer's state)."""
    earlier = before or {}
    grown: dict[str, tuple[int, str]] = {}  # container (or the place itself) -> (its growth, its last item)
    for place, nbytes in stats.places.items():
        container = container_path(place)
        total, _ = grown.get(container, (0, place))
        grown[container] = (total + nbytes - earlier.get(place, 0), place)
    most = max(grown, key=lambda c: (grown[c][0], c), default=None)
    return grown[most][1] if most is not None and grown[most][0] > 0 else None


def growing_suspect(
    stats: RootStats, sources: list[str], baseline: dict[str, int], before: dict[str, int] | None,
    growing: bool = True,
) -> Suspect | None:
    """A holder that no rule of `classify` names but that grew: `growing`, its scans during the run saw
    it grow with the steps (a buffer a module re-registers bigger at each step; a module's parameters
    and an optimizer's state, filled once, do not grow); else, unmeasured during the run (too big to
    rescan between steps), a container inside it filled with >= 1 MiB of tensors since the scan before
    the run (no-grad validation outputs in a LightningModule's list). Named at the place that grew."""
    place = grown_place(stats, before)
    if place is None or classify(stats) is not None:
        return None
    if not growing and not (
        place in stats.container_places and stats.places[place] - (before or {}).get(place, 0) >= MIB
    ):
        return None  # unmeasured during the run: only a container filled with >= 1 MiB in the cell is one
    if fixes.kept_until_reset(stats, place):
        fix = fixes.reset_fix(stats.name)
    else:
        fix = fixes.grown_place_fix(container_path(place), stats.scalar_tensors == stats.tensors, sources)
    before_bytes = baseline.get(stats.name)
    return Suspect(
        name=stats.name, path=place, kind="tensor-cache", tensors=stats.tensors, graph_nodes=stats.graph_nodes,
        retained_bytes=stats.retained_bytes, new_in_cell=before_bytes is None or stats.retained_bytes > before_bytes,
        fix=fix, retained_by_resource=stats.retained_by_resource(),
    )


def baseline_of(result: ScanResult) -> dict[str, int]:
    return {stats.name: stats.retained_bytes for stats in result.roots}


def memcheck_result(expr: str, result: ScanResult, sources: list[str], namespace: bool = False) -> MemcheckResult:
    """The `%memcheck` / `memcheck()` result for a scan of one object (or the whole namespace)."""
    stats = result.roots
    suspects = suspects_from_scan(result, sources) if namespace else []
    if not namespace:
        for s in stats:
            kind = classify(s) or ("autograd-graph" if s.graph_tensors else None)
            if kind:
                suspects.append(
                    Suspect(s.name, suspect_path(s, kind), kind, s.tensors, s.graph_nodes, s.retained_bytes, False,
                            fix_for(s, kind, sources), retained_by_resource=s.retained_by_resource())
                )
    advice = memcheck_advice(expr, stats, suspects, NODE_BYTES)
    if result.truncated:
        advice.append(truncated_scan(result.objects))
        advice.extend(result.notes[:5])
    if result.skipped:
        advice.append(skipped_objects(result.skipped))
    return MemcheckResult(
        expr=expr,
        tensors=sum(s.tensors for s in stats),
        bytes=sum(s.tensor_bytes for s in stats),
        graph_tensors=sum(s.graph_tensors for s in stats),
        graph_nodes=sum(s.graph_nodes for s in stats),
        retained_bytes=sum(s.retained_bytes for s in stats),
        devices=tuple(result.devices),
        truncated=result.truncated or result.findings_truncated,
        findings=tuple(result.findings),
        advice=tuple(advice),
        estimated=any(s.graph_estimated for s in stats),
        skipped_objects=result.skipped,
        suspects=tuple(suspects) if namespace else (),
        elapsed_s=result.elapsed_s,
    )
