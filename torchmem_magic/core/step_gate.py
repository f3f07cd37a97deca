"""The step clock's gate: what the chosen clock's hook reads at every step. A step before `due_step` is one
comparison and one increment in the hook itself; the step that reaches it goes to the session, which does
what is due (a sample, a scan, a request) and arms the next due step. Work asked for from another thread
opens the gate (`wake`) after it is in place, so the next step sees it."""

from __future__ import annotations

from typing import Literal

GatedClock = Literal["optimizer", "backward", "batch", "forward"]


class StepGate:
    """The chosen clock (None: none yet, every step goes to the session), its steps so far, and the step at
    which the session wants the next one (0: the next step, whichever it is)."""

    __slots__ = ("clock", "step", "due_step", "wakes", "__weakref__")

    def __init__(self) -> None:
        self.clock: GatedClock | None = None
        self.step = 0
        self.due_step = 0
        #: how many times it was opened: the session reads it before it works out the next due step and
        #: opens the gate again if it moved meanwhile (a wake between the two would be lost otherwise)
        self.wakes = 0

    def wake(self) -> None:
        """The next step goes to the session (any thread may ask, once what it asks for is in place)."""
        self.wakes += 1
        self.due_step = 0
