"""Where a script's or a test's holders live: the locals of the user's functions running the steps,
then the module's globals; and the code those functions were written in, where fix lines are found.

In a test the holder is a local of the test function or of a helper it calls (`def train():
history = []`), rarely a global; the helper's frame exists only while its steps run, so the
functions are learned at the scans during the run, not once at the start.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
import textwrap
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from ..core.package import PACKAGE_DIR
from .scan.results import Root

MAX_SOURCES = 16  # functions and files read for fix lines in one run (each once)
_CO_OPTIMIZED = 0x0001  # a function's frame, not a module's top level


@functools.lru_cache(maxsize=1)
def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    found.add(PACKAGE_DIR)  # this package
    try:
        import site

        found.add(site.getusersitepackages())  # pip install --user
    except Exception:
        pass
    return tuple(sorted(os.path.join(os.path.realpath(p), "") for p in found))


_INSTALLED_DIRS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def is_user_code(filename: str) -> bool:
    """A notebook cell or a script of the user's; not the standard library, an installed package or ours
    (installed anywhere: another environment's site-packages on PYTHONPATH, `pip --target`, the user site)."""
    if filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):
        return True  # <ipython-input-...>, <string>: typed by the user
    path = os.path.realpath(filename)
    return not path.startswith(_library_prefixes()) and not any(d in path for d in _INSTALLED_DIRS)


def _function_source(code: CodeType) -> str | None:
    try:
        return textwrap.dedent(inspect.getsource(code))
    except (OSError, TypeError, ValueError):
        return None


def _file_source(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, ValueError):
        return None


class StackSources:
    """The source of each user function (or script top level) met on the stack, innermost first, then
    the module's file: a holder's fix line is looked for in the code that fills it before anywhere
    else in its file (a test file appends to `history` in many tests)."""

    def __init__(self, sources: list[str]) -> None:
        self.sources = sources
        self._seen: set[object] = set()

    def add_code(self, code: CodeType) -> None:
        function = bool(code.co_flags & _CO_OPTIMIZED)
        key = code if function else code.co_filename  # a module's top level is its whole file
        if key in self._seen or len(self._seen) >= MAX_SOURCES:
            return
        self._seen.add(key)
        text = _function_source(code) if function else _file_source(code.co_filename)
        if text is not None:
            self.sources.append(text)

    def add_file(self, path: Any) -> None:
        if not isinstance(path, str) or path in self._seen or len(self._seen) >= MAX_SOURCES or not is_user_code(path):
            return
        self._seen.add(path)
        text = _file_source(path)
        if text is not None:
            self.sources.append(text)

    def add_stack(self, frame: FrameType | None) -> None:
        while frame is not None:
            code = frame.f_code
            if not code.co_filename.startswith("<") and is_user_code(code.co_filename):
                self.add_code(code)
            frame = frame.f_back


def _locals_of(frame: FrameType) -> list[tuple[str, Any]]:
    """A function's locals, leaving no copy behind: before Python 3.13, reading `f_locals` stores a
    snapshot dict on the frame that keeps each value alive (a tensor the code has deleted since)
    until the function returns. The snapshot is a cache, refilled at each read, so emptying it
    changes nothing else (only a `locals()` dict the function itself kept would see it emptied)."""
    snapshot = frame.f_locals
    items = list(snapshot.items())
    if type(snapshot) is dict and sys.version_info < (3, 13):
        snapshot.clear()
    return items


def frame_roots(frame: FrameType | None, sources: StackSources | None = None) -> list[Root]:
    """The locals of the user's functions on the stack from `frame` outwards, innermost first (a
    name met again further out is shadowed); `sources` learns those functions' code."""
    roots: list[Root] = []
    seen: set[str] = set()
    while frame is not None:
        code = frame.f_code
        if code.co_flags & _CO_OPTIMIZED and is_user_code(code.co_filename):
            if sources is not None and not code.co_filename.startswith("<"):
                sources.add_code(code)
            for name, value in _locals_of(frame):
                if name not in seen and not name.startswith("_"):
                    seen.add(name)
                    roots.append(Root(name, "user", name, value))
        frame = frame.f_back
    return roots


class StackRoots:
    """A session's roots: the locals of the user's functions on the calling thread's stack (innermost
    first), then the `shared` roots (module globals, a notebook's names) they do not shadow. Scans
    during the run happen at step boundaries on the training thread, where a helper's frame
    (`def train(): history = []`) is alive; the one at the end runs where the block is."""

    def __init__(self, shared: Callable[[], list[Root]], sources: StackSources | None = None) -> None:
        self._shared, self._sources = shared, sources

    def __call__(self) -> list[Root]:
        local = frame_roots(sys._getframe(1), self._sources)
        names = {root.name for root in local}
        return local + [root for root in self._shared() if root.name not in names]
