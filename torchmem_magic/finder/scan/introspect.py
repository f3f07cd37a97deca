"""How the scan reads objects without running their code: each object's category and its children.

This is the only module that looks inside user objects, and it does so only through C-level
accessors chosen by the object's *type*: the base-class methods of list/tuple/deque/dict/set, the
instance-dict and slot descriptors, closure cells and defaults (named from the function's code
object: what a function keeps between calls is a `FunctionSlot`), frame locals, traceback and
exception fields. It never calls properties, `__getattr__`, or a user class' `__len__`/`__iter__`/`__eq__`/`__hash__`
(the traversal keeps ids in its visited set, not objects). Tensors, torch's own C++ objects, are
read through torch's methods while tensor subclasses' `__torch_function__` is disabled.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import types
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterator, Mapping
from itertools import chain
from typing import Any

from .arrays import NUMPY_ARRAY, PANDAS_TABLES, array_items, library_class, table_items
from ...render.advice.fixes import LRU_CACHE
from .results import FunctionSlot

# Categories: what the traversal does with an object of a type.
ATOMIC = "atomic"  # holds nothing: not visited
SKIP = "skip"  # types, modules, descriptors, this package's objects: not visited
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
CLASS = "class"  # a class named as a root (types met inside objects are skipped): its own containers
ARRAY = "array"  # a numpy array: the objects of an object-dtype one (see arrays.py)
TABLE = "table"  # a pandas DataFrame or Series: its object columns' objects

# How a child is reached from its parent; the token says which one (paths.py spells it out).
INDEX = "index"  # token: the position, `[3]`
KEY = "key"  # token: the mapping key, `['val']`
ATTR = "attr"  # token: the attribute name, `.weight`
KEY_OBJECT = "key-object"  # token: the key itself, reached as `.keys()[...]`
SUFFIX = "suffix"  # token: the literal text to append
SLOT = "slot"  # token: (the literal text to append, the FunctionSlot it enters)

Child = tuple[Any, str, Any]  # (child, how it is reached, token)
StorageKey = tuple[object, ...]  # identifies a tensor's storage, so views count once

ATOMIC_TYPES = (int, float, complex, bool, str, bytes, bytearray, type(None), range, slice, type(Ellipsis))
ATOMIC_EXACT = frozenset({int, float, complex, bool, str, bytes, type(None)})  # for C-level `issuperset` checks
_ATOMIC_OR_SEQUENCE = ATOMIC_EXACT | {tuple, list}
_SKIP_TYPES: tuple[type, ...] = (
    type, types.ModuleType, types.BuiltinFunctionType, types.MethodWrapperType, types.WrapperDescriptorType,
    types.MethodDescriptorType, types.GetSetDescriptorType, types.MemberDescriptorType, types.CodeType,
    property, classmethod, staticmethod, memoryview,
)
_GENERATOR_TYPES = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
#: The process' own machinery, where a scan stops: threads and processes (a worker queue's feeder thread
#: keeps `sys.stderr`), IO streams and sockets (the kernel's stdout reaches its session, the shell and the
#: namespace), event loops, executors, loggers (their manager reaches every logger of the process), and
#: the application objects of the Jupyter stack (traitlets' HasTraits: the shell, the kernel, its session,
#: widgets). Whatever a user's object keeps there is the process', not the user's: were it walked, the
#: namespace's tensors would be blamed on the first name that reaches a thread. Named by (module, class),
#: read from `sys.modules` (never imported here: a module not loaded has no such objects).
_BOUNDARY_CLASSES = (
    ("threading", "Thread"), ("multiprocessing.process", "BaseProcess"), ("_io", "_IOBase"),
    ("socket", "socket"), ("selectors", "BaseSelector"), ("asyncio.events", "AbstractEventLoop"),
    ("concurrent.futures._base", "Executor"), ("logging", "Logger"), ("logging", "Handler"),
    ("logging", "Manager"), ("traitlets.traitlets", "HasTraits"), ("zmq.sugar.context", "Context"),
    ("zmq.sugar.socket", "Socket"),
)
_PACKAGE = __name__.partition(".")[0]  # torchmem_magic, not this subpackage

# The C-level getters, taken from the defining type's own __dict__, so no subclass can replace them.
type_name: Callable[[type], str] = type.__dict__["__name__"].__get__
type_dict: Callable[[type], Mapping[str, Any]] = type.__dict__["__dict__"].__get__
_type_mro: Callable[[type], tuple[type, ...]] = type.__dict__["__mro__"].__get__
_function_closure: Callable[[Any], tuple[Any, ...] | None] = types.FunctionType.__dict__["__closure__"].__get__
_function_defaults: Callable[[Any], tuple[Any, ...] | None] = types.FunctionType.__dict__["__defaults__"].__get__
_function_kwdefaults: Callable[[Any], dict[str, Any] | None] = types.FunctionType.__dict__["__kwdefaults__"].__get__
_function_code: Callable[[Any], types.CodeType] = types.FunctionType.__dict__["__code__"].__get__
_function_name: Callable[[Any], str] = types.FunctionType.__dict__["__name__"].__get__
_function_qualname: Callable[[Any], str] = types.FunctionType.__dict__["__qualname__"].__get__
_code_argcount: Callable[[types.CodeType], int] = types.CodeType.__dict__["co_argcount"].__get__
_code_varnames: Callable[[types.CodeType], tuple[str, ...]] = types.CodeType.__dict__["co_varnames"].__get__
_code_freevars: Callable[[types.CodeType], tuple[str, ...]] = types.CodeType.__dict__["co_freevars"].__get__
_method_self: Callable[[Any], Any] = types.MethodType.__dict__["__self__"].__get__
_method_func: Callable[[Any], Any] = types.MethodType.__dict__["__func__"].__get__
_cell_contents: Callable[[Any], Any] = types.CellType.__dict__["cell_contents"].__get__
_frame_locals: Callable[[Any], Any] = types.FrameType.__dict__["f_locals"].__get__
_frame_globals: Callable[[Any], Any] = types.FrameType.__dict__["f_globals"].__get__
_frame_code: Callable[[Any], types.CodeType] = types.FrameType.__dict__["f_code"].__get__
_code_name: Callable[[types.CodeType], str] = types.CodeType.__dict__["co_name"].__get__
_module_dict: Callable[[types.ModuleType], dict[str, Any]] = vars(types.ModuleType)["__dict__"].__get__
_tb_frame: Callable[[Any], Any] = types.TracebackType.__dict__["tb_frame"].__get__
_tb_next: Callable[[Any], Any] = types.TracebackType.__dict__["tb_next"].__get__
_EXCEPTION_FIELDS = ("__traceback__", "__context__", "__cause__", "args")
_exception_getters: dict[str, Callable[[Any], Any]] = {
    name: BaseException.__dict__[name].__get__ for name in _EXCEPTION_FIELDS
}
_GENERATOR_FRAMES: dict[type, str] = {types.GeneratorType: "gi_frame", types.CoroutineType: "cr_frame"}
_CACHE_TYPES = (list, dict, set, deque, defaultdict, OrderedDict)  # what a method's object may fill between calls


def boundary_types() -> frozenset[type]:
    """The classes of the process' machinery loaded now (see _BOUNDARY_CLASSES)."""
    found: set[type] = set()
    for module_name, class_name in _BOUNDARY_CLASSES:
        module = sys.modules.get(module_name)
        if module is not None and issubclass(type(module), types.ModuleType):
            cls = _module_dict(module).get(class_name)
            if isinstance(cls, type):  # a class of the standard library or the Jupyter stack: no user code
                found.add(cls)
    return frozenset(found)


def is_boundary(cls: type, boundaries: frozenset[type]) -> bool:
    """Whether instances of `cls` belong to the process' machinery: its MRO (C-level) meets a boundary."""
    return not boundaries.isdisjoint(_type_mro(cls))


def is_user_class(obj: Any, categories: TypeCategories) -> bool:
    """A class (not a module, a function or a builtin) whose instances the scan would walk."""
    return issubclass(type(obj), type) and categories.of(obj) == OBJECT


def lookup_in_type(cls: type, name: str) -> Any:
    """`name` as the class attribute lookup would find it, read from each class' own __dict__."""
    for klass in _type_mro(cls):
        value = type_dict(klass).get(name)
        if value is not None:
            return value
    return None


def is_ours(cls: type) -> bool:
    """This package's own objects (a session bound by `with memwatch() as w`, a report): they hold no
    user memory, but a session's root provider reaches the whole namespace, which would be blamed on it."""
    module = type_dict(cls).get("__module__")
    return type(module) is str and (module == _PACKAGE or module.startswith(f"{_PACKAGE}."))


class TypeCategories:
    """The category of each type, decided once per type: a scan meets the same few types millions of
    times, so the traversal reads `known` directly and calls `of()` only for a type not seen yet."""

    def __init__(self, torch: Any) -> None:
        self.known: dict[type, str] = {}
        self._torch = torch  # None when torch was never imported: then nothing is a tensor
        self._boundaries = boundary_types()
        self._class_children: dict[type, tuple[Child, ...]] = {}  # held for one scan only (see `release`)

    def of(self, cls: type) -> str:
        cached = self.known.get(cls)
        if cached is not None:
            return cached
        category = self._decide(cls)
        self.known[cls] = category
        return category

    def class_children(self, cls: type) -> tuple[Child, ...]:
        """The containers an instance of `cls` reaches through its classes (see `class_containers`),
        looked up once per type: a scan meets the same classes' instances thousands of times."""
        found = self._class_children.get(cls)
        if found is None:
            found = self._class_children[cls] = tuple(class_containers(cls))
        return found

    def is_machinery(self, cls: type) -> bool:
        """Whether instances of `cls` are the process' machinery (skipped, unless a root is one: see the scanner)."""
        return is_boundary(cls, self._boundaries)

    def release(self) -> None:
        """Drop the class containers looked up (the scan keeps no reference once it ends)."""
        self._class_children.clear()

    def _decide(self, cls: type) -> str:
        torch = self._torch
        if issubclass(cls, ATOMIC_TYPES):
            return ATOMIC
        if torch is not None and issubclass(cls, torch.Tensor):
            return TENSOR
        library = library_class(cls)
        if library == NUMPY_ARRAY:
            return ARRAY
        if library in PANDAS_TABLES:
            return TABLE
        if issubclass(cls, _SKIP_TYPES) or is_ours(cls) or is_boundary(cls, self._boundaries):
            return SKIP
        if issubclass(cls, (list, tuple, deque)):
            return SEQUENCE
        if issubclass(cls, dict):
            return MAPPING
        if issubclass(cls, (set, frozenset)):
            return SET
        if issubclass(cls, types.FunctionType):
            return FUNCTION
        if issubclass(cls, types.MethodType):
            return METHOD
        if issubclass(cls, types.CellType):
            return CELL
        if issubclass(cls, types.FrameType):
            return FRAME
        if issubclass(cls, types.TracebackType):
            return TRACEBACK
        if issubclass(cls, _GENERATOR_TYPES):
            return GENERATOR
        if issubclass(cls, BaseException):
            return EXCEPTION
        if torch is not None and issubclass(cls, (torch.dtype, torch.device, torch.Size)):
            return ATOMIC
        return OBJECT


def plain_data_containers(obj: Any, cls: type) -> int:
    """How many containers `obj` is if it is an exact list/tuple/dict of numbers and strings, at most
    one level nested (a dataset record), else 0. C-level type checks only: such data holds no tensor."""
    if cls is tuple or cls is list:
        values: Any = obj
    elif cls is dict:
        if not ATOMIC_EXACT.issuperset(map(type, obj)):
            return 0
        values = obj.values()
    else:
        return 0
    if len(obj) > 64:  # too long for a record: plain only as flat atomic values (stops at the first other)
        return 1 if ATOMIC_EXACT.issuperset(map(type, values)) else 0
    value_types = set(map(type, values))
    if value_types <= ATOMIC_EXACT:
        return 1
    if not value_types <= _ATOMIC_OR_SEQUENCE:
        return 0
    containers = 1
    for value in values:
        value_type = type(value)
        if value_type is tuple or value_type is list:
            if not ATOMIC_EXACT.issuperset(map(type, value)):
                return 0
            containers += 1
    return containers


_FLAT_RECORD_TYPES = frozenset({dict, list, tuple})


def flat_records_in_bulk(items: list[Any]) -> int | None:
    """How many containers `items` holds when it is all atomic values, or all exact dicts (atomic keys
    and values), or all exact lists, or all exact tuples of atomic values: a dataset's records. None
    when it holds anything else (each item is then looked at on its own, `plain_data_containers`).

    The whole check runs at C level, ~50 ns an item against ~0.8 µs for one record looked at on its
    own: a namespace's half million records are what made the first scan of a notebook cost a second.
    Only exact builtins are iterated, so no user code runs."""
    item_types = set(map(type, items))
    if item_types <= ATOMIC_EXACT:
        return 0
    if len(item_types) != 1 or not item_types <= _FLAT_RECORD_TYPES:
        return None  # mixed, nested or other objects: item by item
    if item_types == {dict}:
        keys_plain = ATOMIC_EXACT.issuperset(map(type, chain.from_iterable(items)))
        values = chain.from_iterable(map(dict.values, items))
    else:
        keys_plain, values = True, chain.from_iterable(items)
    return len(items) if keys_plain and ATOMIC_EXACT.issuperset(map(type, values)) else None


def children(obj: Any, category: str) -> Iterator[Child]:
    """The objects `obj` references, each with how it is reached, in the order a user would list them."""
    if category == SEQUENCE:
        cls = type(obj)
        sequence_base: Any = list if issubclass(cls, list) else tuple if issubclass(cls, tuple) else deque
        fields = lookup_in_type(cls, "_fields") if sequence_base is tuple else None
        if isinstance(fields, tuple) and all(type(f) is str for f in fields):  # a namedtuple
            for name, item in zip(fields, sequence_base.__iter__(obj)):
                yield item, ATTR, name
        else:
            for i, item in enumerate(sequence_base.__iter__(obj)):
                yield item, INDEX, i
    elif category == MAPPING:
        for key, value in dict.items(obj):
            yield value, KEY, key
            if type(key) not in ATOMIC_TYPES:
                yield key, KEY_OBJECT, key
    elif category == SET:
        set_base: Any = set if issubclass(type(obj), set) else frozenset
        for item in set_base.__iter__(obj):
            yield item, SUFFIX, "{…}"
    elif category == FUNCTION:
        yield from _function_slots(obj)
    elif category == METHOD:
        owner = _method_self(obj)
        yield from _method_slots(_method_func(obj), owner)
        yield owner, ATTR, "__self__"
        yield _method_func(obj), ATTR, "__func__"
    elif category == CELL:
        with contextlib.suppress(ValueError):  # an empty cell
            yield _cell_contents(obj), ATTR, "cell_contents"
    elif category == FRAME:
        for name, value in _function_locals(obj):
            yield value, SUFFIX, f".f_locals[{name!r}]"
    elif category == TRACEBACK:
        frame = _tb_frame(obj)
        code_name = _code_name(_frame_code(frame))
        for name, value in _function_locals(frame):
            yield value, SUFFIX, f"<frame {code_name}>.f_locals[{name!r}]"
        following = _tb_next(obj)
        if following is not None:
            yield following, ATTR, "tb_next"
    elif category == GENERATOR:
        frame_attr = _GENERATOR_FRAMES.get(type(obj), "ag_frame")
        frame = lookup_in_type(type(obj), frame_attr).__get__(obj)
        if frame is not None:
            for name, value in dict.items(_frame_locals(frame)):
                yield value, SUFFIX, f".{frame_attr}.f_locals[{name!r}]"
    elif category == EXCEPTION:
        for attr in _EXCEPTION_FIELDS:
            value = _exception_getters[attr](obj)
            if value is not None:
                yield value, ATTR, attr
        yield from _object_children(obj)
    elif category == OBJECT:
        yield from _object_children(obj)
    elif category == ARRAY or category == TABLE:
        for item, text in (array_items(obj) if category == ARRAY else table_items(obj)):
            yield item, SUFFIX, text


_FUNCTION_TYPES = frozenset({types.FunctionType, types.MethodType, functools.partial, types.BuiltinFunctionType})


_LRU_CACHE_WRAPPER = type(functools.lru_cache(maxsize=None)(len))
_LRU_CACHE_TEXT = f" ({LRU_CACHE})"  # how a cache that has no attribute of its own is named in a path


def _lru_cache_children(wrapper: Any) -> Iterator[Child]:
    """The results a `functools.lru_cache` keeps, and the arguments they are keyed by: its cache lives in C,
    with no attribute to read, so it is read as the collector reads it. A bounded cache's links hold key and
    result (in that order, followed by the links' type, before the cache's dict); an unbounded one's dict maps
    key to result. The instance dict (`__wrapped__`) comes last."""
    refs = gc.get_referents(wrapper)
    at = next((i for i, ref in enumerate(refs) if type(ref) is dict and "__wrapped__" not in ref), None)
    if at is None:
        return
    links = [(refs[i - 2], refs[i - 1]) for i in range(2, at)
             if isinstance(refs[i], type) and type_name(refs[i]) == "_lru_list_elem"]
    for key, result in links or list(dict.items(refs[at])):
        label = repr(key)[:40] if type(key) in (int, str, float, bool) else "…"
        yield result, SUFFIX, f"{_LRU_CACHE_TEXT}[{label}]"
        if type(key) not in ATOMIC_TYPES:  # the arguments it was called with, tensors among them
            yield key, SUFFIX, f"{_LRU_CACHE_TEXT}[{label}] (its arguments)"


def _object_children(obj: Any) -> Iterator[Child]:
    """An instance's attributes: its instance dict through the C getter, then its set slots (a cached
    function's results first: they are what it keeps)."""
    cls = type(obj)
    if cls is _LRU_CACHE_WRAPPER:
        yield from _lru_cache_children(obj)
    descriptor = lookup_in_type(cls, "__dict__")
    if type(descriptor) is types.GetSetDescriptorType:  # the C instance-dict getter, nothing else
        instance_dict = descriptor.__get__(obj)
        if type(instance_dict) is dict:
            # functions an object keeps on itself (a wrapped `update` bound through its closure) come
            # after its data: what they reach is named by the shorter path, `metric.value`, not through them
            later = []
            for name, value in dict.items(instance_dict):
                if type(value) in _FUNCTION_TYPES:
                    later.append((value, name))
                    continue
                yield value, (ATTR if type(name) is str else KEY), name
            for value, name in later:
                yield value, (ATTR if type(name) is str else KEY), name
    for klass in _type_mro(cls):
        slots = type_dict(klass).get("__slots__")
        if slots is None:
            continue
        for slot in (slots,) if type(slots) is str else slots:
            member = type_dict(klass).get(slot)
            if type(member) is types.MemberDescriptorType:
                try:
                    yield member.__get__(obj), ATTR, slot
                except AttributeError:  # unset slot
                    pass


def class_containers(cls: type, own_only: bool = False) -> Iterator[Child]:
    """The builtin containers a class keeps in its own namespace (`class Tap: store = {}`), for it and
    the classes it derives from (or only its own): shared by every instance and alive as long as the
    class, so what `self.store[k] = out` fills is held there, not by any instance. Dunder names and the
    builtin classes are the language's."""
    for klass in (cls,) if own_only else _type_mro(cls):
        if type_dict(klass).get("__module__") == "builtins":
            continue
        owner = type_name(klass)
        for name, value in dict.items(dict(type_dict(klass))):
            if type(value) in _CACHE_TYPES and type(name) is str and not name.startswith("__"):
                slot = FunctionSlot("class", owner, name, type_name(type(value)), owner)
                yield value, SLOT, (f".{name}", slot)


def _function_slots(function: Any) -> Iterator[Child]:
    """A function's captured variables and default arguments, each named as its code names it."""
    code = _function_code(function)
    name = _function_name(function)
    freevars = _code_freevars(code)
    outer = _enclosing_function(_function_qualname(function))
    for i, cell in enumerate(_function_closure(function) or ()):
        try:
            value = _cell_contents(cell)
        except ValueError:  # empty cell
            continue
        variable = freevars[i] if i < len(freevars) else f"<cell {i}>"
        slot = FunctionSlot("closure", name, variable, type_name(type(value)), outer)
        yield value, SLOT, (f".__closure__[{i}].cell_contents", slot)
    defaults = _function_defaults(function) or ()
    with_defaults = _code_varnames(code)[: _code_argcount(code)][-len(defaults):] if defaults else ()
    for i, value in enumerate(defaults):
        variable = with_defaults[i] if len(with_defaults) == len(defaults) else f"<default {i}>"
        yield value, SLOT, (f".__defaults__[{i}]", FunctionSlot("default", name, variable, type_name(type(value))))
    for key, value in dict.items(_function_kwdefaults(function) or {}):
        slot = FunctionSlot("default", name, str(key), type_name(type(value)))
        yield value, SLOT, (f".__kwdefaults__[{key!r}]", slot)


def _enclosing_function(qualname: str) -> str | None:
    """`make_logger.<locals>.log` -> `make_logger`: the function whose call created a closure."""
    scopes = qualname.split(".<locals>.")
    return scopes[-2].rsplit(".", 1)[-1] if len(scopes) > 1 else None


def _method_slots(function: Any, owner: Any) -> Iterator[Child]:
    """The public list/dict/set/deque attributes of a bound method's object: what it can fill call after
    call (`self.outputs.append(out)`). Private ones are a class' machinery (nn.Module's `_parameters`),
    and objects the traversal skips (types, this package's) are not looked into."""
    cls = type(owner)
    if issubclass(cls, _SKIP_TYPES + ATOMIC_TYPES) or is_ours(cls) or is_boundary(cls, boundary_types()):
        return
    name = _function_name(function) if type(function) is types.FunctionType else type_name(type(function))
    for value, how, attribute in _object_children(owner):
        if how == ATTR and not attribute.startswith("_") and type(value) in _CACHE_TYPES:
            slot = FunctionSlot("attribute", name, attribute, type_name(type(value)), type_name(cls))
            yield value, SLOT, (f".__self__.{attribute}", slot)


def _function_locals(frame: Any) -> list[tuple[str, Any]]:
    """A frame's locals; none for module-level frames, whose locals are the namespace scanned anyway."""
    local_vars = _frame_locals(frame)
    if type(local_vars) is not dict or local_vars is _frame_globals(frame):
        return []
    return list(dict.items(local_vars))


def in_shared_memory(t: Any) -> bool:
    """Whether a CPU tensor's storage is a shared-memory segment (a batch a DataLoader worker sent, a
    `share_memory_()`): its bytes are /dev/shm's, not the heap's."""
    try:
        return bool(t.untyped_storage().is_shared())
    except Exception:  # sparse, nested or otherwise storage-less tensors
        return False


def tensor_storage(t: Any) -> tuple[StorageKey, int]:
    """The key of the storage behind `t` (views of one storage share it) and the storage's bytes."""
    try:
        storage = t.untyped_storage()
        data_ptr = storage.data_ptr()
        return (str(t.device), data_ptr, id(storage) if data_ptr == 0 else 0), int(storage.nbytes())
    except Exception:  # sparse, nested or otherwise storage-less tensors
        return ("nostorage", id(t)), int(t.numel() * t.element_size())
