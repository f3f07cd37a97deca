"""This process's id, kept current across forks without a system call at each step."""

from __future__ import annotations

import os
import weakref

from ..core.step_gate import StepGate


class ThisProcess:
    """This process's id, kept current across forks by an at-fork handler: the step hooks compare it
    with the pid they were installed in at every step, and `os.getpid()` is a system call (~0.15 µs,
    twice a step). The handler is registered once per process, by the first hooks installed (never at
    import), and only stores the new pid."""

    def __init__(self) -> None:
        self.pid = -1  # unknown until the first hooks are installed
        self._registered = False
        #: the step gates the hooks read: opened in a child, whose next step must see that it is a child
        self._gates: weakref.WeakSet[StepGate] = weakref.WeakSet()

    def watch_forks(self) -> int:
        """This process's id from now on kept current in `pid` (also in children forked later)."""
        if not self._registered:
            register = getattr(os, "register_at_fork", None)  # absent where processes cannot fork
            if register is not None:
                register(after_in_child=self._forked)
            self._registered = True
        self.pid = os.getpid()
        return self.pid

    def open_in_children(self, gate: StepGate) -> None:
        """`gate` is opened in every process forked from now on (its steps go to the hooks' slow path,
        which hands them to the child's own watcher)."""
        self._gates.add(gate)

    def _forked(self) -> None:
        self.pid = os.getpid()
        for gate in list(self._gates):
            gate.wake()


this_process = ThisProcess()
