"""What makes a session's start and end hold whatever happens: the one active session (a registry per
process, emptied in a forked child), garbage collected before a run, and the two ways of finishing a
step to its end although the user's Ctrl-C or torch's SIGCHLD handler cut into it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ..analysis.forensics import parse_worker_death
from ..finder.scan.memo import ScanMemo


class _Closable(Protocol):
    def close(self) -> None: ...


class ActiveSession(Protocol):
    @property
    def ranks(self) -> _Closable | None: ...


SessionT = TypeVar("SessionT", bound=ActiveSession)
ReportT = TypeVar("ReportT")


class Registry(Generic[SessionT, ReportT]):
    """The one active session and the last report (what `last_report()` returns)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: SessionT | None = None
        self.last: ReportT | None = None
        # names' scan results from one session to the next: an unchanged name is not scanned again
        self.scan_memo = ScanMemo()

    def forget_inherited(self) -> None:
        """In a forked process: the watcher's session (copied with the memory) is not this process's."""
        self.lock = threading.Lock()  # the parent may have held it while forking
        inherited = self.active
        if inherited is not None and inherited.ranks is not None:
            inherited.ranks.close()  # only the socket's copy here: its directory stays the watcher's
        self.active = None
        self.last = None


def collect_young_garbage() -> None:
    """Cyclic garbage the previous cells left young would otherwise be freed whenever the collector next
    runs, as a drop in the middle of this cell's curves (seen to hide a per-epoch staircase). Only the
    young generations: a full collection walks every object of the process (0.1 s with torch imported
    and a large namespace), and garbage already in the old generation is freed only when a full
    collection comes due, rarely within one cell."""
    gc.collect(1)


def cuts_in_anywhere(error: BaseException) -> bool:
    """Whether `error` is one a signal handler raises into whatever line runs, also before a function's
    first `try`: a Ctrl-C's KeyboardInterrupt, or the DataLoader worker death that torch's SIGCHLD
    handler raises (a full /dev/shm kills the workers one after another)."""
    if isinstance(error, KeyboardInterrupt):
        return True
    return isinstance(error, Exception) and parse_worker_death(str(error)) is not None


def despite_worker_deaths(action: Callable[[], None], interruptions: list[BaseException]) -> None:
    """Run `action` (safe to repeat), again when torch's SIGCHLD handler interrupts it with a
    "DataLoader worker ... killed" error; the interruptions are collected for the caller."""
    for attempt in range(4):
        try:
            action()
            return
        except Exception as interruption:
            if attempt == 3 or parse_worker_death(str(interruption)) is None:
                raise
            interruptions.append(interruption)


def despite_interrupts(action: Callable[[], None], interrupted: list[KeyboardInterrupt]) -> None:
    """Run `action` (safe to repeat) to its end even when a KeyboardInterrupt (a second Ctrl-C) cuts it
    short; the interrupt, without its frames, is kept for the caller to raise."""
    try:
        action()
    except KeyboardInterrupt as interrupt:
        interrupted.append(interrupt.with_traceback(None))
        action()


class Ending:
    """What cut into a session's end, kept to be raised once the report exists: DataLoader workers'
    deaths that torch's SIGCHLD handler raised into it, and Ctrl-Cs. `exc` is what ended the block."""

    def __init__(self, exc: BaseException | None) -> None:
        self.exc = exc
        self.deaths: list[BaseException] = []
        self.interrupts: list[KeyboardInterrupt] = []

    def run(self, action: Callable[[], None]) -> None:
        """Run `action` (safe to repeat) to its end, whatever cuts into it."""
        despite_interrupts(lambda: despite_worker_deaths(action, self.deaths), self.interrupts)

    def run_or_fall_back(self, action: Callable[[], None], fallback: Callable[[], None]) -> None:
        """`action`; on a Ctrl-C during it, `fallback` instead (the interrupt is kept)."""
        try:
            despite_worker_deaths(action, self.deaths)
        except KeyboardInterrupt as interrupt:
            self.interrupts.append(interrupt.with_traceback(None))
            despite_worker_deaths(fallback, self.deaths)

    def worker_death(self) -> BaseException | None:
        """A death raised into the end that is not what the block already raised (repeats dropped)."""
        if not self.deaths or (self.exc is not None and parse_worker_death(str(self.exc)) is not None):
            return None
        return self.deaths[0]

    def ended_by(self) -> BaseException | None:
        return self.worker_death() or self.exc or (self.interrupts[0] if self.interrupts else None)

    def raise_kept(self) -> None:
        """Raise the death (chained to the block's exception), else the interrupt that ended a block
        which had ended by itself; nothing otherwise."""
        death = self.worker_death()
        if death is not None:
            raise death from self.exc
        if self.interrupts and self.exc is None:
            raise self.interrupts[0]
