"""torchmem_magic: watch PyTorch memory (RAM, heap, VRAM, /dev/shm) while a notebook cell trains.

`%load_ext torchmem_magic`, then `%%memwatch` over a training loop; `last_report()` afterwards.
Importing this package imports neither torch nor IPython; the magics load on `%load_ext`.
"""

from __future__ import annotations

from typing import Any

from .actions import (
    collect_garbage,
    release_last_exception,
    release_notebook_caches,
    release_output_cache,
    return_heap_to_os,
    set_sharing_strategy,
    sharing_info,
)
from .check import memcheck
from .api import memwatch
from .results import MemcheckResult, Report
from .session import MemwatchSession, last_report

__all__ = [
    "MemcheckResult",
    "MemwatchSession",
    "Report",
    "collect_garbage",
    "last_report",
    "load_ipython_extension",
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


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext torchmem_magic`: register the magics (loading twice is harmless)."""
    from .magics import MemwatchMagics

    ipython.register_magics(MemwatchMagics)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext torchmem_magic`: stop a running session and remove the magics."""
    from .session import active_session

    session = active_session()
    if session is not None:
        session.stop()
    manager = ipython.magics_manager
    manager.magics["cell"].pop("memwatch", None)
    manager.magics["line"].pop("memcheck", None)
    manager.registry.pop("MemwatchMagics", None)
