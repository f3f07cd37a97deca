"""A Ctrl-C that comes after a `%%memwatch` cell has ended, in a Jupyter kernel, must not lose the cell's reply.

ipykernel runs a cell with Python's default SIGINT handler and puts its own (ignore) back only after
it has sent the cell's reply. A SIGINT in between raises KeyboardInterrupt into ipykernel's own code,
which catches it, logs "KeyboardInterrupt caught in kernel" and never sends the reply: the front end
shows the cell as running for good although the kernel is idle. A memwatch cell's end (the report, its
figure) takes long enough that a Ctrl-C meant for it often comes just after it, so when the cell magic
returns it leaves a handler that passes a SIGINT on while the user's code runs (a `%%memwatch` run from
a cell through `run_cell`: the outer cell goes on) and drops it otherwise. ipykernel replaces it with
its own when the request is answered; nothing of it outlives the cell.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

#: SIGINTs dropped because they came after the cell's code (nothing was left to interrupt)
dropped = 0


def _runs_user_code(frame: FrameType | None, user_globals_id: int) -> bool:
    """Whether a frame of the user's (one whose globals are the notebook's namespace) is on the stack."""
    while frame is not None:
        if id(frame.f_globals) == user_globals_id:
            return True
        frame = frame.f_back
    return False


class LateInterruptHandler:
    """SIGINT: the default KeyboardInterrupt while a frame of the user's runs, none otherwise. It keeps
    the namespace's id, not the namespace (no reference to the user's objects)."""

    def __init__(self, user_globals_id: int) -> None:
        self.user_globals_id = user_globals_id

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        global dropped
        if _runs_user_code(frame, self.user_globals_id):
            signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt
        # no output here: the signal may have cut into a stream's write, which holds that stream's lock
        dropped += 1


def drop_late_interrupts(shell: Any) -> bool:
    """At the end of a `%%memwatch` cell in a kernel: install the handler (see the module's docstring).
    Only on the main thread and only over the default handler ipykernel set for this request, so a
    terminal IPython, a handler of the user's and a kernel that does not restore its own are left as
    they are. Returns whether it was installed."""
    if getattr(shell, "kernel", None) is None or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    signal.signal(signal.SIGINT, LateInterruptHandler(id(shell.user_global_ns)))
    return True
