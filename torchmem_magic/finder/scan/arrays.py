"""Containers the garbage collector does not see into: numpy object arrays, and pandas object columns through
them. `gc.get_referents` returns nothing for an array's items, so a walk of referents misses a tensor kept in
`df["conf"]`; these read the items the way the libraries expose them (the array's own iteration, a frame's
columns), for the exact library types only (a subclass may run its user's code). Paths are ones a user can
type: `arr[17]`, `grid[2, 5]`, `df['conf'].iloc[17]`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

_type_name: Callable[[type], str] = type.__dict__["__name__"].__get__  # the C getters: no metaclass code runs
_type_module: Callable[[type], Any] = type.__dict__["__module__"].__get__  # a C type's from its tp_name

#: the exact classes read here, by (module, name)
NUMPY_ARRAY = ("numpy", "ndarray")
PANDAS_TABLES = {("pandas", "DataFrame"), ("pandas", "Series")}


def library_class(cls: type) -> tuple[str, str]:
    """(top-level module, class name) of `cls`, read from its own dictionary (no attribute code runs)."""
    module = _type_module(cls)
    return (module.split(".")[0] if type(module) is str else "", _type_name(cls))


#: an object array this big is read only where an evenly spread sample of SAMPLE_ITEMS of it holds something other
#: than plain values: a pandas Index's million strings must not spend a scan's time budget
SAMPLE_FROM = 1024
SAMPLE_ITEMS = 256
_PLAIN = frozenset({int, float, str, bool, bytes, type(None)})


def array_items(array: Any) -> Iterator[tuple[Any, str]]:
    """The objects an object-dtype array holds, with their index text (`[17]`, `[2, 5]`); nothing for a
    numeric array (it holds numbers, never a Python object), nor for a big one of plain values."""
    if not array.dtype.hasobject:
        return
    size, shape = array.size, array.shape
    if size > SAMPLE_FROM and _PLAIN.issuperset(map(type, array.flat[:: size // SAMPLE_ITEMS])):
        return
    for flat, item in enumerate(array.flat):
        if type(item) not in _PLAIN:
            yield item, _index_text(flat, shape)


def _index_text(flat: int, shape: tuple[int, ...]) -> str:
    indices = []
    for size in reversed(shape):
        flat, index = divmod(flat, size) if size else (flat, 0)
        indices.append(index)
    return "[" + ", ".join(str(i) for i in reversed(indices)) + "]"


def table_items(table: Any) -> Iterator[tuple[Any, str]]:
    """A DataFrame's object columns (`['conf']`), or a Series' objects (`.iloc[17]`), with their path text."""
    if library_class(type(table))[1] == "DataFrame":
        for column, dtype in table.dtypes.items():
            if dtype == object:
                yield table[column], f"[{column!r}]"
        return
    values = table.to_numpy(copy=False) if table.dtype == object else None
    if values is not None:
        for item, index in array_items(values):
            yield item, f".iloc{index}"
