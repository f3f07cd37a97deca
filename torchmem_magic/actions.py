"""Actions a user asks for: each changes state on purpose and says what it freed.

They are the fixes that suspects of kind `output-cache` and `traceback` point to.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from .notebook import _NUMBERED_OUTPUT
from .probes import HeapProbe


def _shell(shell: Any | None) -> Any:
    if shell is not None:
        return shell
    from IPython import get_ipython

    found = get_ipython()
    if found is None:
        raise RuntimeError("not running in IPython: there is no notebook cache to release")
    return found


def _heap_freed(action: Any) -> int:
    """Run `action`, collect garbage, and return how many heap bytes came back (0 if unknown)."""
    heap = HeapProbe()
    gc.collect()
    before = heap.read()
    action()
    gc.collect()
    after = heap.read()
    return 0 if before != before or after != after else int(max(0.0, before - after))


def release_output_cache(shell: Any | None = None) -> int:
    """Clear IPython's output cache completely and return the heap bytes freed.

    Like `%reset -f out`, plus what that leaves behind: the hidden `_`/`__`/`___` copies in
    `user_ns_hidden`, the displayhook's own references and the last execution result.
    User variables are never touched.
    """
    shell = _shell(shell)

    def release() -> None:
        ns, hidden = shell.user_ns, shell.user_ns_hidden
        displayhook = shell.displayhook
        if getattr(displayhook, "do_full_cache", False):
            displayhook.flush()
        for name in [n for n in list(ns) if _NUMBERED_OUTPUT.match(n)]:
            del ns[name]
        for name in ("_", "__", "___"):
            if name in hidden:
                if ns.get(name) is hidden[name]:
                    ns[name] = ""
                hidden[name] = ""
            setattr(displayhook, name, "")
        result = getattr(shell, "last_execution_result", None)
        if result is not None:
            result.result = None

    return _heap_freed(release)


def release_last_exception(shell: Any | None = None) -> int:
    """Drop every reference to the last exception and its frames; returns the heap bytes freed.

    `sys.last_*` alone is not enough: IPython keeps the traceback in `InteractiveTB.tb` and in
    the last execution result (FACTS.md).
    """
    shell = _shell(shell)

    def release() -> None:
        for attr in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, attr):
                delattr(sys, attr)
        if getattr(shell, "InteractiveTB", None) is not None:
            shell.InteractiveTB.tb = None
        result = getattr(shell, "last_execution_result", None)
        if result is not None and getattr(result, "error_in_exec", None) is not None:
            result.error_in_exec = None

    return _heap_freed(release)
