"""Scan results kept from one cell to the next, for the names whose objects did not change.

Scanning a namespace of a million records takes most of a second; doing it before and after every
cell would make each `%%memwatch` cell that much slower even when its body is `pass`. A name's
result is reused while its *fingerprint* stays the same: the ids and lengths of the object and of a
bounded sample of what it holds (the first and last items of each container, an instance's
attributes, a leaf tensor's `.grad`), a few levels deep. Appending to a list, even one inside a
dict or an object, rebinding a name, a gradient appearing: each changes it. What it cannot see is
a change deep inside an item in the middle of a large container. So the scan at the end of a cell
reuses only the names that are expensive to scan (the cheap ones are scanned again whatever their
fingerprint), and the names the run's own scans saw growing are always scanned again.

It keeps numbers, names and ids only: no reference to anything it fingerprinted.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Collection, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

from .introspect import ATOMIC, EXCEPTION, FRAME, OBJECT, SKIP, TENSOR, TRACEBACK, TypeCategories, children
from .results import Budget, Root, RootStats, ScanResult
from .scanner import scan_roots

MAX_NODES = 64  # objects looked at per name
MAX_DEPTH = 3
EDGE_ITEMS = 4  # items taken from each end of a container
OBJECT_ATTRIBUTES = 32  # attributes taken from an object
OBJECT_LENGTHS = 256  # attributes of an object whose length (lists, dicts) is part of the fingerprint

Fingerprint = tuple[int, ...]
#: an exception and its traceback never change once raised: their ids are their fingerprint
_FINISHED = frozenset({EXCEPTION, TRACEBACK, FRAME})
_SIZED_BASES: tuple[type, ...] = (list, tuple, dict, set, frozenset, deque)


def fingerprints(roots: Iterable[Root]) -> dict[str, Fingerprint | None]:
    """Each name's fingerprint (several roots may share a name); None where it could not be read."""
    torch = sys.modules.get("torch")
    categories = TypeCategories(torch)
    grad_of: Any = torch._C.TensorBase.grad.__get__ if torch is not None else None
    is_leaf: Any = torch._C.TensorBase.is_leaf.__get__ if torch is not None else None
    parts: dict[str, list[int] | None] = {}
    # no tensor subclass' Python code runs
    with torch._C.DisableTorchFunctionSubclass() if torch is not None else nullcontext():
        for root in roots:
            so_far = parts.setdefault(root.name, [])
            if so_far is None:
                continue
            try:
                _walk(root.obj, categories, grad_of, is_leaf, so_far)
            except Exception:  # introspection raised: this name is always scanned
                parts[root.name] = None
    return {name: None if p is None else tuple(p) for name, p in parts.items()}


def _walk(obj: Any, categories: TypeCategories, grad_of: Any, is_leaf: Any, out: list[int]) -> None:
    """Breadth-first over a bounded sample, through the same C-level accessors the scan uses."""
    queue: deque[tuple[Any, int]] = deque([(obj, 0)])
    seen = 0
    while queue and seen < MAX_NODES:
        node, depth = queue.popleft()
        category = categories.of(type(node))
        if category is ATOMIC or category is SKIP:
            continue
        seen += 1
        out.append(id(node))
        if category is TENSOR:
            grad = grad_of(node) if is_leaf(node) else None
            out.append(0 if grad is None else id(grad))
            continue
        if category in _FINISHED:
            continue  # its frames reach live objects (the shell) that change at every cell
        cls = type(node)
        if cls is list or cls is tuple:
            out.append(len(node))
            items: Iterable[Any] = (*node[:EDGE_ITEMS], *node[-EDGE_ITEMS:]) if len(node) > EDGE_ITEMS else node
        elif cls is dict:
            out.append(len(node))
            values = dict.values(node)
            items = (*islice(values, EDGE_ITEMS), *islice(reversed(values), EDGE_ITEMS))
        else:
            length = _base_length(cls)
            if length is not None:  # a subclass' own __len__ is never called
                out.append(length(node))
            # a container subclass: its first items; an object: its attributes (an nn.Module's own come
            # after a dozen of torch's)
            limit = 2 * EDGE_ITEMS if length is not None else OBJECT_ATTRIBUTES
            if length is None and category is OBJECT:
                # every exact list/dict attribute's length, past the sampled ones too (a LightningModule's
                # own `validation_outputs` come after dozens of torch's), and its classes' containers
                found = [child for child, _, _ in islice(children(node, category), OBJECT_LENGTHS)]
                found.extend(child for child, _, _ in categories.class_children(cls))
                out.extend(len(child) for child in found if type(child) is list or type(child) is dict)
                items = found[:limit]
            else:
                items = (child for child, _, _ in islice(children(node, category), limit))
        if depth < MAX_DEPTH:
            queue.extend((child, depth + 1) for child in items)


def _base_length(cls: type) -> Any:
    """The builtin base type's C `__len__` for a container subclass (deque, OrderedDict, a user's list)."""
    for base in _SIZED_BASES:
        if issubclass(cls, base):
            return base.__len__  # type: ignore[attr-defined]
    return None


@dataclass(frozen=True)
class _Entry:
    fingerprint: Fingerprint
    stats: RootStats


class ScanMemo:
    """The last scan's figures per name, with the fingerprint its objects had then."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self.full_scan_cost_s = 0.0  # what the last scan of every name took

    def split(
        self, roots: list[Root], current: dict[str, Fingerprint | None], rescan: Collection[str] = (),
        min_objects: int = 0,
    ) -> tuple[list[RootStats], list[Root]]:
        """The stats of the names whose objects are unchanged (reused) and the roots to scan: the names
        in `rescan` whatever their fingerprint, and those whose last scan met fewer than `min_objects`
        (cheap to scan again, and then nothing beyond the fingerprint's sample goes unseen), except the
        last exception's: it does not change once raised, and its frames reach the whole shell."""
        reused = []
        for name in current:
            entry = self._entries.get(name)
            if (
                entry is not None and name not in rescan and entry.fingerprint == current[name]
                and (entry.stats.objects + entry.stats.plain_objects >= min_objects or entry.stats.kind == "traceback")
            ):
                reused.append(entry.stats)
        kept = {s.name for s in reused}
        return reused, [r for r in roots if r.name not in kept]

    def record(self, result: ScanResult, current: dict[str, Fingerprint | None], out_of_time: bool = False) -> None:
        """Keep what a scan found, with the fingerprints its names had when it ran; forget names gone.
        A name cut short because the scan ran `out_of_time` is scanned again next time (then it may
        fit); one cut short by the other limits (depth, children per container) would be cut the same."""
        for name in [n for n in self._entries if n not in current]:
            del self._entries[name]
        for stats in result.roots:
            fingerprint = current.get(stats.name)
            if fingerprint is None or (stats.truncated and out_of_time):
                self._entries.pop(stats.name, None)
            else:
                self._entries[stats.name] = _Entry(fingerprint, stats)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def scan_reusing(
    memo: ScanMemo, roots: list[Root], budget: Budget, rescan: Collection[str] = (), min_objects: int = 0
) -> ScanResult:
    """A scan of `roots` that scans only the names changed since `memo` last saw them (see `split`),
    with the others' figures taken from the memo; `elapsed_s` is what this scan took."""
    current = fingerprints(roots)
    reused, to_scan = memo.split(roots, current, rescan, min_objects)
    scanned = {r.name for r in to_scan}
    # what the reused names hold stays theirs (a traceback's frames reach the whole namespace)
    result = scan_roots(to_scan, budget, seen=[id(r.obj) for r in roots if r.name not in scanned])
    memo.record(result, current, out_of_time=result.elapsed_s >= budget.time_s)
    if not reused:
        memo.full_scan_cost_s = result.elapsed_s
    merged = sorted([*result.roots, *reused], key=lambda s: -s.retained_bytes)
    return replace(
        result, roots=merged, objects=result.objects + sum(s.objects for s in reused),
        reused=frozenset(s.name for s in reused),
    )
