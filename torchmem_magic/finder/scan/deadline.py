"""When a scan's time is up. Its budget is CPU time of the thread that scans: on a busy machine the other
processes stretch the wall time of the same work, and a wall-time budget would then cut a scan short that a
quiet machine finishes (a holder measured on one machine and not on another). The wall time is capped too, at
WALL_PER_CPU_S times the budget, so that no scan outlasts that whatever happens."""

from __future__ import annotations

import time

WALL_PER_CPU_S = 4.0


class Deadline:
    """A scan's deadline, set when it starts; `passed()` is a check cheap enough for every 1024 objects."""

    __slots__ = ("cpu_s", "wall_s")

    def __init__(self, budget_s: float) -> None:
        self.cpu_s = time.thread_time() + budget_s
        self.wall_s = time.perf_counter() + WALL_PER_CPU_S * budget_s

    def passed(self) -> bool:
        return time.thread_time() > self.cpu_s or time.perf_counter() > self.wall_s
