"""Work asked for from another thread (a button click), run at the next step (of the loop's step clock) on the
training thread, so it never races the user's loop."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable


def _nothing() -> None:
    pass


def _ignore(exc: BaseException) -> None:
    pass


class StopTraining(KeyboardInterrupt):
    """Raised at an optimizer-step boundary when the user asked to stop (the Stop button).

    A KeyboardInterrupt, so `except Exception` in user code does not swallow it; %%memwatch ends
    the cell quietly after reporting.
    """


class RaisedAtStep:
    """Marks an exception that a step request raises into the user's loop on purpose (the memory
    guard's): the step hooks let it through instead of counting it as a failure of their own."""


class StepRequests:
    """A thread-safe queue of actions plus a stop flag, drained at each step boundary."""

    def __init__(self, on_error: Callable[[Exception], None]) -> None:
        self._actions: deque[Callable[[], None]] = deque()  # deque append/popleft are atomic
        self._stop = threading.Event()
        self._on_error = on_error
        self._raise: BaseException | None = None  # raised at the next step, once
        self.open = False  # while the run goes on: what is asked then runs at the next step
        #: whether `run` has something to do: a plain attribute, read at every step (a property and the
        #: Event's own method would be two Python calls there); set after what it announces is in place
        self.pending = False
        #: opens the step gate once something is asked: the loop's next step runs it
        self.wake: Callable[[], None] = _nothing
        #: told of each exception `run` raises on purpose, as it raises it (the guard, which keeps none)
        self.on_raise: Callable[[BaseException], None] = _ignore

    def start(self) -> None:
        self.open = True

    def close(self) -> None:
        """The run ended: nothing asked from now on runs at a step."""
        self.open = False

    def request(self, action: Callable[[], None]) -> None:
        self._actions.append(action)
        self.pending = True
        self.wake()

    def request_stop(self) -> None:
        self._stop.set()
        self.pending = True
        self.wake()

    def raise_at_step(self, exc: BaseException) -> None:
        """Raise `exc` in the training thread at the next step (after any queued actions)."""
        self._raise = exc
        self.pending = True
        self.wake()

    def run(self, step: int) -> None:
        """Run what was asked; an action's failure goes to `on_error`, never into the loop. The flag is
        lowered before the queue is read: what another thread asks meanwhile raises it again."""
        __tracebackhide__ = True
        self.pending = False
        while self._actions:
            action = self._actions.popleft()
            try:
                action()
            except Exception as exc:
                self._on_error(exc)
        raising, self._raise = self._raise, None
        if raising is not None:
            self.on_raise(raising)
            raise raising
        if self._stop.is_set():
            self._stop.clear()
            raise StopTraining(f"stopped with the Stop button after step {step}")
