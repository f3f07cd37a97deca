"""The traversal from a scan's roots to every tensor they reach, then the walk of their graphs.

Depth-first from each root, bounded in depth, objects per root and in all, children per container
and time; a stop on any bound sets `truncated`. The inner loops are tuned for namespaces of millions
of objects: builtin containers are iterated at C level, each type's category is cached, plain-data
records are counted without being visited, and paths stay lazy until a tensor is found.
"""

from __future__ import annotations

import re
import sys
import time
from itertools import chain, count, islice, repeat
from collections.abc import Iterable
from typing import Any

from ...core.model import TensorFinding
from .autograd import GraphWalker, ReachedTensor
from .deadline import Deadline
from .introspect import (
    ATOMIC,
    ATOMIC_EXACT,
    ATTR,
    CLASS,
    FUNCTION,
    INDEX,
    KEY,
    KEY_OBJECT,
    MAPPING,
    METHOD,
    OBJECT,
    SEQUENCE,
    SKIP,
    TENSOR,
    StorageKey,
    TypeCategories,
    children,
    class_containers,
    flat_records_in_bulk,
    in_shared_memory,
    is_user_class,
    plain_data_containers,
    tensor_storage,
    type_name,
)
from .paths import LazyPath, innermost_slot, path_text, pretty_path
from .plain_lists import MIN_ITEMS, PlainListMemo
from .results import MAX_PLACES, NODE_BYTES, Budget, FunctionSlot, Root, RootStats, ScanResult, SlotStats

# A tensor reachable from several names is counted for the first: user names before IPython's caches.
_KIND_ORDER = {"user": 0, "output-cache": 1, "traceback": 2}
_CALLABLES = frozenset({FUNCTION, METHOD})  # they reach what they capture: its user, not its owner
#: a container's items are checked in bulk from this many on, in chunks of BULK_CHUNK (each chunk a
#: list of references, a quarter of a MiB: the time budget is checked between two)
BULK_MIN_ITEMS = 64
BULK_CHUNK = 1 << 15
_LAST_ITEM = re.compile(r"(\[[^\[\]]*\]|\{…\}|\.keys\(\)\[[^\[\]]*\])$")  # `[3]`, `['val']`, a set's `{…}`


def _resettable(obj: Any) -> bool:
    """Whether `obj`'s class defines a `reset` function (looked up in the classes' own dictionaries: no
    attribute code of the user's runs)."""
    try:
        found = next((vars(cls)["reset"] for cls in type(obj).__mro__ if "reset" in vars(cls)), None)
        return callable(found)
    except Exception:
        return False


#: how deep into the process' machinery a root that is part of it is read (its handlers' own fields)
MACHINERY_DEPTH = 2


def scan_roots(
    roots: list[Root], budget: Budget | None = None, seen: Iterable[int] = (), plain_lists: PlainListMemo | None = None
) -> ScanResult:
    """Scan `roots` within `budget`; returns numbers and paths only (no references). The objects whose
    ids are in `seen` count as visited already: what other names hold is not blamed on these roots.
    With `plain_lists` (the scans during a run), long lists of plain records are checked from where the
    last scan with the same memo stopped."""
    scanner = Scanner(budget or Budget(), plain_lists)
    scanner.mark_seen(seen)
    return scanner.scan(roots)


class Scanner:
    """One scan over a list of roots. Use `scan_roots()`."""

    def __init__(self, budget: Budget, plain_lists: PlainListMemo | None = None) -> None:
        self.budget = budget
        self._plain_lists = plain_lists
        if plain_lists is not None:
            plain_lists.next_scan()
        self.torch: Any = sys.modules.get("torch")  # never imported here: no torch, no tensors
        self._categories = TypeCategories(self.torch)
        self._visited: set[int] = set()
        self._storages: set[StorageKey] = set()  # storages counted so far, so each counts once
        self._tensors: list[ReachedTensor] = []
        self._devices: set[str] = set()
        self.objects = 0  # visited one by one (what the object budget limits)
        self.plain_objects = 0  # plain-data containers counted in bulk
        self.skipped = 0
        self.truncated = False
        self.notes: list[str] = []
        self._deadline = Deadline(0.0)
        self._machinery_depth = -1  # while a root that is the process' machinery is traversed: how deep into it
        self._walker: GraphWalker | None = None

    def mark_seen(self, ids: Iterable[int]) -> None:
        self._visited.update(ids)

    def scan(self, roots: list[Root]) -> ScanResult:
        try:
            if self.torch is None:
                return self._scan(roots)
            with self.torch._C.DisableTorchFunctionSubclass():  # no tensor subclass' Python code runs
                return self._scan(roots)
        finally:  # also when a Ctrl-C cuts the scan short: its traceback keeps this scanner
            self._release()

    def _release(self) -> None:
        """Drop every reference to user objects and autograd nodes."""
        if self._walker is not None:
            self._walker.release()
        self._categories.release()
        self._tensors.clear()
        self._visited.clear()

    def _scan(self, roots: list[Root]) -> ScanResult:
        started = time.perf_counter()
        self._deadline = Deadline(self.budget.time_s)
        stats_by_name: dict[str, RootStats] = {}
        roots = sorted(roots, key=self._root_order)
        for root in roots:
            stats = stats_by_name.get(root.name)
            if stats is None:
                holder = type_name(type(root.obj))
                stats = stats_by_name[root.name] = RootStats(root.name, root.kind, root.path, holder, _resettable(root.obj))
            self._traverse(root, stats)
        # after all roots are traversed: saved tensors reachable directly are not "kept by the graph"
        by_root: dict[str, list[ReachedTensor]] = {}
        for entry in self._tensors:
            by_root.setdefault(entry.root.name, []).append(entry)
        walker = self._walker = GraphWalker(
            self.torch, self.budget.graph_node_cap, self._deadline, self._storages, self.budget.sequence_floor
        )
        walker.walk([(stats_by_name[name], entries) for name, entries in by_root.items()])
        result = ScanResult(
            roots=sorted(stats_by_name.values(), key=lambda s: -s.retained_bytes),
            findings=self._findings(),
            findings_truncated=len(self._tensors) > self.budget.max_findings,
            devices=sorted(self._devices),
            objects=self.objects + self.plain_objects,
            skipped=self.skipped + walker.skipped,
            truncated=self.truncated,
            elapsed_s=time.perf_counter() - started,
            notes=self.notes,
            storages=frozenset(self._storages),
        )
        return result

    def _root_order(self, root: Root) -> tuple[int, bool, bool, bool, bool, bool, str]:
        """Which root names what several reach: the owner before a user of it, never the order the roots came in.
        User names before IPython's caches; containers before bare tensors (the `loss` of the last step also
        sits in `history`) and before functions that capture them (`log` fills `outputs`: `outputs` is named);
        classes before the other objects (what a class keeps is shared by every instance: `Recorder.store`,
        not `rec.store`); modules before the rest, which often hold them (a trainer its model, an optimizer its
        parameters): what a module keeps is named at the module, `model.train_outputs`, not through another
        object's private attributes; then public names before `_private` ones, by name."""
        cls = type(root.obj)
        category = self._categories.of(cls)
        module = None if self.torch is None else self.torch.nn.Module
        return (_KIND_ORDER.get(root.kind, 3), category == TENSOR, category in _CALLABLES, not isinstance(root.obj, type),
                module is None or not issubclass(cls, module), root.name.startswith("_"), root.name)

    def _traverse(self, root: Root, stats: RootStats) -> None:
        budget = self.budget
        stack: list[tuple[Any, LazyPath, int]] = [(root.obj, root.path, 0)]
        categories = self._categories.known
        category_of = self._categories.of
        visited = self._visited
        torch = self.torch
        # C-level getters; only tensors use them, and there are none without torch
        tensor_grad: Any = torch._C.TensorBase.grad.__get__ if torch is not None else None
        tensor_is_leaf: Any = torch._C.TensorBase.is_leaf.__get__ if torch is not None else None
        # a root that is the process' machinery (a `logging.Logger` in a notebook name) is read two levels
        # into it, its own machinery included (`log.handlers[0].buffer`); reached from anything else, skipped
        machinery_depth = self._machinery_depth = MACHINERY_DEPTH if self._categories.is_machinery(type(root.obj)) else -1
        while stack:
            obj, path, depth = stack.pop()
            oid = id(obj)
            if oid in visited:
                continue
            category = categories.get(type(obj)) or category_of(type(obj))
            if category is SKIP and depth == 0 and is_user_class(obj, self._categories):
                category = CLASS  # a class the user named: what it keeps for its instances
            elif category is SKIP and depth <= machinery_depth and self._categories.is_machinery(type(obj)):
                category = OBJECT
            elif category is ATOMIC or category is SKIP:
                continue
            visited.add(oid)
            self.objects += 1
            stats.objects += 1
            if stats.objects > budget.max_objects_per_root or self.objects > budget.max_objects or (
                stats.objects % 1024 == 0 and self._deadline.passed()
            ):
                stats.truncated = self.truncated = True
                return
            try:
                if category == TENSOR:
                    self._record_tensor(obj, path, stats)
                    grad = tensor_grad(obj) if tensor_is_leaf(obj) else None
                    if grad is not None:
                        stack.append((grad, (path, ATTR, "grad"), depth + 1))
                    continue
                if depth >= budget.max_depth:
                    stats.truncated = self.truncated = True
                    continue
                stack.extend(reversed(self._expandable_children(obj, category, path, depth + 1, stats)))
            except Exception:  # introspection of this object failed: skip it, count it
                self.skipped += 1

    def _expandable_children(
        self, obj: Any, category: str, path: LazyPath, depth: int, stats: RootStats
    ) -> list[tuple[Any, LazyPath, int]]:
        """Children worth visiting, in order. Past `max_children` non-tensor children of one container,
        only tensors are still taken, so one huge container cannot starve its siblings. Builtin
        containers of plain data (a record `{"id": 3, "tags": (3, 7)}`) are counted here, not visited."""
        out: list[tuple[Any, LazyPath, int]] = []
        others, limit, visited, cls = 0, self.budget.max_children, self._visited, type(obj)
        categories, category_of = self._categories.known, self._categories.of
        plain_objects = start = 0
        memo = self._plain_lists if cls is list and len(obj) >= MIN_ITEMS else None
        if memo is not None:
            start, plain_objects = memo.known_prefix(obj, self._still_plain)
        if cls is list or cls is tuple or cls is dict:
            start, in_bulk = self._plain_in_bulk(obj, cls, start)
            plain_objects += in_bulk
            if start < len(obj) and self._deadline.passed():
                stats.truncated = self.truncated = True
                if memo is not None:
                    memo.remember(obj, plain_objects, checked=start)  # the next scan goes on from here
                self.plain_objects += plain_objects
                stats.plain_objects += plain_objects
                return out
        items = self._items(obj, cls, category, start, (path, depth, out))
        all_plain = memo is not None
        for i, (child, how, token) in enumerate(items):
            if i & 0x3FFF == 0x3FFF and self._deadline.passed():  # plain data skips the checks below
                stats.truncated = self.truncated = True
                if all_plain:
                    memo.remember(obj, plain_objects, checked=start + i)  # type: ignore[union-attr]
                all_plain = False
                break
            child_type = type(child)
            child_category = categories.get(child_type) or category_of(child_type)
            if child_category is ATOMIC or child_category is SKIP and not (
                depth <= self._machinery_depth and self._categories.is_machinery(child_type)
            ):
                continue
            if child_category is SEQUENCE or child_category is MAPPING:
                plain = plain_data_containers(child, child_type)
                if plain:  # holds no tensor: counted (again, if reached twice), never visited
                    plain_objects += plain
                    continue
            all_plain = False
            if id(child) in visited:
                continue
            if child_category is not TENSOR:
                others += 1
                if others > limit:
                    if others == limit + 1:
                        stats.truncated = self.truncated = True
                        self.notes.append(f"{path_text(path)}: only its first {limit:,} non-tensor items were scanned")
                    continue
            out.append((child, (path, how, token), depth))
        if all_plain:
            memo.remember(obj, plain_objects)  # type: ignore[union-attr]
        self.plain_objects += plain_objects  # cheap: not held against the object budget
        stats.plain_objects += plain_objects
        return out

    def _items(
        self, obj: Any, cls: type, category: str, start: int, keys_to: tuple[LazyPath, int, list[tuple[Any, LazyPath, int]]]
    ) -> Any:
        """(child, how, token) of each child of `obj` from item `start` on; a dict's keys that are objects (an
        optimizer's state is keyed by parameters) go straight to `keys_to`'s list, at its path and depth."""
        if cls is list or cls is tuple:  # exact builtins: C-level iteration, no generator frame
            return zip(islice(obj, start, None), repeat(INDEX), count(start)) if start else zip(obj, repeat(INDEX), count())
        if cls is dict:
            path, depth, out = keys_to
            if not ATOMIC_EXACT.issuperset(map(type, obj)):
                visited = self._visited
                for key in obj:
                    if type(key) not in ATOMIC_EXACT and id(key) not in visited:  # e.g. optimizer state
                        out.append((key, (path, KEY_OBJECT, key), depth))
            return zip(islice(obj.values(), start, None), repeat(KEY), islice(obj.keys(), start, None))
        if category is OBJECT:  # its attributes, then what its classes keep for every instance
            return chain(children(obj, category), self._categories.class_children(cls))
        if category is CLASS:
            return class_containers(obj, own_only=True)
        return children(obj, category)

    def _plain_in_bulk(self, obj: Any, cls: type, start: int) -> tuple[int, int]:
        """(where the item-by-item check resumes, plain containers before it): a long exact list, tuple
        or dict's items from `start` are checked in chunks at C level while each chunk is flat records
        (`flat_records_in_bulk`); the first chunk holding anything else, and the rest, are checked item
        by item. Stops early once the scan's time is up (the caller reports it)."""
        length = len(obj)
        if length - start < BULK_MIN_ITEMS:
            return start, 0
        values = islice(obj.values(), start, None) if cls is dict else None
        plain = 0
        while start < length:
            chunk = list(islice(values, BULK_CHUNK)) if values is not None else obj[start : start + BULK_CHUNK]
            found = flat_records_in_bulk(chunk)
            if found is None:
                break
            plain += found
            start += len(chunk)
            if self._deadline.passed():
                break
        return start, plain

    def _still_plain(self, item: Any) -> bool:
        """Whether an item of a list checked before is still atomic or plain data (a spot check)."""
        item_type = type(item)
        category = self._categories.of(item_type)
        if category is ATOMIC or category is SKIP:
            return True
        return (category is SEQUENCE or category is MAPPING) and plain_data_containers(item, item_type) > 0

    def _record_tensor(self, t: Any, lazy_path: LazyPath, root: RootStats) -> None:
        path = pretty_path(path_text(lazy_path))
        key, nbytes = tensor_storage(t)
        counted = key not in self._storages
        self._storages.add(key)
        self._devices.add(str(t.device))
        scalar = t.numel() == 1
        root.tensors += 1
        if counted:
            root.tensor_bytes += nbytes
            if t.device.type != "cpu":
                root.accelerator_bytes += nbytes
            elif nbytes and in_shared_memory(t):
                root.shared_bytes += nbytes
        if root.first_tensor_path is None:
            root.first_tensor_path = path
        if scalar:
            root.scalar_tensors += 1
        if counted and nbytes:
            self._record_place(root, path, nbytes)
        slot = innermost_slot(lazy_path)
        if slot is not None:
            self._record_in_slot(root, slot[0], slot[1], path, nbytes if counted else 0, scalar)
        self._tensors.append(ReachedTensor(path, root, t, nbytes, counted))

    @staticmethod
    def _record_place(root: RootStats, path: str, nbytes: int) -> None:
        """Count a tensor's bytes against its place: the container it is an item of, else itself
        (`net.seen`, `model[0].weight`: a module's registered tensors are its attributes)."""
        place = _LAST_ITEM.sub("", path) or path
        places = root.places
        if place in places:
            places[place] += nbytes
        elif len(places) < MAX_PLACES:
            places[place] = nbytes
            if place != path:
                root.container_places.add(place)

    @staticmethod
    def _record_in_slot(
        root: RootStats, slot_path: str, slot: FunctionSlot, path: str, nbytes: int, scalar: bool
    ) -> None:
        """Count a tensor against the function slot that holds it, so a cache kept by a function is
        told apart from what else the root holds (a model it calls, a constant it uses)."""
        held = root.slots.get(slot_path)
        if held is None:
            held = root.slots[slot_path] = SlotStats(slot, first_tensor_path=path)
        held.tensors += 1
        held.tensor_bytes += nbytes
        if scalar:
            held.scalar_tensors += 1

    def _findings(self) -> list[TensorFinding]:
        out = []
        for entry in self._tensors[: self.budget.max_findings]:
            t = entry.tensor
            grad_fn = t.grad_fn
            nbytes = entry.nbytes if entry.counted else 0
            out.append(
                TensorFinding(
                    path=entry.path,
                    shape=tuple(int(s) for s in t.shape),
                    dtype=str(t.dtype).removeprefix("torch."),
                    device=str(t.device),
                    bytes=nbytes,
                    requires_grad=bool(t.requires_grad),
                    grad_fn=None if grad_fn is None else type_name(type(grad_fn)),
                    graph_nodes=entry.graph_nodes,
                    retained_bytes=nbytes + entry.graph_saved_bytes + entry.graph_nodes * NODE_BYTES,
                )
            )
        return out
