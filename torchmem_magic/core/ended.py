"""What ended a run, kept as the report needs it and never as the exception itself: an exception's
traceback keeps every frame it passed through alive, with the user's locals (a 16 MiB tensor of the
training function), for as long as anything holds the exception."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from .step_requests import RaisedAtStep

#: a kept traceback's entries at most, the innermost ones (the line that raised, and what called it)
MAX_FRAMES = 20


@dataclass(frozen=True)
class Ended:
    """An exception as data: its type, message and formatted frames.

    Attributes:
        type_name: the exception's class name ("KeyboardInterrupt", "MemoryGuardError").
        message: `str()` of it ("" where that fails).
        interrupted: a KeyboardInterrupt (Ctrl-C, the Stop button).
        on_purpose: raised into the loop by the run itself (the memory guard).
        frames: the traceback as `traceback.format_tb` lines, innermost last (at most MAX_FRAMES).
        error_pid, exit_code, signal_name: a launcher's exception naming the process that failed
            (torch's `ProcessExitedException`), else None.
    """

    type_name: str
    message: str
    interrupted: bool = False
    on_purpose: bool = False
    frames: tuple[str, ...] = ()
    error_pid: int | None = None
    exit_code: int | None = None
    signal_name: str | None = None

    def line(self) -> str:
        """`Type: message`, as a report's `error` says it."""
        return f"{self.type_name}: {self.message}".rstrip(": ")


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a hostile __str__: the type still says what ended the run
        return ""


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def ended_by(exc: BaseException | None) -> Ended | None:
    """`exc` as an `Ended` (None for None); reads the exception, keeps nothing of it."""
    if exc is None:
        return None
    try:
        frames = tuple(traceback.format_tb(exc.__traceback__)[-MAX_FRAMES:])
    except Exception:  # a frame whose source cannot be read, a broken linecache
        frames = ()
    signal_name = getattr(exc, "signal_name", None)
    return Ended(
        type(exc).__name__, _text(exc), isinstance(exc, KeyboardInterrupt), isinstance(exc, RaisedAtStep), frames,
        _int_or_none(getattr(exc, "error_pid", None)), _int_or_none(getattr(exc, "exit_code", None)),
        signal_name if isinstance(signal_name, str) else None,
    )
