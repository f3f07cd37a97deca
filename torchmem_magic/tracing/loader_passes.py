"""DataLoader passes as the hooks see them: each loader's number, each pass's workers and length, and whether
two loaders' passes run at once. While passes run one after the other, the loader whose pass began last
gives every batch, so a pass's start says which loader carries the steps; once they interleave (`zip` of two
loaders, a validation pass inside a training epoch) only a batch's own hook can tell."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoaderPass:
    """A new iterator over a DataLoader: one pass of it (an epoch when it is the training loader)."""

    loader: int  # the loader's number in this run (1, 2, ...): train and validation loaders differ
    workers: list[tuple[int, Any]]  # (pid, multiprocessing.Process) of its worker processes
    batches: int | None  # batches in the pass (None for iterable datasets without a length)


def pass_length(iterator: Any) -> int | None:
    try:
        return int(len(iterator))
    except Exception:
        return None


def pass_workers(iterator: Any) -> list[tuple[int, Any]]:
    """(pid, multiprocessing.Process) of a multi-process iterator's workers (its Process object keeps
    the exit code once multiprocessing has reaped the worker)."""
    workers = []
    for worker in getattr(iterator, "_workers", None) or ():
        pid = getattr(worker, "pid", None)
        if isinstance(pid, int):
            workers.append((pid, worker))
    return workers


def _under_way(iterator: Any) -> bool:
    """Whether a live pass may still give batches: it has not yielded its length (unknown: it may)."""
    if iterator is None:
        return False
    yielded, length = getattr(iterator, "_num_yielded", None), pass_length(iterator)
    return not isinstance(yielded, int) or length is None or yielded < length


class LoaderTable:
    """The loaders seen in a run (weakly: a loader or an iterator is never kept alive here)."""

    def __init__(self) -> None:
        self._numbers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._next_number = itertools.count(1)
        self.iterator_loaders: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._latest: dict[int, weakref.ref[Any]] = {}  # each loader's latest pass
        self.interleaved = False  # two loaders' passes were under way at once (for the rest of the run)

    def begin(self, loader: Any, iterator: Any) -> int:
        """A pass of `loader` begins with `iterator`: the loader's number. Notes whether another loader's
        pass is still under way."""
        number = self._numbers.get(loader)
        if number is None:
            number = self._numbers[loader] = next(self._next_number)
        self.iterator_loaders[iterator] = number
        if not self.interleaved:
            self.interleaved = any(n != number and _under_way(latest()) for n, latest in self._latest.items())
        self._latest[number] = weakref.ref(iterator)
        return number
