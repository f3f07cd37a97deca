"""A `%%memwatch` cell that fails must show its error: a DataLoader worker's death that torch reports after
the cell's own error is kept out of IPython's formatting of that error's traceback.

torch's SIGCHLD handler raises a worker's death into whatever runs in the main thread, once for each loader
iterator. A loop that read from the dead worker first fails with its own error (a reset connection, "exited
unexpectedly"), and the handler's report comes later; so does the next worker's, when a full /dev/shm kills
them one after another. A report raised while IPython formats the cell's traceback is caught by IPython,
which prints "Unexpected exception formatting exception" and sends no error: the cell fails with nothing
shown. So from the moment the cell's error leaves the magic until the cell's `post_run_cell` event (the
traceback has been shown by then), a handler in front of the SIGCHLD handler keeps the worker deaths it
raises, and says them in one line each after the traceback; the handler is back in place from then on.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..analysis.forensics import parse_worker_death


class WorkerDeathsKept:
    """SIGCHLD: the handler in place (torch's), with the worker deaths it raises kept (in `kept`), not raised."""

    def __init__(self, handler: Callable[[int, FrameType | None], Any]) -> None:
        self.handler = handler
        self.kept: list[str] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        try:
            self.handler(signum, frame)
        except RuntimeError as death:
            if parse_worker_death(str(death)) is None:
                raise
            if str(death) not in self.kept:
                self.kept.append(str(death))


def keep_later_worker_deaths(shell: Any) -> bool:
    """As the cell's error leaves the magic: put the handler in front of the SIGCHLD handler (torch's, where a
    DataLoader with workers ran) until the cell's `post_run_cell`. Only in the main thread, over a Python
    handler, and where the shell has events. Returns whether it was put in place."""
    events = getattr(shell, "events", None)
    if events is None or threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGCHLD)
    if not callable(current) or isinstance(current, WorkerDeathsKept):
        return False
    keeper = WorkerDeathsKept(current)
    signal.signal(signal.SIGCHLD, keeper)

    def put_back(*_: Any) -> None:
        events.unregister("post_run_cell", put_back)
        if signal.getsignal(signal.SIGCHLD) is keeper:
            signal.signal(signal.SIGCHLD, current)
        for death in keeper.kept:
            print(f"torchmem_magic: reported while the error above was shown: {death}", file=sys.stderr)

    events.register("post_run_cell", put_back)
    return True
