"""A live view over a timeline the test fills itself, with no session run: what the live figure draws."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from torchmem_magic.session.live_view import LiveView
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.probes.limits import MemoryLimit
from torchmem_magic.tracing.steps import RunTime, StepCounter
from torchmem_magic.core.timeline import Timeline

GIB = 1 << 30


def idle_view(timeline: Timeline, ranks: Any = None) -> LiveView:
    """`ranks`: anything with the RankFeeds' `snapshot()`."""
    probes = SimpleNamespace(limit=MemoryLimit(64 * GIB, "system"), tree=SimpleNamespace(workers=0))
    return LiveView(SessionOptions(10), RunTime(time.perf_counter), StepCounter(), timeline, probes, None, ranks, None)  # type: ignore[arg-type]
