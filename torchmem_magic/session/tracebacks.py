"""Tracebacks that IPython can show, also of an exception a signal handler raised.

A signal handler's exception (a Ctrl-C's KeyboardInterrupt; a DataLoader worker's death, which torch's
SIGCHLD handler raises) lands at whatever instruction runs, and Python 3.11 gives some instructions no
line number: the jump back to a loop's top after an `if` or a `with` in its body, where a Ctrl-C of a
busy loop usually lands. That frame's line and its traceback entry's are then None; IPython's formatter
fails on either ("Unexpected exception formatting exception") and sends the front end no error: the
cell fails with nothing shown. `give_lines` replaces each such entry by one that shows the same file,
function and the line the instruction stands for. A frame's line cannot be set, so the new entry's frame
is a stand-in: a frame of that file and function name that stopped at that line.
"""

from __future__ import annotations

import dis
from collections.abc import Iterator
from types import CodeType, FrameType, TracebackType
from typing import Any

#: jumps, whose target tells the line a jump without one belongs to
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


def line_standing_for(code: CodeType, offset: int) -> int:
    """The line an instruction without one stands for: a jump's target's (a loop's jump back: its header
    line), else the nearest line before it, else the `def` line."""
    target = next((ins.argval for ins in dis.get_instructions(code) if ins.offset == offset and ins.opcode in _JUMPS), None)
    lines = [(start, end, line) for start, end, line in code.co_lines() if line is not None]
    if isinstance(target, int):
        for start, end, line in lines:
            if start <= target < end:
                return line
    before = [(start, line) for start, _, line in lines if start <= offset]
    return max(before)[1] if before else code.co_firstlineno


class _Captured(Exception):
    """Raised by a stand-in frame's code, to catch the frame."""


def stand_in_frame(frame: FrameType, line: int) -> FrameType:
    """A finished frame of `frame`'s file, function name and module that stopped at `line`. It keeps none
    of `frame`'s variables, and no caller: it is a generator's, whose finished frame (Python 3.11) has
    no `f_back` (a function's would keep every frame up the stack alive, with their variables)."""
    original = frame.f_code
    namespace: dict[str, Any] = {"__name__": frame.f_globals.get("__name__"), "captured": _Captured()}
    del frame  # the traceback caught below holds this function's frame: not the original's variables
    first = min(max(original.co_firstlineno, 1), line)  # the original's first line too: IPython reads its source from there
    source = "\n" * (first - 1) + "def stand_in():" + "\n" * (line - first) + " raise captured; yield\n"
    exec(compile(source, original.co_filename, "exec"), namespace)
    names: dict[str, Any] = {"co_name": original.co_name}
    if hasattr(original, "co_qualname"):  # Python 3.11+
        names["co_qualname"] = original.co_qualname
    stand_in = namespace.pop("stand_in")
    stand_in.__code__ = stand_in.__code__.replace(**names)
    try:
        next(stand_in())
    except _Captured as caught:
        assert caught.__traceback__ is not None and caught.__traceback__.tb_next is not None
        finished = caught.__traceback__.tb_next.tb_frame
        caught.__traceback__ = None  # it is in the stand-in's globals: no cycle through this frame
    del namespace["captured"]
    return finished


def _with_lines(tb: TracebackType | None) -> TracebackType | None:
    """`tb` with every entry that has no line number replaced (the same entries when none lacks one)."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    lineless = [index for index, entry in enumerate(entries) if entry.tb_lineno is None]
    if not lineless:
        return entries[0] if entries else None
    for index in lineless:
        frame = entries[index].tb_frame
        stand_in = stand_in_frame(frame, line_standing_for(frame.f_code, entries[index].tb_lasti))
        entries[index] = TracebackType(None, stand_in, stand_in.f_lasti, stand_in.f_lineno)
    for entry, following in zip(entries, [*entries[1:], None]):
        entry.tb_next = following
    return entries[0]


def _chained(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions chained to it (cause, context, an exception group's members), each once."""
    pending: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [current.__cause__, current.__context__, *getattr(current, "exceptions", ())]


def give_lines(exc: BaseException) -> None:
    """Give every traceback entry of `exc` and of the exceptions chained to it (cause, context, an
    exception group's members) a line number, in place."""
    for current in _chained(exc):
        try:
            current.__traceback__ = _with_lines(current.__traceback__)
        except Exception:  # a repair must never replace the exception it repairs: IPython's failure at worst
            pass


def clear_own_frames(exc: BaseException) -> None:
    """Clear the locals of this package's finished frames in `exc`'s traceback (and its chained ones'):
    the step hooks' and the step requests' frames that a MemoryGuardError or a Stop passed through hold
    the hooks, and through them the session, for as long as anyone keeps the exception (pytest keeps a
    failed test's in `sys.last_traceback`). The user's frames are left as they are."""
    own = __name__.split(".")[0]
    for current in _chained(exc):
        tb = current.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if str(frame.f_globals.get("__name__", "")).split(".")[0] == own:
                try:
                    frame.clear()
                except RuntimeError:  # still running (the frame that handles it): nothing to clear
                    pass
            tb = tb.tb_next
