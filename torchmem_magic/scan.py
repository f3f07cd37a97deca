"""Find the tensors and autograd graphs that objects keep alive, without running user code.

`gc.get_referrers`, objgraph and pympler stop at the C++ autograd graph; this walks it. Traversal
only ever calls C-level accessors chosen by the object's *type* (list/dict/... base-class methods,
the instance-dict and slot descriptors, closure cells, frame locals): no properties, no
`__getattr__`, no `__len__`/`__iter__`/`__eq__`/`__hash__` of user classes (visited sets hold ids).
It is bounded in depth, objects, graph nodes and time, and says so when it stops early.

Autograd graphs: from each tensor's `grad_fn`, `next_functions` and the nodes' saved tensors
(`_raw_saved_*`, whose `.data` is None once backward freed them). At most `graph_node_cap` nodes
are touched per root: touching ~45k nodes of a linear chain from Python makes its later deletion
overflow the C stack (FACTS.md), so long chains are walked in part and extrapolated.

Only ids and numbers survive a scan; every reference to a user object is dropped when it returns.
"""

from __future__ import annotations

import re
import sys
import time
import types
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count, repeat
from typing import Any

from .model import TensorFinding

NODE_BYTES = 700  # a retained autograd node costs ~600-800 B of heap (measured, FACTS.md)
ATOMIC = "atomic"
SKIP = "skip"
TENSOR = "tensor"
SEQUENCE = "sequence"
MAPPING = "mapping"
SET = "set"
FUNCTION = "function"
METHOD = "method"
CELL = "cell"
FRAME = "frame"
TRACEBACK = "traceback"
GENERATOR = "generator"
EXCEPTION = "exception"
OBJECT = "object"
INDEX, KEY, ATTR, SUFFIX = "index", "key", "attr", "suffix"
# A path is built only when a tensor is found: the root's text, then (parent, how, token) links.
_Path = Any

_ATOMIC_TYPES = (int, float, complex, bool, str, bytes, bytearray, type(None), range, slice, type(Ellipsis))
_ATOMIC_EXACT = frozenset({int, float, complex, bool, str, bytes, type(None)})  # for C-level `issuperset` checks
_ATOMIC_OR_SEQUENCE = _ATOMIC_EXACT | {tuple, list}
_SKIP_TYPES: tuple[type, ...] = (
    type, types.ModuleType, types.BuiltinFunctionType, types.MethodWrapperType, types.WrapperDescriptorType,
    types.MethodDescriptorType, types.GetSetDescriptorType, types.MemberDescriptorType, types.CodeType,
    property, classmethod, staticmethod, memoryview,
)
_GENERATOR_TYPES = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)

_type_name = type.__dict__["__name__"].__get__
_type_mro = type.__dict__["__mro__"].__get__
_type_dict = type.__dict__["__dict__"].__get__
_function_closure = types.FunctionType.__closure__.__get__  # type: ignore[attr-defined]
_function_defaults = types.FunctionType.__defaults__.__get__  # type: ignore[attr-defined]
_method_self = types.MethodType.__self__.__get__  # type: ignore[attr-defined]
_method_func = types.MethodType.__func__.__get__  # type: ignore[attr-defined]
_cell_contents = types.CellType.cell_contents.__get__  # type: ignore[attr-defined]
_frame_locals = types.FrameType.f_locals.__get__  # type: ignore[attr-defined]
_tb_frame = types.TracebackType.tb_frame.__get__  # type: ignore[attr-defined]
_tb_next = types.TracebackType.tb_next.__get__  # type: ignore[attr-defined]
_frame_globals = types.FrameType.f_globals.__get__  # type: ignore[attr-defined]


def _is_ours(cls: type) -> bool:
    """This package's own objects (a session bound by `with memwatch() as w`, a report): they hold no
    user memory, but a session's root provider reaches the whole namespace, which would be blamed on it."""
    module = _type_dict(cls).get("__module__")
    return type(module) is str and (module == __package__ or module.startswith(f"{__package__}."))


def _plain_data_containers(obj: Any, cls: type) -> int:
    """How many containers `obj` is if it is an exact list/tuple/dict of numbers and strings, at most
    one level nested (a dataset record), else 0. C-level type checks only: such data holds no tensor."""
    if cls is tuple or cls is list:
        values: Any = obj
    elif cls is dict:
        if not _ATOMIC_EXACT.issuperset(map(type, obj)):
            return 0
        values = obj.values()
    else:
        return 0
    value_types = set(map(type, values))
    if value_types <= _ATOMIC_EXACT:
        return 1
    if len(obj) > 64 or not value_types <= _ATOMIC_OR_SEQUENCE:
        return 0
    containers = 1
    for value in values:
        value_type = type(value)
        if value_type is tuple or value_type is list:
            if not _ATOMIC_EXACT.issuperset(map(type, value)):
                return 0
            containers += 1
    return containers


def _function_locals(frame: Any) -> list[tuple[str, Any]]:
    """A frame's locals; none for module-level frames, whose locals are the namespace scanned anyway."""
    local_vars = _frame_locals(frame)
    if type(local_vars) is not dict or local_vars is _frame_globals(frame):
        return []
    return list(dict.items(local_vars))


_EXCEPTION_GETTERS = {name: BaseException.__dict__[name].__get__ for name in ("__traceback__", "__context__", "__cause__", "args")}


@dataclass(frozen=True)
class Root:
    """A starting point: `name` groups results (a user variable, "Out", "sys.last_traceback")."""

    name: str
    kind: str  # "user", "output-cache" or "traceback"
    path: str  # how to write the object in code: "history", "Out[5]", "sys.last_value"
    obj: Any = field(repr=False, compare=False)


@dataclass
class RootStats:
    """What one named root keeps alive (a suspect candidate)."""

    name: str
    kind: str
    path: str
    holder_type: str  # the root object's type name
    tensors: int = 0
    tensor_bytes: int = 0  # storages first counted here (deduplicated across all roots)
    scalar_tensors: int = 0
    graph_tensors: int = 0  # tensors with a grad_fn
    graph_nodes: int = 0
    saved_bytes: int = 0  # activations kept only through those graphs
    saved_live: int = 0  # saved tensors still held (no backward ran)
    saved_freed: int = 0  # saved tensors already freed by backward
    graph_estimated: bool = False  # node cap or time hit: figures extrapolated
    truncated: bool = False  # object traversal stopped early (depth/objects/time)
    objects: int = 0
    first_tensor_path: str | None = None
    graph_paths: list[str] = field(default_factory=list)  # a few paths of graph-holding tensors

    @property
    def retained_bytes(self) -> int:
        return self.tensor_bytes + self.saved_bytes + self.graph_nodes * NODE_BYTES


@dataclass
class ScanResult:
    roots: list[RootStats]
    findings: list[TensorFinding]
    findings_truncated: bool
    devices: list[str]
    objects: int
    skipped: int  # objects whose introspection raised
    truncated: bool
    elapsed_s: float
    notes: list[str]


@dataclass
class _Tensor:
    """A reachable tensor, with the reference we need until the graph phase is done."""

    path: str
    root: RootStats
    tensor: Any
    storage_key: Any
    nbytes: int
    counted: bool
    graph_nodes: int = 0
    graph_saved_bytes: int = 0


class Budget:
    """Limits of one scan. A stop on any of them is reported, never silent."""

    def __init__(
        self,
        time_s: float = 1.0,
        max_objects: int = 500_000,
        max_objects_per_root: int = 200_000,
        max_depth: int = 24,
        graph_node_cap: int = 20_000,
        max_findings: int = 1_000,
        max_children: int = 10_000,
    ) -> None:
        self.time_s = time_s
        self.max_objects = max_objects
        self.max_objects_per_root = max_objects_per_root
        self.max_depth = max_depth
        self.graph_node_cap = graph_node_cap
        self.max_findings = max_findings
        self.max_children = max_children


_MODULE_INTERNALS = re.compile(r"\._(?:modules|parameters|buffers)\[('([^']*)'|\"([^\"]*)\")\]")


def pretty_path(path: str) -> str:
    """`model._modules['0']._parameters['weight']` -> `model[0].weight`: how a user writes it."""

    def plain(match: re.Match[str]) -> str:
        name = match.group(2) if match.group(2) is not None else match.group(3)
        if name.isidentifier():
            return f".{name}"
        return f"[{name}]" if name.isdigit() else f"[{name!r}]"

    return _MODULE_INTERNALS.sub(plain, path) if "._" in path else path


def _lookup_in_type(cls: type, name: str) -> Any:
    for klass in _type_mro(cls):
        value = _type_dict(klass).get(name)
        if value is not None:
            return value
    return None


class Scanner:
    """One scan over a list of roots. Use `scan_roots()`."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.torch: Any = sys.modules.get("torch")
        self._categories: dict[type, str] = {}
        self._saved_attrs: dict[type, tuple[str, ...]] = {}
        self._visited: set[int] = set()
        self._storages: set[Any] = set()
        self._leaf_storages: set[Any] = set()
        self._tensors: list[_Tensor] = []
        self._devices: set[str] = set()
        self.objects = 0  # visited one by one (what the object budget limits)
        self.plain_objects = 0  # plain-data containers counted in bulk
        self.skipped = 0
        self.truncated = False
        self.notes: list[str] = []
        self._deadline = 0.0

    # ------------------------------------------------------------------ classification
    def _category(self, cls: type) -> str:
        cached = self._categories.get(cls)
        if cached is not None:
            return cached
        torch = self.torch
        if issubclass(cls, _ATOMIC_TYPES):
            category = ATOMIC
        elif torch is not None and issubclass(cls, torch.Tensor):
            category = TENSOR
        elif issubclass(cls, _SKIP_TYPES) or (
            _type_dict(cls).get("__module__") == "numpy" and _type_name(cls) == "ndarray"
        ) or _is_ours(cls):
            category = SKIP
        elif issubclass(cls, (list, tuple, deque)):
            category = SEQUENCE
        elif issubclass(cls, dict):
            category = MAPPING
        elif issubclass(cls, (set, frozenset)):
            category = SET
        elif issubclass(cls, types.FunctionType):
            category = FUNCTION
        elif issubclass(cls, types.MethodType):
            category = METHOD
        elif issubclass(cls, types.CellType):
            category = CELL
        elif issubclass(cls, types.FrameType):
            category = FRAME
        elif issubclass(cls, types.TracebackType):
            category = TRACEBACK
        elif issubclass(cls, _GENERATOR_TYPES):
            category = GENERATOR
        elif issubclass(cls, BaseException):
            category = EXCEPTION
        elif torch is not None and issubclass(cls, (torch.dtype, torch.device, torch.Size)):
            category = ATOMIC
        else:
            category = OBJECT
        self._categories[cls] = category
        return category

    # ------------------------------------------------------------------ children, C-level only
    @staticmethod
    def _key_text(key: Any) -> str:
        if type(key) in (str, int, float, bool, type(None)):
            return repr(key)
        return f"<{_type_name(type(key))}>"

    # Children come as (child, how, token); the path text is only built for children worth visiting:
    # "[i]" index, "[key]" mapping key, ".name" attribute, or a literal suffix.
    def _children(self, obj: Any, category: str) -> Iterator[tuple[Any, str, Any]]:
        if category == SEQUENCE:
            cls = type(obj)
            base = list if issubclass(cls, list) else tuple if issubclass(cls, tuple) else deque
            fields = _lookup_in_type(cls, "_fields") if base is tuple else None
            if isinstance(fields, tuple) and all(type(f) is str for f in fields):
                for name, item in zip(fields, base.__iter__(obj)):
                    yield item, ATTR, name
            else:
                for i, item in enumerate(base.__iter__(obj)):
                    yield item, INDEX, i
        elif category == MAPPING:
            for key, value in dict.items(obj):
                yield value, KEY, key
                if type(key) not in _ATOMIC_TYPES:
                    yield key, SUFFIX, f".keys()[{self._key_text(key)}]"
        elif category == SET:
            base = set if issubclass(type(obj), set) else frozenset
            for item in base.__iter__(obj):
                yield item, SUFFIX, "{…}"
        elif category == FUNCTION:
            for i, cell in enumerate(_function_closure(obj) or ()):
                try:
                    yield _cell_contents(cell), SUFFIX, f".__closure__[{i}]"
                except ValueError:  # empty cell
                    pass
            for i, value in enumerate(_function_defaults(obj) or ()):
                yield value, SUFFIX, f".__defaults__[{i}]"
        elif category == METHOD:
            yield _method_self(obj), ATTR, "__self__"
            yield _method_func(obj), ATTR, "__func__"
        elif category == CELL:
            try:
                yield _cell_contents(obj), ATTR, "cell_contents"
            except ValueError:
                pass
        elif category == FRAME:
            for name, value in _function_locals(obj):
                yield value, SUFFIX, f".f_locals[{name!r}]"
        elif category == TRACEBACK:
            frame = _tb_frame(obj)
            code_name = types.CodeType.co_name.__get__(types.FrameType.f_code.__get__(frame))  # type: ignore[attr-defined]
            for name, value in _function_locals(frame):
                yield value, SUFFIX, f"<frame {code_name}>.f_locals[{name!r}]"
            following = _tb_next(obj)
            if following is not None:
                yield following, ATTR, "tb_next"
        elif category == GENERATOR:
            frame_attr = {types.GeneratorType: "gi_frame", types.CoroutineType: "cr_frame"}.get(type(obj), "ag_frame")
            frame = _lookup_in_type(type(obj), frame_attr).__get__(obj)
            if frame is not None:
                for name, value in dict.items(_frame_locals(frame)):
                    yield value, SUFFIX, f".{frame_attr}.f_locals[{name!r}]"
        elif category == EXCEPTION:
            for attr in ("__traceback__", "__context__", "__cause__", "args"):
                value = _EXCEPTION_GETTERS[attr](obj)
                if value is not None:
                    yield value, ATTR, attr
            yield from self._object_children(obj)
        elif category == OBJECT:
            yield from self._object_children(obj)

    def _object_children(self, obj: Any) -> Iterator[tuple[Any, str, Any]]:
        cls = type(obj)
        descriptor = _lookup_in_type(cls, "__dict__")
        if type(descriptor) is types.GetSetDescriptorType:  # the C instance-dict getter, nothing else
            instance_dict = descriptor.__get__(obj)
            if type(instance_dict) is dict:
                for name, value in dict.items(instance_dict):
                    yield value, (ATTR if type(name) is str else KEY), name
        for klass in _type_mro(cls):
            slots = _type_dict(klass).get("__slots__")
            if slots is None:
                continue
            for slot in (slots,) if type(slots) is str else slots:
                member = _type_dict(klass).get(slot)
                if type(member) is types.MemberDescriptorType:
                    try:
                        yield member.__get__(obj), ATTR, slot
                    except AttributeError:  # unset slot
                        pass

    def _child_path(self, path: str, how: str, token: Any) -> str:
        if how == INDEX:
            return f"{path}[{token}]"
        if how == KEY:
            return f"{path}[{self._key_text(token)}]"
        if how == ATTR:
            return f"{path}.{token}"
        return path + token

    def _path_text(self, path: _Path) -> str:
        """Spell out a lazy path: most visited objects hold no tensor, so their path is never written."""
        steps = []
        while type(path) is tuple:
            path, how, token = path
            steps.append((how, token))
        text = path
        for how, token in reversed(steps):
            text = self._child_path(text, how, token)
        return text

    # ------------------------------------------------------------------ tensors
    def _storage(self, t: Any) -> tuple[Any, int]:
        try:
            storage = t.untyped_storage()
            return (str(t.device), storage.data_ptr(), id(storage) if storage.data_ptr() == 0 else 0), int(
                storage.nbytes()
            )
        except Exception:  # sparse, nested or otherwise storage-less tensors
            return ("nostorage", id(t)), int(t.numel() * t.element_size())

    def _record_tensor(self, t: Any, lazy_path: _Path, root: RootStats) -> None:
        path = pretty_path(self._path_text(lazy_path))
        key, nbytes = self._storage(t)
        counted = key not in self._storages
        self._storages.add(key)
        self._devices.add(str(t.device))
        root.tensors += 1
        if counted:
            root.tensor_bytes += nbytes
        if root.first_tensor_path is None:
            root.first_tensor_path = path
        if t.numel() == 1:
            root.scalar_tensors += 1
        self._tensors.append(_Tensor(path, root, t, key, nbytes, counted))

    # ------------------------------------------------------------------ traversal
    def _out_of_time(self) -> bool:
        return time.perf_counter() > self._deadline

    def _traverse(self, root: Root, stats: RootStats) -> None:
        budget = self.budget
        stack: list[tuple[Any, _Path, int]] = [(root.obj, root.path, 0)]
        categories = self._categories
        torch = self.torch
        tensor_grad = torch._C.TensorBase.grad.__get__ if torch is not None else None
        tensor_is_leaf = torch._C.TensorBase.is_leaf.__get__ if torch is not None else None
        while stack:
            obj, path, depth = stack.pop()
            oid = id(obj)
            if oid in self._visited:
                continue
            category = categories.get(type(obj)) or self._category(type(obj))
            if category is ATOMIC or category is SKIP:
                continue
            self._visited.add(oid)
            self.objects += 1
            stats.objects += 1
            if stats.objects > budget.max_objects_per_root or self.objects > budget.max_objects or (
                stats.objects % 1024 == 0 and self._out_of_time()
            ):
                stats.truncated = self.truncated = True
                return
            try:
                if category == TENSOR:
                    self._record_tensor(obj, path, stats)
                    grad = tensor_grad(obj) if tensor_grad is not None and tensor_is_leaf(obj) else None
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
        self, obj: Any, category: str, path: _Path, depth: int, stats: RootStats
    ) -> list[tuple[Any, _Path, int]]:
        """Children worth visiting, in order. Past `max_children` non-tensor children of one container,
        only tensors are still taken, so one huge container cannot starve its siblings. Builtin
        containers of plain data (a record `{"id": 3, "tags": (3, 7)}`) are counted here, not visited."""
        out: list[tuple[Any, _Path, int]] = []
        others = 0
        limit = self.budget.max_children
        categories = self._categories
        visited = self._visited
        cls = type(obj)
        if cls is list or cls is tuple:  # exact builtins: C-level iteration, no generator frame
            items: Any = zip(obj, repeat(INDEX), count())
        elif cls is dict:
            items = zip(obj.values(), repeat(KEY), obj.keys())
            if not _ATOMIC_EXACT.issuperset(map(type, obj)):
                for key in obj:
                    if type(key) not in _ATOMIC_EXACT and id(key) not in visited:  # e.g. optimizer state
                        out.append((key, (path, SUFFIX, f".keys()[{self._key_text(key)}]"), depth))
        else:
            items = self._children(obj, category)
        plain_objects = 0
        for i, (child, how, token) in enumerate(items):
            child_type = type(child)
            child_category = categories.get(child_type) or self._category(child_type)
            if child_category is ATOMIC or child_category is SKIP:
                continue
            if child_category is SEQUENCE or child_category is MAPPING:
                plain = _plain_data_containers(child, child_type)
                if plain:  # holds no tensor: counted (again, if reached twice), never visited
                    plain_objects += plain
                    continue
            if id(child) in visited:
                continue
            if child_category is not TENSOR:
                others += 1
                if others > limit:
                    if others == limit + 1:
                        stats.truncated = self.truncated = True
                        self.notes.append(f"{self._path_text(path)}: only its first {limit:,} non-tensor items were scanned")
                    continue
            out.append((child, (path, how, token), depth))
            if i % 65536 == 65535 and self._out_of_time():
                stats.truncated = self.truncated = True
                break
        self.plain_objects += plain_objects  # cheap: not held against the object budget
        return out

    # ------------------------------------------------------------------ autograd graphs
    def _saved_attributes(self, node: Any) -> tuple[str, ...]:
        cls = type(node)
        names = self._saved_attrs.get(cls)
        if names is None:
            names = tuple(n for n in dir(node) if n.startswith("_raw_saved_"))
            self._saved_attrs[cls] = names
        return names

    def _saved_tensors(self, node: Any) -> Iterator[Any]:
        """Saved tensors of a node: a tensor, or None for one that backward already freed."""
        for name in self._saved_attributes(node):
            value = getattr(node, name, None)
            for saved in value if isinstance(value, (list, tuple)) else (value,):
                if saved is not None:
                    yield saved.data
        instance_dict = getattr(node, "__dict__", None)  # custom autograd.Function ctx attributes
        if type(instance_dict) is dict:
            for value in dict.values(instance_dict):
                if self.torch is not None and issubclass(type(value), self.torch.Tensor):
                    yield value
        if hasattr(type(node), "saved_tensors"):
            try:
                yield from node.saved_tensors
            except RuntimeError:
                yield None  # freed by backward

    def _walk_graphs(self, stats: RootStats, tensors: list[_Tensor], seen_nodes: dict[int, Any]) -> None:
        """Walk the graphs of one root's tensors within the node cap and the deadline.

        Past the cap: a single long chain is extrapolated from autograd sequence numbers; many small
        graphs are extrapolated from the share of tensors walked. Either way `graph_estimated` is set.
        """
        cap = self.budget.graph_node_cap
        with_graph = [t for t in tensors if t.tensor.grad_fn is not None]
        stats.graph_tensors = len(with_graph)
        stats.graph_paths = [t.path for t in with_graph[:3]]
        walked_tensors = walked_nodes = 0
        for entry in with_graph:
            remaining = cap - walked_nodes
            if remaining <= 0 or self._out_of_time():
                break
            nodes, saved_bytes, stopped_at = self._walk_one(entry.tensor.grad_fn, remaining, stats, seen_nodes)
            entry.graph_nodes, entry.graph_saved_bytes = nodes, saved_bytes
            walked_nodes += nodes
            walked_tensors += 1
            if stopped_at is not None:
                stats.graph_estimated = True
                if nodes >= cap // 2:  # one graph bigger than the cap: a long chain
                    extra = self._chain_estimate(stopped_at)
                    stats.graph_nodes += extra
                    entry.graph_nodes += extra
                break
        if walked_tensors < len(with_graph):
            stats.graph_estimated = True
            scale = len(with_graph) / max(walked_tensors, 1)
            stats.graph_nodes = int(stats.graph_nodes * scale)
            stats.saved_bytes = int(stats.saved_bytes * scale)

    def _walk_one(self, grad_fn: Any, limit: int, stats: RootStats, seen_nodes: dict[int, Any]) -> tuple[int, int, Any]:
        """Touch at most `limit` new nodes of one graph; returns (nodes, saved bytes, node stopped at or None)."""
        nodes = saved_bytes = 0
        stack = [grad_fn]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen_nodes:
                continue
            if nodes >= limit:
                return nodes, saved_bytes, node
            seen_nodes[id(node)] = node  # held until the scan ends, so ids stay unique
            nodes += 1
            stats.graph_nodes += 1
            try:
                if _type_name(type(node)) == "AccumulateGrad":
                    variable = getattr(node, "variable", None)
                    if variable is not None:
                        self._leaf_storages.add(self._storage(variable)[0])
                for saved in self._saved_tensors(node):
                    if saved is None:
                        stats.saved_freed += 1
                        continue
                    stats.saved_live += 1
                    key, nbytes = self._storage(saved)
                    if key in self._storages or key in self._leaf_storages or (
                        saved.requires_grad and saved.grad_fn is None
                    ):
                        continue  # a parameter, or alive anyway through a direct reference
                    self._storages.add(key)
                    stats.saved_bytes += nbytes
                    saved_bytes += nbytes
                stack.extend(next_node for next_node, _ in node.next_functions)
            except Exception:
                self.skipped += 1
        return nodes, saved_bytes, None

    @staticmethod
    def _oldest_node(entries: list[_Tensor], sample: int = 256) -> float:
        """The lowest autograd sequence number among a root's first tensors (containers are walked in
        order, so the first ones are the oldest; each `grad_fn` costs a Python wrapper)."""
        numbers = []
        for entry in entries[:sample]:
            grad_fn = entry.tensor.grad_fn
            if grad_fn is not None:
                try:
                    numbers.append(int(grad_fn._sequence_nr()))
                except Exception:
                    pass
        return min(numbers, default=float("inf"))

    @staticmethod
    def _chain_estimate(node: Any) -> int:
        """Nodes left behind the cap, from autograd sequence numbers (nodes are numbered as created)."""
        try:
            sequence_nr = int(node._sequence_nr())
        except Exception:
            return 0
        return sequence_nr if 0 < sequence_nr < 1 << 62 else 0  # AccumulateGrad nodes carry UINT64_MAX

    # ------------------------------------------------------------------ entry point
    def scan(self, roots: list[Root]) -> ScanResult:
        if self.torch is None:
            return self._scan(roots)
        with self.torch._C.DisableTorchFunctionSubclass():  # no tensor subclass' Python code runs
            return self._scan(roots)

    def _scan(self, roots: list[Root]) -> ScanResult:
        started = time.perf_counter()
        self._deadline = started + self.budget.time_s
        stats_by_name: dict[str, RootStats] = {}
        # a tensor reachable from several names is counted for the first: containers before bare
        # tensors (the `loss` of the last step also sits in `history`), user names before caches
        kind_order = {"user": 0, "output-cache": 1, "traceback": 2}
        roots = sorted(roots, key=lambda r: (kind_order.get(r.kind, 3), self._category(type(r.obj)) == TENSOR))
        for root in roots:
            stats = stats_by_name.get(root.name)
            if stats is None:
                holder = _type_name(type(root.obj))
                stats = stats_by_name[root.name] = RootStats(root.name, root.kind, root.path, holder)
            self._traverse(root, stats)
        seen_nodes: dict[int, Any] = {}
        by_root: dict[str, list[_Tensor]] = {}
        for entry in self._tensors:
            by_root.setdefault(entry.root.name, []).append(entry)
        # after all roots are traversed: saved tensors reachable directly are not "kept by the graph".
        # Oldest graphs first: where two names share a graph (`h` carried across steps and this
        # step's `loss = head(h)`), the older one is the holder of the shared part.
        order = sorted(by_root.items(), key=lambda item: self._oldest_node(item[1])) if len(by_root) > 1 else by_root.items()
        for name, entries in order:
            self._walk_graphs(stats_by_name[name], entries, seen_nodes)
        findings = self._findings()
        result = ScanResult(
            roots=sorted(stats_by_name.values(), key=lambda s: -s.retained_bytes),
            findings=findings,
            findings_truncated=len(self._tensors) > self.budget.max_findings,
            devices=sorted(self._devices),
            objects=self.objects + self.plain_objects,
            skipped=self.skipped,
            truncated=self.truncated,
            elapsed_s=time.perf_counter() - started,
            notes=self.notes,
        )
        # drop every reference to user objects and autograd nodes
        seen_nodes.clear()
        self._tensors.clear()
        self._visited.clear()
        return result

    def _findings(self) -> list[TensorFinding]:
        out = []
        for entry in self._tensors[: self.budget.max_findings]:
            t = entry.tensor
            grad_fn = t.grad_fn
            out.append(
                TensorFinding(
                    path=entry.path,
                    shape=tuple(int(s) for s in t.shape),
                    dtype=str(t.dtype).removeprefix("torch."),
                    device=str(t.device),
                    bytes=entry.nbytes if entry.counted else 0,
                    requires_grad=bool(t.requires_grad),
                    grad_fn=None if grad_fn is None else _type_name(type(grad_fn)),
                    graph_nodes=entry.graph_nodes,
                    retained_bytes=(entry.nbytes if entry.counted else 0) + entry.graph_saved_bytes
                    + entry.graph_nodes * NODE_BYTES,
                )
            )
        return out


def scan_roots(roots: list[Root], budget: Budget | None = None) -> ScanResult:
    """Scan `roots` within `budget`; returns numbers and paths only (no references)."""
    return Scanner(budget or Budget()).scan(roots)
