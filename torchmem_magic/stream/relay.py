"""A timeline whose rows, restarts and loader passes are also queued for a stream: a rank's watcher,
or the flight record on disk."""

from __future__ import annotations

from ..core.timeline import DecimatingSeries, Row, Timeline
from .protocol import row_values
from .transport import Outbox


class _RelaySeries(DecimatingSeries):
    """A series that also queues every row it gets for the watcher."""

    def __init__(self, outbox: Outbox, kind: str, capacity: int) -> None:
        super().__init__(capacity)
        self._outbox, self._kind = outbox, kind

    def append(self, row: Row) -> None:
        super().append(row)
        self._outbox.append([self._kind, row_values(row)])


class RelayTimeline(Timeline):
    """The rank session's timeline: every row, restart and loader pass is also queued for the watcher."""

    def __init__(self, outbox: Outbox, capacity: int = 2000) -> None:
        self._outbox = outbox
        super().__init__(capacity)
        self.by_time = _RelaySeries(outbox, "t", capacity)
        self.by_step = _RelaySeries(outbox, "s", capacity)

    def add_pass(self, t_s: float, loader: int, steps: tuple[int, ...]) -> None:
        super().add_pass(t_s, loader, steps)
        self._outbox.append(["p", t_s, loader, list(steps)])

    def restart_steps(self) -> None:
        self.by_step = _RelaySeries(self._outbox, "s", self.capacity)
        self._outbox.append(["r"])
