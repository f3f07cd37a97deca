"""The script API: `with memwatch() as w: train()`, the same session `%%memwatch` runs."""

from __future__ import annotations

import functools
import sys
from types import CodeType, FrameType
from typing import Any

from .agent.rank import adopt_forked
from .finder.leak_finder import LeakSearch
from .core.option_args import takes_options
from .core.options import MemwatchOptions, SessionOptions
from .finder.scan.results import Root
from .session.run import MemwatchSession
from .finder.stack_roots import StackRoots, StackSources



def _module_roots(namespace: dict[str, Any]) -> list[Root]:
    """A script's global names (not `_private` ones)."""
    return [Root(k, "user", k, v) for k, v in list(namespace.items()) if not k.startswith("_")]


def watch_from(
    namespace: dict[str, Any],
    frame: FrameType | None,
    options: MemwatchOptions,
    *,
    code: CodeType | None = None,
    log_to: object | None = None,
) -> MemwatchSession:
    """A script session whose leak finder looks where the watched code keeps things: the locals of
    the user's functions on the training thread's stack (innermost first), then the global names of
    `namespace` or, in a notebook (`namespace` is the shell's), the user's names. Fix lines are looked
    for in the function `code` (the test's), the user's code on the stack from `frame` outwards and
    the functions met at the scans, then the namespace's module.

    Holders the last scan during the run saw are kept even when the end-of-block scan cannot reach
    them, since a helper function's locals (`def train(): history = []`) are gone by then."""
    search: LeakSearch | None = None
    if options.scan:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is not None and namespace is shell.user_ns:
            from .finder.notebook import notebook_roots, recent_sources

            search = LeakSearch(StackRoots(functools.partial(notebook_roots, shell)), recent_sources(shell))
        else:
            sources: list[str] = []
            known = StackSources(sources)
            if code is not None:
                known.add_code(code)
            known.add_stack(frame)
            known.add_file(namespace.get("__file__"))
            search = LeakSearch(StackRoots(functools.partial(_module_roots, namespace), known), sources)
    listener = None
    if log_to is not None:
        from .integrations.tensorboard import ScalarLog, checked_writer

        listener = ScalarLog(checked_writer(log_to))
    settings = SessionOptions.of(options, print_report=not options.quiet, keep_scanned_holders=True)
    return MemwatchSession(settings, search=search, rank_agent=adopt_forked, listener=listener)


@takes_options
def memwatch(options: MemwatchOptions, *, log_to: object | None = None) -> MemwatchSession:
    """Script API: `with memwatch() as w: train()` then `w.report` (also `last_report()`). The options
    (`interval_ms`, `device`, `quiet`, `shm_path`, `scan`, `guard`) are those of `MemwatchOptions`.

    Prints the text report when the block ends unless `quiet`. The block's exception, if any,
    propagates after the report is made. With `scan`, the leak finder looks at the locals of the
    user's functions running the steps (the caller's and the helpers it calls) and at the calling
    module's global names, and fills `report.suspects`; in a notebook, at the same places
    `%%memwatch` looks (the user's names, the output cache, the last traceback) as well as locals.
    With `guard` (0.9, 90 or '90%'), MemoryGuardError is raised in the loop at a step boundary once
    RAM, /dev/shm or VRAM reaches that share of its limit, or would before the next chance to stop.
    With `log_to` (a `torch.utils.tensorboard.SummaryWriter`), each curve and the leak rate are written as
    `memwatch/...` scalars every second, with the step as the global step.
    """
    caller = sys._getframe(2)  # 1 is `takes_options`' front end
    return watch_from(caller.f_globals, caller, options, log_to=log_to)
