"""Dataclasses to plain JSON data and back, driven by their own fields (stdlib only).

One serialization for everything that leaves a process: a saved report, a rank's evidence streamed
to its watcher, a summary in a job's store. Writing reads the fields; reading reads the fields'
types, so a field added to a class travels without touching a writer or a reader. A field's key is
its name without the `_bytes` suffix (`peak_bytes` -> `peak`) unless its metadata names another
(`{"key": "errors"}`) or none (`{"key": None}`: not written, such as a timeline streamed apart).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, Union

#: a field's metadata: `spread` a reader `(cls, data) -> value` for summaries each saved under a key of its own
SpreadReader = Callable[[type[Any], dict[str, Any]], Any]


def schema_key(field: dataclasses.Field[Any]) -> str | None:
    """The key a field has in plain data (None: not written)."""
    if "key" in field.metadata:
        key: str | None = field.metadata["key"]
        return key
    return field.name.removesuffix("_bytes")


def to_plain(value: Any) -> Any:
    """`value` as plain JSON data: a dataclass as the object of its keys, tuples and sets as lists."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return schema_dict(value)
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(to_plain(v) for v in value)
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def schema_dict(obj: Any) -> dict[str, Any]:
    """A dataclass's fields under their keys, as plain data; a `spread` field's summaries each under its name."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        if f.metadata.get("spread"):
            out.update((summary.name, summary.to_dict()) for summary in getattr(obj, f.name))
            continue
        key = schema_key(f)
        if key is not None:
            out[key] = to_plain(getattr(obj, f.name))
    return out


_TYPE_HINTS: dict[type[Any], dict[str, Any]] = {}  # the package's own classes only


def _type_hints(cls: type[Any]) -> dict[str, Any]:
    """A class's field types, resolved once: resolving them costs more than the rest of a decoding (a
    watcher of many ranks decodes every rank's summary once a second)."""
    hints = _TYPE_HINTS.get(cls)
    if hints is None:
        hints = _TYPE_HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _value(kind: Any, value: Any) -> Any:
    """`value` read from plain data as a `kind` (a field's type: a dataclass, a tuple, an optional, ...)."""
    if value is None:
        return None
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union or origin is types.UnionType:
        options = [a for a in args if a is not type(None)]
        return _value(options[0], value) if len(options) == 1 else value
    if isinstance(kind, type) and is_dataclass(kind):
        return from_dict(kind, value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v) for v in value)
        return tuple(_value(a, v) for a, v in zip(args, value)) if args else tuple(value)
    if origin in (list, frozenset, set):
        items = [_value(args[0], v) for v in value] if args else list(value)
        return origin(items)
    if origin in (dict, Mapping):
        return {k: _value(args[1], v) for k, v in value.items()} if len(args) == 2 else dict(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value  # a plain value: int, str, bool, a Literal, Any


def from_dict(cls: type[Any], data: dict[str, Any], **given: Any) -> Any:
    """The `cls` whose plain data is `data`, with `given` for fields not written (a timeline streamed apart);
    a key it lacks takes the field's default (ValueError when the field has none)."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    kinds = _type_hints(cls)
    kwargs: dict[str, Any] = dict(given)
    for f in fields(cls):
        if f.name in given or not f.init:
            continue
        spread: SpreadReader | None = f.metadata.get("spread")
        if spread:
            kwargs[f.name] = spread(cls, data)
            continue
        key = schema_key(f)
        if key is not None and key in data:
            kwargs[f.name] = _value(kinds[f.name], data[key])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{cls.__name__}: the saved data has no {key!r}")
    return cls(**kwargs)
