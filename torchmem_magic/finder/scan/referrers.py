"""Who holds a tensor: a search backwards from live tensors, through the garbage collector's referrers, to
the nearest root.

The leak finder's scan walks forwards from the notebook's names, through the containers and objects it
knows how to expand. Memory held anywhere else (a C object that keeps Python objects, such as a
`functools.lru_cache`; a registry of the standard library, such as a logging handler's buffer; a thread's
running function; a module's global) is invisible to it. Searching backwards finds it: from the largest
storages' tensors, one level at a time for all of them together (one pass over the collector's objects a
level, whatever the number of tensors), up to the first object that is a root:

- one of the caller's roots (a notebook name, a script's local: the leak finder's roots), a module's global (its `__dict__`), a class attribute (a class's
  namespace), a local variable of a function running in a thread (read from the threads' frames: a
  running frame does not show its locals to the collector);
- on the way there, a known registry: a `logging.Handler` (kept by the logging machinery), a
  `functools.lru_cache` (its cache lives in C), the `weakref.finalize` registry.

Searched only where a leak has no holder: each level is a pass over every object the collector tracks.
It keeps ids while it runs and returns names and paths; each root's object goes back to the caller only
to be measured.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import types
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from ...core.package import PACKAGE_DIR
from ...render.advice.fixes import LRU_CACHE
from .introspect import StorageKey, boundary_types, is_boundary, tensor_storage
from .results import Root

MAX_LEVELS = 12  # referrer levels searched from a tensor
MAX_FRONTIER = 4_000  # objects searched from at one level
MAX_STORAGES = 256  # storages searched from (the largest)
MAX_MEMBER_ITEMS = 64  # items of a public list read into, on a root the scans do not walk
_OPAQUE_TYPES = (types.CodeType, types.ModuleType, types.FrameType)  # the interpreter's bookkeeping: no holder
_DESCRIPTORS = (types.MemberDescriptorType, types.GetSetDescriptorType)  # a C type's fields, `__slots__`


@dataclass(frozen=True)
class HeldElsewhere:
    """A root that keeps tensors alive, found searching backwards."""

    name: str  # what holds them: "memo", "module global cfg.CACHE", "thread 'writer'", "logging handler 'mem'"
    path: str  # from the root to the first tensor it holds
    kind: str  # "notebook", "module-global", "class-attribute", "thread", "registry"
    tensor_bytes: int  # the searched storages it is the nearest root of
    tensors: int
    obj: Any = field(repr=False, compare=False, default=None)  # what to measure: the object under the root
    obj_path: str = ""  # how `obj` is reached: the path's start


@dataclass(frozen=True)
class BackSearch:
    """What a search found and what it covered."""

    held: tuple[HeldElsewhere, ...]
    storages_searched: int
    storages_live: int  # live storages that nothing the forward scan reached holds
    bytes_searched: int  # the searched storages' bytes (the largest MAX_STORAGES of the live ones)
    levels: int
    cut_short: bool  # a limit (time, frontier, levels) stopped it before every searched storage met a root
    elapsed_s: float


def live_storages(excluded: Collection[StorageKey]) -> list[tuple[int, list[Any]]]:
    """(bytes, tensors) of each live storage not `excluded` (what a forward scan counted), largest first:
    every tensor the collector tracks, grouped by its storage."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    tensor_type = torch._C.TensorBase
    by_storage: dict[StorageKey, tuple[int, list[Any]]] = {}
    for obj in gc.get_objects():
        if _is(obj, tensor_type):
            key, size = tensor_storage(obj)
            if size and key not in excluded:
                by_storage.setdefault(key, (size, []))[1].append(obj)
    return sorted(by_storage.values(), key=lambda entry: -entry[0])



def by_size_class(storages: list[tuple[int, list[Any]]], count: int, per_class: int) -> list[tuple[int, list[Any]]]:
    """At most `count` of `storages` to search back from, whose way up costs a fraction of all of them'
    (a level's referrers are found at a cost that grows with the storages searched from). Growth is many
    storages of one size, so the sizes come in order of what all storages of each size hold together, with
    up to `per_class` of each, spread over its storages (the oldest and the newest among them); each stands
    for its share of its size's bytes, so what a search finds keeps the weight of what it reaches."""
    classes: dict[int, list[tuple[int, list[Any]]]] = {}
    for entry in storages:
        classes.setdefault(entry[0], []).append(entry)
    chosen: list[tuple[int, list[Any]]] = []
    for size, members in sorted(classes.items(), key=lambda item: -item[0] * len(item[1])):
        taken = min(per_class, len(members), count - len(chosen))
        if taken <= 0:
            break
        stride = len(members) / taken
        weight = size * len(members) // taken
        chosen.extend((weight, members[int(i * stride)][1]) for i in range(taken))
    return chosen

def _is(obj: Any, kinds: type | tuple[type, ...]) -> bool:
    """isinstance by the object's own type: no `__class__` of the object's is read (a deprecated module
    attribute's proxy warns when it is)."""
    return issubclass(type(obj), kinds)


def _key_of(mapping: Any, child_id: int) -> str | None:
    try:  # a dict's own items, not a subclass' `items()`
        items = dict.items(mapping) if _is(mapping, dict) else mapping.items()
        key = next((key for key, value in list(items) if id(value) == child_id), None)
    except Exception:  # a mapping whose items() raises
        return None
    if key is None or type(key) in (str, int):
        return None if key is None else str(key)
    return f"<{type(key).__name__}>"  # a key's own str() could be any code


def _field_of(obj: Any, child_id: int) -> str | None:
    """The C field or slot of `obj` that holds the object of id `child_id` (a partial's `args`)."""
    for cls in type(obj).__mro__:
        for name, attr in list(vars(cls).items()):
            if _is(attr, _DESCRIPTORS) and not name.startswith("__"):
                try:
                    if id(attr.__get__(obj, type(obj))) == child_id:
                        return name
                except Exception:
                    continue
    return None


def _step(parent: Any, child_id: int) -> str:
    """How `parent` holds the object of id `child_id`, as the path's next part."""
    if _is(parent, dict):
        key = _key_of(parent, child_id)
        return f"[{key!r}]" if key is not None else "[?]"
    if _is(parent, (list, tuple)):
        items = (list if _is(parent, list) else tuple).__iter__(parent)  # not a subclass' `__iter__`
        index = next((i for i, item in enumerate(items) if id(item) == child_id), None)
        return f"[{index}]" if index is not None else "[?]"
    if _is(parent, types.CellType):
        return ".cell_contents"
    if _is(parent, type):
        return ""  # its namespace dict comes next: `Cls` then `['attr']`
    try:
        own = object.__getattribute__(parent, "__dict__")  # not the class's own __getattr__
    except Exception:
        own = None
    if _is(own, dict):
        if id(own) == child_id:
            return ""  # the instance's attributes come next
        name = _key_of(own, child_id)  # an attribute kept in the instance itself (no dict made yet)
        if name is not None:
            return f".{name}"
    name = _field_of(parent, child_id)
    return f".{name}" if name is not None else f" -> {type(parent).__name__}"


def _public_members(obj: Any) -> list[tuple[str, Any]]:
    """An object's public attributes, and the items of those that are lists or tuples, each with its path's
    tail (`.handlers[0]`): read from its instance dict, no property or `__getattr__` called."""
    try:
        own = object.__getattribute__(obj, "__dict__")
    except Exception:
        return []
    members: list[tuple[str, Any]] = []
    if not _is(own, dict):
        return members
    for attr, value in list(dict.items(own)):
        if type(attr) is not str or attr.startswith("_"):
            continue
        members.append((f".{attr}", value))
        if type(value) in (list, tuple):
            members.extend((f".{attr}[{i}]", item) for i, item in enumerate(value[:MAX_MEMBER_ITEMS]))
    return members


def opaque_registry_sizes() -> dict[str, int]:
    """The entries of the interpreter's registries no search can walk (they live in C, untracked by the
    collector): `atexit`'s callbacks. Counted before and after a run: a search that found nothing says where
    they grew."""
    atexit = sys.modules.get("atexit")
    count = getattr(atexit, "_ncallbacks", None)
    return {"atexit": int(count())} if callable(count) else {}


def named_roots(roots: Collection[Root]) -> dict[int, tuple[str, str]]:
    """The roots' (name, path) by the id of their object, and by the ids of the public members of those the
    scans do not walk (the process's machinery, such as a `logging.Logger`): a handler a search finds
    through the logging registry is named by the user's own name for its logger, `log.handlers[0]`."""
    named = {id(r.obj): (r.name, r.path) for r in roots}
    boundaries = boundary_types()
    for r in roots:
        if is_boundary(type(r.obj), boundaries):
            for tail, member in _public_members(r.obj):
                named.setdefault(id(member), (r.name, r.path + tail))
    return named


def _registry(obj: Any) -> str | None:
    """The name of a known registry object met on the way: it says more than the root that keeps it."""
    logging = sys.modules.get("logging")
    if logging is not None and _is(obj, logging.Handler):
        try:  # its attribute itself, not the `name` property (a subclass' code)
            name = object.__getattribute__(obj, "__dict__").get("_name")
        except Exception:
            name = None
        return f"logging handler {name!r}" if isinstance(name, str) else f"logging handler {type(obj).__name__}"
    if type(obj).__name__ == "_lru_cache_wrapper":
        return f"{LRU_CACHE} {getattr(obj, '__qualname__', '?')}"
    return None


class _Roots:
    """The roots by id: the caller's (name and path of each), modules' dicts, and the locals of the threads'
    running functions."""

    def __init__(self, named: dict[int, tuple[str, str]]) -> None:
        self.named = named
        self.modules = {id(vars(m)): n for n, m in list(sys.modules.items()) if _is(m, types.ModuleType)}
        names = {t.ident: t.name for t in threading.enumerate()}
        self.locals: dict[int, tuple[str, str]] = {}  # id of a local's value -> (thread, "function() local name")
        for ident, top in sys._current_frames().items():
            frame: types.FrameType | None = top
            while frame is not None:
                if not frame.f_code.co_filename.startswith(PACKAGE_DIR):
                    where = f"{frame.f_code.co_name}() local "
                    for local, value in list(frame.f_locals.items()):
                        self.locals.setdefault(id(value), (names.get(ident, str(ident)), where + local))
                frame = frame.f_back
        del top

    def of_local(self, obj_id: int) -> tuple[str, str, str] | None:
        found = self.locals.get(obj_id)
        return None if found is None else (f"thread {found[0]!r}", found[1], "thread")

    def describe(self, obj: Any, child_id: int) -> tuple[str, str, str] | None:
        """(name, the path's start, kind) where `obj` is a root that holds the object of id `child_id`."""
        if id(obj) in self.named:
            name, path = self.named[id(obj)]
            return name, path + _step(obj, child_id), "notebook"
        if id(obj) in self.modules:
            key, module = _key_of(obj, child_id), self.modules[id(obj)]
            return None if key is None else (f"module global {module}.{key}", f"{module}.{key}", "module-global")
        if _is(obj, type):
            label = f"{obj.__module__}.{obj.__qualname__}"
            if label == "weakref.finalize":
                return "weakref.finalize registry", label, "registry"
            return f"class attribute {label}", label, "class-attribute"
        return None


@dataclass
class _Search:
    """The search's state: for each object reached, what it was reached from and which storages reach it."""

    storages: list[tuple[int, list[Any]]]
    roots: _Roots
    objects: dict[int, Any] = field(default_factory=dict)
    below: dict[int, int] = field(default_factory=dict)  # id -> id of the object it holds on the way down
    above: dict[int, list[int]] = field(default_factory=dict)  # id -> ids of the objects found holding it
    origins: dict[int, set[int]] = field(default_factory=dict)  # id -> indices of the storages that reach it
    leads: dict[int, HeldElsewhere] = field(default_factory=dict)  # id -> the holder its way up ends at
    holder_of: dict[int, int] = field(default_factory=dict)  # storage index -> index in `found`
    found: list[HeldElsewhere] = field(default_factory=list)

    def join(self, parent_id: int, reaching: set[int]) -> None:
        """Storages that reach an object met before: they lead wherever it leads (up every way found)."""
        pending, seen = [parent_id], set()
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            if current in self.leads:
                self.settle(reaching, self.leads[current])
                continue
            self.origins[current] |= reaching
            pending.extend(self.above.get(current, ()))

    def settle(self, storages: set[int], held: HeldElsewhere) -> None:
        new = storages - self.holder_of.keys()
        if not new:
            return
        size = sum(self.storages[i][0] for i in new)
        count = sum(len(self.storages[i][1]) for i in new)
        match = next((k for k, h in enumerate(self.found) if (h.name, _container(h.path)) == (held.name, _container(held.path))), None)
        if match is None:
            self.found.append(replace(held, tensor_bytes=size, tensors=count))
            match = len(self.found) - 1
        else:
            h = self.found[match]
            self.found[match] = replace(h, tensor_bytes=h.tensor_bytes + size, tensors=h.tensors + count)
        for i in new:
            self.holder_of[i] = match

    def path_down(self, start: Any, child_id: int) -> str:
        path, current, below, attributes = "", start, child_id, False
        while below in self.objects:
            step = _step(current, below)
            if attributes and step.startswith("['") and step.endswith("']"):
                step = f".{step[2:-2]}"  # an instance's (or a class's) namespace dict: its keys are attributes
            attributes = step == ""
            path += step
            current, below = self.objects[below], self.below.get(below, -1)
        return path

    def lead(self, parent_id: int, held: HeldElsewhere) -> None:
        """The objects on the way from a holder down to its tensor lead to it."""
        current: int | None = parent_id
        while current is not None and current not in self.leads:
            self.leads[current] = held
            current = self.below.get(current)

    def held_at(self, parent: Any, child_id: int) -> HeldElsewhere | None:
        """The holder when `parent` is a root or a registry, with the path from it down to a tensor."""
        registry = _registry(parent)
        if registry is not None:
            named = self.roots.named.get(id(parent))
            if named is not None and registry.startswith(LRU_CACHE):
                registry = f"{named[1]} ({LRU_CACHE})"  # the user's own name for their cached function
                return HeldElsewhere(named[0], registry + self.path_down(parent, child_id), "registry", 0, 0, parent,
                                     registry)
            if named is not None:  # a handler of a logger the notebook names: `log.handlers[0]`
                return HeldElsewhere(named[0], named[1] + self.path_down(parent, child_id), "notebook", 0, 0, parent,
                                     named[1])
            return HeldElsewhere(registry, registry + self.path_down(parent, child_id), "registry", 0, 0, parent, registry)
        described = self.roots.describe(parent, child_id)
        if described is None:
            return None
        name, start, kind = described
        if _is(parent, type):  # `Cls` then `.attr`: the path goes on from the class
            path = start + self.path_down(parent, child_id)
            if kind == "class-attribute":
                name = "class attribute " + path.split("[", 1)[0].split(" ", 1)[0]
            return HeldElsewhere(name, path, kind, 0, 0, parent, start)
        tail = self.path_down(parent, child_id)[len(_step(parent, child_id)):]
        under = child_id in self.objects
        return HeldElsewhere(name, start + tail, kind, 0, 0, self.objects.get(child_id, parent),
                             start if under else start[:len(start) - len(_step(parent, child_id))])


def search_back(
    storages: list[tuple[int, list[Any]]], named: dict[int, tuple[str, str]], cpu_s: float = 1.0
) -> BackSearch:
    """Search from the largest `storages` (see `live_storages`) back to their nearest roots; `named`: the
    caller's roots, the (name, path) of each by the id of its object. `cpu_s` bounds the search in this
    thread's CPU time: on a busy machine its wall time stretches, its work does not."""
    started, cpu_started = time.perf_counter(), time.thread_time()
    state = _Search(storages[:MAX_STORAGES], _Roots(named))
    frontier: list[Any] = []
    for index, (_, tensors) in enumerate(state.storages):
        for tensor in tensors:
            state.objects[id(tensor)] = tensor
            state.origins.setdefault(id(tensor), set()).add(index)
            frontier.append(tensor)
    ignore = {id(state.objects), id(state.storages), id(storages), id(sys._getframe())}
    ignore.update(id(part) for entry in storages for part in (entry, entry[1]))
    levels, cut = 0, False
    while frontier and len(state.holder_of) < len(state.storages):
        if levels >= MAX_LEVELS or time.thread_time() - cpu_started > cpu_s:
            cut = True
            break
        levels += 1
        frontier, full = _level(state, frontier, ignore)
        cut = cut or full
    state.roots = _Roots({})  # the threads' locals: let go
    cut = cut or len(state.holder_of) < len(state.storages)
    held = tuple(sorted(state.found, key=lambda h: -h.tensor_bytes))
    searched_bytes = sum(size for size, _ in state.storages)
    return BackSearch(held, len(state.storages), len(storages), searched_bytes, levels, cut, time.perf_counter() - started)


def _level(state: _Search, frontier: list[Any], ignore: set[int]) -> tuple[list[Any], bool]:
    """One level up from `frontier`: the objects to search from next, and whether there were too many."""
    for obj in frontier:  # a local variable of a running function: the collector does not show it
        local = state.roots.of_local(id(obj))
        if local is not None:
            in_thread = HeldElsewhere(local[0], local[1], local[2], 0, 0, obj, local[1])
            state.settle(state.origins[id(obj)], in_thread)
            state.lead(id(obj), in_thread)
    wanted = {id(o) for o in frontier}
    following: list[Any] = []
    ignore.add(id(following))
    ignore.add(id(frontier))
    full = False
    for parent in gc.get_referrers(*frontier):
        if id(parent) in ignore or _is(parent, _OPAQUE_TYPES):
            continue
        children = [c for c in gc.get_referents(parent) if id(c) in wanted]
        reaching = set().union(*(state.origins[id(c)] for c in children)) - state.holder_of.keys()
        if not reaching:
            continue
        child = children[0]
        for each in children:
            state.above.setdefault(id(each), []).append(id(parent))
        if id(parent) in state.objects:  # met from another storage: it leads where it already led
            state.join(id(parent), reaching)
            continue
        state.objects[id(parent)] = parent
        state.below[id(parent)] = id(child)
        state.origins[id(parent)] = set(reaching)
        held = state.held_at(parent, id(child))
        if held is not None:
            state.settle(reaching, held)
            state.lead(id(parent), held)
        elif len(following) < MAX_FRONTIER:
            following.append(parent)
        else:
            full = True
    return following, full


def _container(path: str) -> str:
    """The path up to its first index: `a.b[3].x` and `a.b[7].x` lead into one container."""
    return path.split("[", 1)[0]
