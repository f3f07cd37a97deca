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

from ..analysis.fixes import SourceFix, fix_accumulate, fix_append, fix_carry_over, function_sources
from ..core.model import Suspect, by_retained
from ..render.results import MemcheckResult
from .scan.results import NODE_BYTES, FunctionSlot, RootStats, ScanResult, SlotStats

MIB = 1 << 20
CHAIN_NODES = 100  # one tensor with this many graph nodes is a chain growing step by step
CONTAINER_TYPES = {"list", "dict", "tuple", "deque", "set", "defaultdict", "OrderedDict"}
_LAST_SUBSCRIPT = re.compile(r"(\[[^\[\]]*\]|\{…\}|\.keys\(\)\[[^\[\]]*\])$")
_EMPTY = {"list": "[]", "dict": "{}", "set": "set()", "deque": "collections.deque()",
          "OrderedDict": "collections.OrderedDict()", "defaultdict": "collections.defaultdict(list)"}
_TENSOR_TYPES = {"Tensor", "Parameter"}


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


def _with_line(fix: SourceFix | None, fallback: str) -> str:
    return fallback if fix is None else f"{fix.after}  # was: {fix.before}"


def _kept_until_reset(stats: RootStats, place: str) -> bool:
    """The tensors are the state of an object that has `reset()` (a metric accumulating its inputs)."""
    return stats.resettable and stats.kind == "user" and place.startswith(f"{stats.path}.")


def _reset_fix(name: str) -> str:
    return (f"call {name}.reset() once its value is used (after compute(), at each epoch's end): "
            "it keeps every update's tensors until reset")


def fix_for(stats: RootStats, kind: str, sources: list[str]) -> str:
    """The line to change, specific to what was found; from the user's own code where it is found."""
    if kind == "output-cache":
        return "torchmem_magic.release_output_cache()  # = %reset -f out, plus the hidden _/__/___ copies"
    if kind == "traceback":
        return "torchmem_magic.release_last_exception()  # drops sys.last_* and IPython's copy of the traceback"
    path = suspect_path(stats, kind)
    held = slot_holding(stats, path)
    if held is not None:
        return _function_fix(kind, stats, path, held, sources)
    holds_itself = stats.first_tensor_path == stats.path  # the name is a tensor, not a container
    if kind == "autograd-graph" and holds_itself:
        if stats.scalar_tensors:
            return _with_line(
                fix_accumulate(stats.name, sources),
                f"{stats.name} += loss.item()  # accumulate a float: the tensor chains every step's graph",
            )
        return _with_line(
            fix_carry_over(stats.name, sources),
            f"{stats.name} = {stats.name}.detach()  # cut the graph carried into the next step",
        )
    container = container_path(path)
    if kind == "autograd-graph" and stats.saved_live:  # activations still saved: no backward ran
        found = fix_append(container, "detach", sources)
        where = f" (it fills it with `{found.before}`)" if found else ""
        return f"wrap the code that fills {container} in `with torch.no_grad():`{where}"
    if kind == "tensor-cache":  # no graphs: the tensors themselves are the memory
        if _kept_until_reset(stats, container):
            return _reset_fix(stats.name)
        if stats.scalar_tensors == stats.tensors:
            return _with_line(fix_append(container, "item", sources), f"{container}.append(x.item())  # store numbers")
        return (
            f"keep only what you need: a rolling window `{container} = collections.deque(maxlen=100)`, "
            f"summaries instead of whole tensors, or `del {stats.name}` when done"
        )
    method = "item" if stats.scalar_tensors == stats.tensors else "detach"
    return _with_line(
        fix_append(container, method, sources),
        f"{container}.append(x.{method}())  # store {'numbers' if method == 'item' else 'tensors without their graph'}",
    )


def _function_fix(kind: str, stats: RootStats, path: str, held: tuple[str, SlotStats], sources: list[str]) -> str:
    """The fix for what a function keeps between calls, in the function's own names, with the changed
    line from the function's own body where a source shows it."""
    slot_path, slot_stats = held
    slot = slot_stats.slot
    body = function_sources(slot.function, sources)
    if path == slot_path:  # the variable is the tensor itself
        return f"{_slot_words(slot)} {_carried_tensor_fix(kind, slot_stats, body)}"
    variable = _slot_variable(slot)
    local = variable + container_path(path)[len(slot_path):]  # `store`, `self.outputs`, `cache['val']`
    subject = _slot_words(slot) if local == variable else f"`{local}` in {_slot_words(slot)}"
    what = "every tensor and its autograd graph" if kind == "autograd-graph" else "every tensor"
    return f"{subject} keeps {what} across calls: {_remedy(kind, stats, slot_stats, local, body)}"


def _slot_variable(slot: FunctionSlot) -> str:
    return f"self.{slot.variable}" if slot.kind in ("attribute", "class") else slot.variable


def _noun(type_name: str) -> str:
    return "tensor" if type_name in _TENSOR_TYPES else type_name


def _slot_words(slot: FunctionSlot) -> str:
    """The slot as its user knows it: "log()'s default argument `store`", "the list `cache` captured by
    log() (make_logger's closure)", "the list `self.outputs` of the Recorder that record() is bound to"."""
    function = f"{slot.function}()"
    if slot.kind == "default":
        return f"{function}'s default argument `{slot.variable}`"
    if slot.kind == "closure":
        closure = f" ({slot.outer}'s closure)" if slot.outer else ""
        return f"the {_noun(slot.holds)} `{slot.variable}` captured by {function}{closure}"
    if slot.kind == "class":
        return f"the {_noun(slot.holds)} `{slot.outer}.{slot.variable}`, a class attribute every {slot.outer} shares,"
    owner = slot.outer or "object"
    return f"the {_noun(slot.holds)} `self.{slot.variable}` of the {owner} that {function} is bound to"


def _remedy(kind: str, stats: RootStats, held: SlotStats, local: str, body: list[str]) -> str:
    """A default argument is made per call (and, to keep a history, holds less); a closure's or an
    object's container holds less: numbers, tensors without their graph, or a rolling window."""
    slot = held.slot
    method = "item" if held.scalar_tensors == held.tensors else "detach" if kind == "autograd-graph" else None
    found = fix_append(local, method, body) if method else None
    if slot.kind == "default":
        name, empty = slot.variable, _EMPTY.get(slot.holds, "...")
        fresh = f"use `{name}=None` and create the {_noun(slot.holds)} inside (`if {name} is None: {name} = {empty}`)"
        if method is None or found is None:
            return fresh
        return f"{fresh}; to keep a history, {_storing(kind, stats, method, found, local, slot.function)}"
    if slot.kind == "class":  # lives as long as the class: one per instance goes with its instance
        own = f"give each instance its own (`self.{slot.variable} = {_EMPTY.get(slot.holds, '...')}` in `__init__`)"
        if method is None:
            return f"{own} and keep only what you need"
        return f"{own}, and {_storing(kind, stats, method, found, local, slot.function)}"
    if method is None:  # no graphs, not numbers: the tensors themselves are the memory
        return (
            f"keep only what you need (a rolling window `{local} = collections.deque(maxlen=100)`, "
            "or summaries instead of whole tensors)"
        )
    return _storing(kind, stats, method, found, local, slot.function)


def _storing(kind: str, stats: RootStats, method: str, found: SourceFix | None, local: str, function: str) -> str:
    """Store less per call; while no backward ran, not recording the graph at all works too."""
    stored = "numbers" if method == "item" else "tensors without their graph"
    if found is None:
        text = f"store {stored} (`{local}.append(x.{method}())` in {function}())"
    else:
        text = f"store {stored}: `{found.after}` (was `{found.before}`)"
    if kind == "autograd-graph" and stats.saved_live:  # activations still saved: no backward ran
        return f"{text}, or compute them under `with torch.no_grad():`"
    return text


def _carried_tensor_fix(kind: str, held: SlotStats, body: list[str]) -> str:
    """A tensor a function keeps as such (`nonlocal total; total += loss`) chains every call's graph."""
    variable = _slot_variable(held.slot)
    if kind != "autograd-graph":
        return f"keeps this tensor across calls: set `{variable} = None` once it is no longer needed"
    if held.scalar_tensors:
        fix, fallback = fix_accumulate(variable, body), f"{variable} += loss.item()"
    else:
        fix, fallback = fix_carry_over(variable, body), f"{variable} = {variable}.detach()"
    line = f"`{fallback}`" if fix is None else f"`{fix.after}` (was `{fix.before}`)"
    return f"chains every call's autograd graph: {line}"


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
            )
        )
    return list(by_retained(suspects))


def grown_place(stats: RootStats, before: dict[str, int] | None) -> str | None:
    """Where a holder's tensors grew most since `before` (its places then), or its largest place."""
    earlier = before or {}
    growth = {place: nbytes - earlier.get(place, 0) for place, nbytes in stats.places.items()}
    place = max(growth, key=lambda p: (growth[p], p), default=None)
    return place if place is not None and growth[place] > 0 else None


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
    fallback = (
        f"{place} grows with the steps: keep only what you need (a bounded window, summaries instead of "
        "whole tensors), or clear it when done"
    )
    scalars = stats.scalar_tensors == stats.tensors
    fix = _with_line(fix_append(place, "item", sources), fallback) if scalars else fallback
    if _kept_until_reset(stats, place):
        fix = _reset_fix(stats.name)
    before_bytes = baseline.get(stats.name)
    return Suspect(
        name=stats.name, path=place, kind="tensor-cache", tensors=stats.tensors, graph_nodes=stats.graph_nodes,
        retained_bytes=stats.retained_bytes, new_in_cell=before_bytes is None or stats.retained_bytes > before_bytes,
        fix=fix,
    )


def baseline_of(result: ScanResult) -> dict[str, int]:
    return {stats.name: stats.retained_bytes for stats in result.roots}


def _advice(stats: list[RootStats], suspects: list[Suspect]) -> list[str]:
    advice = [f"{s.name}: {s.fix}" for s in suspects]
    if any(s.graph_estimated for s in stats):
        chains = [s for s in stats if s.graph_estimated and s.graph_tensors == 1]
        for s in chains:
            advice.append(
                f"{s.name} is an autograd chain of ~{s.graph_nodes:,} nodes (an estimate: only part of it "
                "was walked, since touching very long chains from Python can crash their deletion)"
            )
        if len(chains) < sum(1 for s in stats if s.graph_estimated):
            advice.append("graph figures are estimates: some graphs were sampled, not walked in full")
    freed = sum(s.saved_freed for s in stats)
    if freed and not sum(s.saved_live for s in stats):
        advice.append(
            f"the graphs' saved activations were already freed by backward ({freed} saved tensors): "
            f"what stays is the graph nodes themselves, ~{NODE_BYTES} B each"
        )
    return advice


def memcheck_result(expr: str, result: ScanResult, sources: list[str], namespace: bool = False) -> MemcheckResult:
    """The `%memcheck` / `memcheck()` result for a scan of one object (or the whole namespace)."""
    stats = result.roots
    suspects = suspects_from_scan(result, sources) if namespace else []
    if not namespace:
        for s in stats:
            kind = classify(s) or ("autograd-graph" if s.graph_tensors else None)
            if kind:
                suspects.append(
                    Suspect(s.name, suspect_path(s, kind), kind, s.tensors,
                            s.graph_nodes, s.retained_bytes, False, fix_for(s, kind, sources))
                )
    advice = _advice(stats, suspects)
    if not any(s.tensors for s in stats):
        advice.insert(0, f"{expr or 'the namespace'} holds no tensors")
    if result.truncated:
        advice.append(f"the scan stopped early (budget: {result.objects:,} objects); figures cover what was reached")
        advice.extend(result.notes[:5])
    if result.skipped:
        advice.append(f"{result.skipped} object(s) could not be inspected and were skipped")
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



def fix_elsewhere(name: str, path: str, kind: str) -> str:
    """The fix for a holder found searching back from its tensors (`kind`: the root it was found at)."""
    if name.startswith("logging handler"):
        return (f"{name} keeps every record it handles, and a record keeps its arguments (tensors with them): "
                "log numbers (`loss.item()`), or flush and remove the handler")
    if name.startswith("functools.lru_cache"):
        function = name.rsplit(" ", 1)[-1]
        return (f"{function} caches every result by its arguments, for good: call {function}.cache_clear(), give "
                "it a maxsize, or cache on plain keys rather than tensors")
    if name == "weakref.finalize registry":
        return ("a weakref.finalize keeps its callback's arguments until its object is collected: pass the "
                "callback what it needs, not tensors")
    if kind == "thread":
        return (f"{name}'s {container_path(path)} keeps them while the thread runs: hand them over through a "
                "bounded queue.Queue(maxsize=...), or drop each once written")
    return f"{container_path(path)} keeps them: clear it (or keep a bounded window) once what it holds has been used"
