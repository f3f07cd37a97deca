"""The passes of a run's phases of their own (validation, test, a Trainer's evaluation), as a trainer's
callback marks them on the training thread: a reading as each pass begins and as it ends."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..analysis.phases import PhasePass

MAX_PASSES = 10_000  # passes kept, the first ones (one a validation epoch: far more than a run makes)


class PhaseLog:
    """Pairs each pass's beginning with its end. `read` gives the step reading (timeline columns to bytes),
    `step` the step clock's count."""

    def __init__(self, read: Callable[[], Mapping[str, float]], step: Callable[[], int]) -> None:
        self._read, self._step = read, step
        self._open: dict[str, tuple[int, dict[str, float]]] = {}
        self.passes: list[PhasePass] = []

    def mark(self, name: str, began: bool) -> None:
        """A pass of `name` begins (`began`) or ends; an end with no beginning, or a beginning again before
        the end, is taken as it comes (the latest beginning counts)."""
        if began:
            self._open[name] = (self._step(), dict(self._read()))
            return
        opened = self._open.pop(name, None)
        if opened is not None and len(self.passes) < MAX_PASSES:
            self.passes.append(PhasePass(name, opened[0], opened[1], dict(self._read())))
