"""Bytes the C heap really has in use: what the process retains, unlike RSS, which keeps freed pages."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

from ..core.resources import HEAP
from .base import NAN, Reading

#: a heap walk this long or longer lets go of the GIL on the sampler thread (see `HeapProbe`)
RELEASE_GIL_WALK_S = 0.0003


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]


class HeapProbe:
    """Bytes the C heap really has in use (glibc `mallinfo2`: uordblks + hblkhd).

    RSS includes freed-but-not-returned pages; heap in use tracks what is really retained.
    `available` is False (with `unavailable_reason`) on musl/macOS, old glibc, or when
    another allocator is preloaded (its memory is invisible to glibc's counters).

    `mallinfo2` walks the heap's free lists: a few µs on a fresh heap, 0.3 to 2 ms on one a torch loop has
    churned. On the training thread it is called keeping the GIL (the thread holds it anyway, and a
    release would hand it to the sampler thread mid-step). With `release_gil` (the sampler thread) the GIL
    is let go through a walk as long as RELEASE_GIL_WALK_S or longer (the last one tells): kept, the
    training thread would wait the whole walk; let go, it takes the GIL meanwhile and the sampler waits to
    take it back, a handoff that costs the training thread more than a short walk. And a figure
    `offer`ed since the last read (a step sample's, taken on the training thread) is taken instead of a
    walk of its own: in a loop whose steps are sampled between two readings, the sampler never walks.
    """

    name: str = "heap"
    columns: tuple[str, ...] = (HEAP.column,)

    def __init__(self, release_gil: bool = False) -> None:
        self._mallinfo2: Any = None
        self._releasing: Any = None  # mallinfo2 through CDLL, where the GIL may be let go
        self._last_walk_s = 0.0
        self._offered: float | None = None
        self.unavailable_reason: str | None = None
        preload = os.environ.get("LD_PRELOAD", "")
        if not sys.platform.startswith("linux"):
            self.unavailable_reason = f"no glibc heap counters on {sys.platform}"
        elif any(name in preload for name in ("jemalloc", "tcmalloc", "mimalloc")):
            self.unavailable_reason = f"another allocator is preloaded ({preload})"
        else:
            try:
                self._mallinfo2 = _mallinfo2(ctypes.PyDLL)
                self._releasing = _mallinfo2(ctypes.CDLL) if release_gil else None
            except (OSError, AttributeError):
                self.unavailable_reason = "mallinfo2 not found (not glibc >= 2.33)"

    @property
    def available(self) -> bool:
        return self._mallinfo2 is not None

    def heap_bytes(self) -> float:
        """Heap bytes in use, NaN when unavailable."""
        if self._mallinfo2 is None:
            return NAN
        if self._releasing is None:
            info = self._mallinfo2()
        else:
            started_s = time.perf_counter()
            info = (self._releasing if self._last_walk_s >= RELEASE_GIL_WALK_S else self._mallinfo2)()
            self._last_walk_s = time.perf_counter() - started_s
        return float(info.uordblks + info.hblkhd)

    def offer(self, heap_bytes: float) -> None:
        """A figure read since the last read, for the next read to take."""
        self._offered = heap_bytes

    def read(self) -> Reading:
        offered, self._offered = self._offered, None
        return {HEAP.column: self.heap_bytes() if offered is None else offered}

    def close(self) -> None:
        pass


def _mallinfo2(library: Any) -> Any:
    """glibc's mallinfo2 through `library` (ctypes.PyDLL keeps the GIL, ctypes.CDLL lets go of it)."""
    fn = library(None).mallinfo2
    fn.restype, fn.argtypes = _Mallinfo2, []
    return fn
