"""Paths from a root to what it holds, as a user would write them: `history[3]`, `model[0].weight`.

Most objects a scan visits hold no tensor, so their path is never written: each visit carries a lazy
link (parent path, how, token), and the text is spelled out only for the tensors found.
"""

from __future__ import annotations

import re
from typing import Any, TypeAlias

from .introspect import ATTR, INDEX, KEY, KEY_OBJECT, SLOT, type_name
from .results import FunctionSlot

LazyPath: TypeAlias = "str | tuple[LazyPath, str, Any]"  # a root's text, or (parent, how, token)

_MODULE_INTERNALS = re.compile(r"\._(?:modules|parameters|buffers)\[('([^']*)'|\"([^\"]*)\")\]")
_LITERAL_KEY_TYPES = (str, int, float, bool, type(None))


def key_text(key: Any) -> str:
    """A mapping key as code (`'val'`, `3`), or `<TypeName>` for a key whose repr would run its code."""
    if type(key) in _LITERAL_KEY_TYPES:
        return repr(key)
    return f"<{type_name(type(key))}>"


def link_text(parent: str, how: str, token: Any) -> str:
    """The path of a child reached from `parent` as `how` (introspect's link kinds) with `token`."""
    if how == INDEX:
        return f"{parent}[{token}]"
    if how == KEY:
        return f"{parent}[{key_text(token)}]"
    if how == ATTR:
        return f"{parent}.{token}"
    if how == KEY_OBJECT:
        return f"{parent}.keys()[{key_text(token)}]"
    if how == SLOT:
        return f"{parent}{token[0]}"
    return f"{parent}{token}"


def path_text(path: LazyPath) -> str:
    """Spell out a lazy path, from its root's text down."""
    links = []
    while type(path) is tuple:
        path, how, token = path
        links.append((how, token))
    text = str(path)
    for how, token in reversed(links):
        text = link_text(text, how, token)
    return text


def innermost_slot(path: LazyPath) -> tuple[str, FunctionSlot] | None:
    """The function slot nearest the end of `path` (the default, captured variable or method attribute
    that holds what the path reaches), with the slot's own path; None when the path enters none."""
    while type(path) is tuple:
        parent, how, token = path
        if how == SLOT:
            return pretty_path(path_text(path)), token[1]
        path = parent
    return None


def pretty_path(path: str) -> str:
    """`model._modules['0']._parameters['weight']` -> `model[0].weight`: how a user writes it."""

    def plain(match: re.Match[str]) -> str:
        name = match.group(2) if match.group(2) is not None else match.group(3)
        if name.isidentifier():
            return f".{name}"
        return f"[{name}]" if name.isdigit() else f"[{name!r}]"

    return _MODULE_INTERNALS.sub(plain, path) if "._" in path else path
