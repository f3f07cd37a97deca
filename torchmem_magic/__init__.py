"""torchmem_magic: watch PyTorch memory (RAM, heap, VRAM, /dev/shm) while a notebook cell trains.

`%load_ext torchmem_magic`, then `%%memwatch` over a training loop; `last_report()` afterwards.
Importing this package imports nothing else: each public name loads on first use, the magics on
`%load_ext`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and readers; at run time each name loads on first use
    from .session.actions import (
        collect_garbage,
        release_last_exception,
        release_notebook_caches,
        release_output_cache,
        return_heap_to_os,
        set_sharing_strategy,
        sharing_info,
    )
    from .api import memwatch
    from .finder.check import memcheck
    from .frontends.gate import LeakError, assert_no_leak
    from .tracing.guard import MemoryGuardError
    from .render.results import MemcheckResult, Report
    from .flight.crashes import clear_crashes, last_crash
    from .report.saved import load_report
    from .core.options import SessionOptions
    from .session.run import MemwatchSession, last_report

#: public name -> the module that defines it
_HOMES = {
    "collect_garbage": "session.actions",
    "release_last_exception": "session.actions",
    "release_notebook_caches": "session.actions",
    "release_output_cache": "session.actions",
    "return_heap_to_os": "session.actions",
    "set_sharing_strategy": "session.actions",
    "sharing_info": "session.actions",
    "memwatch": "api",
    "memcheck": "finder.check",
    "LeakError": "frontends.gate",
    "assert_no_leak": "frontends.gate",
    "MemoryGuardError": "tracing.guard",
    "MemcheckResult": "render.results",
    "Report": "render.results",
    "load_report": "report.saved",
    "clear_crashes": "flight.crashes",
    "last_crash": "flight.crashes",
    "MemwatchSession": "session.run",
    "SessionOptions": "core.options",
    "last_report": "session.run",
}

__all__ = [
    "LeakError",
    "MemcheckResult",
    "MemoryGuardError",
    "MemwatchSession",
    "Report",
    "SessionOptions",
    "assert_no_leak",
    "clear_crashes",
    "collect_garbage",
    "last_report",
    "load_ipython_extension",
    "last_crash",
    "load_report",
    "memcheck",
    "memwatch",
    "release_last_exception",
    "release_notebook_caches",
    "release_output_cache",
    "return_heap_to_os",
    "set_sharing_strategy",
    "sharing_info",
    "unload_ipython_extension",
]
__version__ = "0.1.0"

#: entry points that train-watch and so need torch (which the package does not install)
_NEEDS_TORCH = frozenset({"memwatch", "assert_no_leak", "MemwatchSession"})


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use, so `import torchmem_magic` (and any of its pure
    modules) imports no psutil, torch or IPython and does no work."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _NEEDS_TORCH:
        from .core.needs import torch_installed, torch_missing

        if not torch_installed():  # a stand-in that says so when called (not kept: torch may come later)
            return torch_missing(name)
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


_crash_announced = False


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext torchmem_magic`: register the magics (loading twice is harmless). Without torch
    installed: one line saying so, and no magics."""
    from .core.needs import INSTALL_TORCH, torch_installed

    if not torch_installed():
        import sys

        print(f"{INSTALL_TORCH}, then %reload_ext torchmem_magic", file=sys.stderr)
        return
    from .frontends.magics import MemwatchMagics, show_last_crash

    ipython.register_magics(MemwatchMagics)
    global _crash_announced
    if not _crash_announced:  # once per kernel: a run of this notebook whose kernel died, if any
        _crash_announced = True
        import sys

        from .frontends.late_interrupts import drop_late_interrupts

        try:
            show_last_crash(announce=True)
        except KeyboardInterrupt:  # the magics are registered by now; the record stays unshown
            print("torchmem_magic: interrupted while the record of a dead kernel's run was shown; the extension "
                  "is loaded, and %memwatch --last shows that record", file=sys.stderr)
            raise
        except Exception as exc:  # a broken record must never break loading the extension
            print(f"torchmem_magic: could not read the flight records ({type(exc).__name__}: {exc})", file=sys.stderr)
        finally:  # showing a record takes a while: a Ctrl-C that comes just after must not lose the reply
            drop_late_interrupts(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext torchmem_magic`: stop a running session and remove the magics."""
    from .session.run import active_session

    session = active_session()
    if session is not None:
        session.stop()
    manager = ipython.magics_manager
    manager.magics["cell"].pop("memwatch", None)
    manager.magics["line"].pop("memwatch", None)
    manager.magics["line"].pop("memcheck", None)
    manager.registry.pop("MemwatchMagics", None)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
