"""The script API: `with memwatch() as w: train()`, the same session `%%memwatch` runs."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from .ranks.agent import adopt_forked
from .scan.results import Root
from .session import DEFAULT_INTERVAL_MS, MemwatchSession


def _module_roots(namespace: dict[str, Any]) -> list[Root]:
    """A script's global names (not `_private` ones)."""
    return [Root(k, "user", k, v) for k, v in list(namespace.items()) if not k.startswith("_")]


def memwatch(
    interval_ms: float = DEFAULT_INTERVAL_MS,
    *,
    device: str | int | None = None,
    quiet: bool = False,
    shm_path: str = "/dev/shm",
    scan: bool = True,
) -> MemwatchSession:
    """Script API: `with memwatch() as w: train()` then `w.report` (also `last_report()`).

    Prints the text report when the block ends unless `quiet`. The block's exception, if any,
    propagates after the report is made. With `scan`, the leak finder looks at the calling
    module's global names (at start and end) and fills `report.suspects`; in a notebook, at the
    same places `%%memwatch` looks (the user's names, the output cache, the last traceback).
    """
    roots: Callable[[], list[Root]] | None = None
    sources: list[str] = []
    if scan:
        namespace = sys._getframe(1).f_globals
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is not None and namespace is shell.user_ns:
            from .notebook import notebook_roots, recent_sources

            sources = recent_sources(shell)
            roots = functools.partial(notebook_roots, shell)
        else:
            roots = functools.partial(_module_roots, namespace)
    return MemwatchSession(
        interval_ms, device=device, shm_path=shm_path, print_report=not quiet, roots=roots, sources=sources,
        rank_agent=adopt_forked,
    )
