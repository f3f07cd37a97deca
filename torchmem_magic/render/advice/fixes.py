"""The fix each holder gets: the line to change, from the user's own code where it is found (a
function's own names for what it keeps between calls), else the line to write.

The finder decides what a holder is and where its tensors are kept; these word the fix from those facts.
"""

from __future__ import annotations

from typing import Protocol

from ...analysis.fixes import SourceFix, fix_accumulate, fix_append, fix_carry_over, function_sources

_EMPTY = {"list": "[]", "dict": "{}", "set": "set()", "deque": "collections.deque()",
          "OrderedDict": "collections.OrderedDict()", "defaultdict": "collections.defaultdict(list)"}
_TENSOR_TYPES = {"Tensor", "Parameter"}
#: the fixes of what IPython itself keeps, by the holder's kind
RELEASE_FIXES = {
    "output-cache": "torchmem_magic.release_output_cache()  # = %reset -f out, plus the hidden _/__/___ copies",
    "traceback": "torchmem_magic.release_last_exception()  # drops sys.last_* and IPython's copy of the traceback",
}


class Slot(Protocol):
    """Where a function keeps an object between calls, as its code names it."""

    @property
    def kind(self) -> str: ...  # "default", "closure", "attribute" or "class"
    @property
    def function(self) -> str: ...
    @property
    def variable(self) -> str: ...
    @property
    def holds(self) -> str: ...  # the type name of what it held
    @property
    def outer(self) -> str | None: ...


class SlotHeld(Protocol):
    """The tensors a holder reaches through one function slot."""

    @property
    def slot(self) -> Slot: ...
    @property
    def tensors(self) -> int: ...
    @property
    def scalar_tensors(self) -> int: ...


class Holder(Protocol):
    """What a scan measured of one holder, as far as its fix depends on it."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...  # the root's kind: "user", "module", ...
    @property
    def path(self) -> str: ...
    @property
    def resettable(self) -> bool: ...
    @property
    def tensors(self) -> int: ...
    @property
    def scalar_tensors(self) -> int: ...
    @property
    def saved_live(self) -> int: ...
    @property
    def first_tensor_path(self) -> str | None: ...


def with_line(fix: SourceFix | None, fallback: str) -> str:
    """The user's own line fixed, where it was found; else `fallback`."""
    return fallback if fix is None else f"{fix.after}  # was: {fix.before}"


def kept_until_reset(stats: Holder, place: str) -> bool:
    """The tensors are the state of an object that has `reset()` (a metric accumulating its inputs)."""
    return stats.resettable and stats.kind == "user" and place.startswith(f"{stats.path}.")


def reset_fix(name: str) -> str:
    return (f"call {name}.reset() once its value is used (after compute(), at each epoch's end): "
            "it keeps every update's tensors until reset")


def holder_fix(stats: Holder, kind: str, container: str, sources: list[str]) -> str:
    """The fix for a holder kept by name (no function keeps it): `container` keeps its tensors."""
    holds_itself = stats.first_tensor_path == stats.path  # the name is a tensor, not a container
    if kind == "autograd-graph" and holds_itself:
        if stats.scalar_tensors:
            return with_line(
                fix_accumulate(stats.name, sources),
                f"{stats.name} += loss.item()  # accumulate a float: the tensor chains every step's graph",
            )
        return with_line(
            fix_carry_over(stats.name, sources),
            f"{stats.name} = {stats.name}.detach()  # cut the graph carried into the next step",
        )
    if kind == "autograd-graph" and stats.saved_live:  # activations still saved: no backward ran
        found = fix_append(container, "detach", sources)
        where = f" (it fills it with `{found.before}`)" if found else ""
        return f"wrap the code that fills {container} in `with torch.no_grad():`{where}"
    if kind == "tensor-cache":  # no graphs: the tensors themselves are the memory
        if kept_until_reset(stats, container):
            return reset_fix(stats.name)
        if stats.scalar_tensors == stats.tensors:
            return with_line(fix_append(container, "item", sources), f"{container}.append(x.item())  # store numbers")
        return (
            f"keep only what you need: a rolling window `{container} = collections.deque(maxlen=100)`, "
            f"summaries instead of whole tensors, or `del {stats.name}` when done"
        )
    method = "item" if stats.scalar_tensors == stats.tensors else "detach"
    return with_line(
        fix_append(container, method, sources),
        f"{container}.append(x.{method}())  # store {'numbers' if method == 'item' else 'tensors without their graph'}",
    )


def function_fix(kind: str, stats: Holder, slot_stats: SlotHeld, inner: str | None, sources: list[str]) -> str:
    """The fix for what a function keeps between calls, in the function's own names, with the changed
    line from the function's own body where a source shows it. `inner`: where in the slot's object the
    tensors are kept (`['val']`; "" for the object itself); None where the slot's variable is the tensor."""
    slot = slot_stats.slot
    body = function_sources(slot.function, sources)
    if inner is None:  # the variable is the tensor itself
        return f"{_slot_words(slot)} {_carried_tensor_fix(kind, slot_stats, body)}"
    variable = _slot_variable(slot)
    local = variable + inner  # `store`, `self.outputs`, `cache['val']`
    subject = _slot_words(slot) if local == variable else f"`{local}` in {_slot_words(slot)}"
    what = "every tensor and its autograd graph" if kind == "autograd-graph" else "every tensor"
    return f"{subject} keeps {what} across calls: {_remedy(kind, stats, slot_stats, local, body)}"


def _slot_variable(slot: Slot) -> str:
    return f"self.{slot.variable}" if slot.kind in ("attribute", "class") else slot.variable


def _noun(type_name: str) -> str:
    return "tensor" if type_name in _TENSOR_TYPES else type_name


def _slot_words(slot: Slot) -> str:
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


def _remedy(kind: str, stats: Holder, held: SlotHeld, local: str, body: list[str]) -> str:
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


def _storing(kind: str, stats: Holder, method: str, found: SourceFix | None, local: str, function: str) -> str:
    """Store less per call; while no backward ran, not recording the graph at all works too."""
    stored = "numbers" if method == "item" else "tensors without their graph"
    if found is None:
        text = f"store {stored} (`{local}.append(x.{method}())` in {function}())"
    else:
        text = f"store {stored}: `{found.after}` (was `{found.before}`)"
    if kind == "autograd-graph" and stats.saved_live:  # activations still saved: no backward ran
        return f"{text}, or compute them under `with torch.no_grad():`"
    return text


def _carried_tensor_fix(kind: str, held: SlotHeld, body: list[str]) -> str:
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


def grown_place_fix(place: str, scalars: bool, sources: list[str]) -> str:
    """The fix for a place that grew with the steps though no rule names its holder."""
    if f"({LRU_CACHE})" in place:
        return _cache_fix(place.split(" ", 1)[0])
    fallback = (
        f"{place} grows with the steps: keep only what you need (a bounded window, summaries instead of "
        "whole tensors), or clear it when done"
    )
    return with_line(fix_append(place, "item", sources), fallback) if scalars else fallback


LRU_CACHE = "functools.lru_cache"  # how a cached function's cache is called where a search finds it (it lives in C)


def _cache_fix(function: str) -> str:
    return (f"{function} caches every result by its arguments, for good: call {function}.cache_clear(), give "
            "it a maxsize, or cache on plain keys rather than tensors")


def fix_elsewhere(name: str, container: str, kind: str) -> str:
    """The fix for a holder found searching back from its tensors (`kind`: the root it was found at;
    `container`: what keeps them there)."""
    if name.startswith("logging handler"):
        return (f"{name} keeps every record it handles, and a record keeps its arguments (tensors with them): "
                "log numbers (`loss.item()`), or flush and remove the handler")
    if name.startswith(LRU_CACHE) or f"({LRU_CACHE})" in container:
        return _cache_fix(name.rsplit(" ", 1)[-1])  # the cached function's own name, or the wrapper's qualified one
    if name == "weakref.finalize registry":
        return ("a weakref.finalize keeps its callback's arguments until its object is collected: pass the "
                "callback what it needs, not tensors")
    if kind == "thread":
        return (f"{name}'s {container} keeps them while the thread runs: hand them over through a "
                "bounded queue.Queue(maxsize=...), or drop each once written")
    return f"{container} keeps them: clear it (or keep a bounded window) once what it holds has been used"
