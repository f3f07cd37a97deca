"""An exception a signal handler raised on an instruction with no line number, given tracebacks IPython can
show: a real SIGINT into a loop whose jump back has no line (Python 3.11), formatted by IPython's own
formatter, as a file on disk and as a notebook cell known only to linecache."""

from __future__ import annotations

import dis
import gc
import linecache
import os
import re
import signal
import threading
import types
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchmem_magic.session.tracebacks import give_lines, line_standing_for

#: line 2 is the loop's header; its jump back (after the `if`) has no line number on Python 3.11. It ends
#: by itself after some seconds: a SIGINT that never comes fails the test instead of hanging it
LOOP = "x = 0\nfor step in range(10**8):\n    if step < 0:\n        x += 1\n"


def _lineless_jumps(code: types.CodeType) -> list[dis.Instruction]:
    return [i for i in dis.get_instructions(code) if i.opcode in dis.hasjrel and getattr(i.positions, "lineno", 0) is None]


def _entries(tb: types.TracebackType | None) -> Iterator[types.TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _interrupted(code: types.CodeType, namespace: dict[str, object] | None = None) -> KeyboardInterrupt:
    """Run `code` until a SIGINT from another thread (as a Ctrl-C comes) stops it, under Python's own
    handler (installed again: a SIGINT once failed to stop the loop after the kernel tests, beside a CPU
    burner)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        exec(code, {} if namespace is None else namespace)
    except KeyboardInterrupt as interrupt:
        return interrupt
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    raise AssertionError("the loop ended by itself")


@pytest.fixture(params=["file", "cell"])
def loop_code(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[types.CodeType]:
    """The loop compiled from a file on disk, or from a name only linecache knows (as a notebook's cell,
    whose frames IPython 9 formats from the frame alone)."""
    if request.param == "file":
        path = tmp_path / "train.py"
        path.write_text(LOOP)
        filename = str(path)
    else:
        filename = str(tmp_path / "cell.py")  # as ipykernel names a cell: a .py path never written
        linecache.cache[filename] = (len(LOOP), None, LOOP.splitlines(keepends=True), filename)
    code = compile(LOOP, filename, "exec")
    if not _lineless_jumps(code):
        pytest.skip("this Python gives the loop's jump back a line number: nothing to mend")
    yield code
    linecache.cache.pop(filename, None)


def _formatted(exc: BaseException) -> str:
    from IPython.core.ultratb import AutoFormattedTB

    formatted = AutoFormattedTB(mode="Context").structured_traceback(type(exc), exc, exc.__traceback__)
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(formatted))


def test_an_interrupt_on_a_lineless_jump_gets_the_loops_line_and_ipython_formats_it(loop_code: types.CodeType) -> None:
    interrupt = _interrupted(loop_code)
    innermost = list(_entries(interrupt.__traceback__))[-1]
    assert innermost.tb_lineno is None  # where a Ctrl-C of this loop lands
    give_lines(interrupt)
    entries = list(_entries(interrupt.__traceback__))
    assert all(isinstance(e.tb_lineno, int) and isinstance(e.tb_frame.f_lineno, int) for e in entries)
    assert entries[-1].tb_lineno == entries[-1].tb_frame.f_lineno == 2  # the loop's header, in the same file
    assert entries[-1].tb_frame.f_code.co_filename == loop_code.co_filename
    assert entries[-1].tb_frame.f_code.co_name == "<module>"
    text = _formatted(interrupt)
    assert re.search(r"-+> 2 +for step in range\(10\*\*8\)", text) and "KeyboardInterrupt" in text, text


def test_the_stand_in_keeps_none_of_the_frames_variables(loop_code: types.CodeType) -> None:
    interrupt = _interrupted(loop_code)
    give_lines(interrupt)
    innermost = list(_entries(interrupt.__traceback__))[-1]
    assert "step" not in innermost.tb_frame.f_globals and "x" not in innermost.tb_frame.f_globals


def test_the_interrupted_frames_variables_are_let_go(tmp_path: Path) -> None:
    """The stand-in replaces the frame in the traceback (IPython keeps it as sys.last_traceback until the
    next error): what the interrupted function held is freed, and its line shows with its own source."""

    class Batch:
        pass

    source = "def train(batch, held):\n    held.append(ref(batch))\n" + "".join(f"    {line}\n" for line in LOOP.splitlines())
    path = tmp_path / "train.py"
    path.write_text(source + "train(Batch(), held)\n")
    namespace: dict[str, object] = {"ref": weakref.ref, "Batch": Batch, "held": []}
    code = compile(path.read_text(), str(path), "exec")
    train_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    if not _lineless_jumps(train_code):
        pytest.skip("this Python gives the loop's jump back a line number: nothing to mend")
    interrupt = _interrupted(code, namespace)
    held = namespace["held"]
    assert isinstance(held, list) and held[0]() is not None  # the interrupted frame holds it
    give_lines(interrupt)
    gc.collect()
    assert held[0]() is None and list(_entries(interrupt.__traceback__))[-1].tb_frame.f_code.co_name == "train"
    text = _formatted(interrupt)
    assert re.search(r"-+> 4 +for step in range\(10\*\*8\)", text) and "train" in text, text  # the loop's header


def test_chained_exceptions_are_mended_and_lined_tracebacks_left_as_they_are(loop_code: types.CodeType) -> None:
    interrupt = _interrupted(loop_code)
    try:
        raise RuntimeError("raised while the interrupt was handled") from interrupt
    except RuntimeError as later:
        chained = later
    entries_before = list(_entries(chained.__traceback__))
    give_lines(chained)
    assert list(_entries(chained.__traceback__)) == entries_before  # same objects: nothing lacked a line
    assert all(isinstance(e.tb_lineno, int) for e in _entries(interrupt.__traceback__))
    assert "for step in range(10**8)" in _formatted(chained)


def test_a_jump_stands_for_its_targets_line_and_another_instruction_for_the_line_before() -> None:
    code = compile(LOOP, "<loop>", "exec")
    jumps = _lineless_jumps(code)
    if not jumps:
        pytest.skip("this Python gives the loop's jump back a line number")
    assert line_standing_for(code, jumps[0].offset) == 2
    lines = {i.offset: i.positions.lineno for i in dis.get_instructions(code)}  # type: ignore[union-attr]
    last_lined = max(offset for offset, line in lines.items() if line is not None and offset < jumps[0].offset)
    not_a_jump = next(i for i in dis.get_instructions(code) if i.offset == last_lined)
    assert line_standing_for(code, not_a_jump.offset) == lines[last_lined] == 4
