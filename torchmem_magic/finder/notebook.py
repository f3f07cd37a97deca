"""Where an IPython shell keeps references: the user's names and the caches users do not see.

Duck-typed on the shell object (no IPython import), so it is tested with a real kernel and a
real InteractiveShell alike. Each place becomes a scan Root: the user's names; the output cache
(`Out`, `_N`, `_`/`__`/`___` in the namespace and their copies in `user_ns_hidden`, the
displayhook's own `_`/`__`/`___`, the last execution result); the last exception (`sys.last_*`,
IPython's copy of the traceback, the last execution result's error).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from .scan.results import Root

OUTPUT_CACHE = "Out"
LAST_EXCEPTION = "sys.last_traceback"
_NUMBERED_OUTPUT = re.compile(r"_\d+$")


def is_numbered_output(name: str) -> bool:
    """`_5`: IPython's name for the output of cell 5 (one more reference to it, besides `Out[5]`)."""
    return _NUMBERED_OUTPUT.match(name) is not None


def user_roots(shell: Any) -> list[Root]:
    """What `%who_ls` lists: names not starting with `_` whose value is not IPython's own."""
    hidden = shell.user_ns_hidden
    roots = []
    for name, value in list(shell.user_ns.items()):
        if name.startswith("_") or (name in hidden and hidden[name] is value):
            continue
        roots.append(Root(name, "user", name, value))
    return roots


def output_cache_roots(shell: Any) -> list[Root]:
    """The output cache: Out/_oh, _N, _, __, ___ (also their copies in user_ns_hidden), the
    displayhook's own _/__/___ and the last execution result."""
    ns, hidden = shell.user_ns, shell.user_ns_hidden
    roots = []
    out = ns.get("_oh", ns.get("Out"))
    if isinstance(out, dict):
        roots.append(Root(OUTPUT_CACHE, "output-cache", "Out", out))
    for name in [n for n in list(ns) if is_numbered_output(n)]:
        roots.append(Root(OUTPUT_CACHE, "output-cache", name, ns[name]))
    for name in ("_", "__", "___"):
        if name in ns:
            roots.append(Root(OUTPUT_CACHE, "output-cache", name, ns[name]))
        if name in hidden:
            roots.append(Root(OUTPUT_CACHE, "output-cache", f"get_ipython().user_ns_hidden[{name!r}]", hidden[name]))
    displayhook = getattr(shell, "displayhook", None)
    for attr in ("_", "__", "___"):
        value = getattr(displayhook, attr, None)
        if value is not None:
            roots.append(Root(OUTPUT_CACHE, "output-cache", f"get_ipython().displayhook.{attr}", value))
    result = getattr(getattr(shell, "last_execution_result", None), "result", None)
    if result is not None:
        roots.append(Root(OUTPUT_CACHE, "output-cache", "get_ipython().last_execution_result.result", result))
    return roots


def exception_roots(shell: Any) -> list[Root]:
    """The last exception and its frames: sys.last_*, IPython's traceback copy, the last result."""
    roots = []
    for attr in ("last_value", "last_traceback", "last_exc"):
        value = getattr(sys, attr, None)
        if value is not None:
            roots.append(Root(LAST_EXCEPTION, "traceback", f"sys.{attr}", value))
    tb = getattr(getattr(shell, "InteractiveTB", None), "tb", None)
    if tb is not None:
        roots.append(Root(LAST_EXCEPTION, "traceback", "get_ipython().InteractiveTB.tb", tb))
    error = getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None)
    if error is not None:
        roots.append(Root(LAST_EXCEPTION, "traceback", "get_ipython().last_execution_result.error_in_exec", error))
    return roots


def notebook_roots(shell: Any) -> list[Root]:
    """All roots, the user's own names first (they are the real holders when both hold a tensor)."""
    return user_roots(shell) + output_cache_roots(shell) + exception_roots(shell)


def recent_sources(shell: Any, cells: int = 20) -> list[str]:
    """The last cells' source as typed, newest first (where a fix's line is looked for).

    The raw history, not `In`: in `In` a cell magic's body is a string inside `run_cell_magic(...)`.
    """
    manager = getattr(shell, "history_manager", None)
    history = getattr(manager, "input_hist_raw", None) or shell.user_ns.get("In") or []
    return [cell for cell in reversed(history[-cells:]) if isinstance(cell, str)]
