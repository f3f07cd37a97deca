"""Actions a user asks for: each changes state on purpose and says what it freed.

They are the fixes that suspects of kind `output-cache` and `traceback` point to, and what the
buttons under the live figure run.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from ..core.options import DEFAULT_SHM_PATH
from ..core.resources import VRAM, VRAM_RESERVED
from ..finder.notebook import is_numbered_output
from ..probes.accelerator import AcceleratorProbe
from ..probes.heap import HeapProbe
from ..probes.limits import sharing_strategy
from ..probes.shm import ShmProbe
from ..core.units import format_bytes


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
    before = heap.heap_bytes()
    action()
    gc.collect()
    after = heap.heap_bytes()
    return 0 if before != before or after != after else int(max(0.0, before - after))


def release_output_cache(shell: Any | None = None) -> int:
    """Clear IPython's output cache completely and return the heap bytes freed.

    Like `%reset -f out`, plus what that leaves behind: the hidden `_`/`__`/`___` (and, in some IPython
    versions, `_N`) copies in `user_ns_hidden`, the displayhook's own references and the last execution result.
    User variables are never touched.
    """
    shell = _shell(shell)

    def release() -> None:
        ns, hidden = shell.user_ns, shell.user_ns_hidden
        displayhook = shell.displayhook
        if getattr(displayhook, "do_full_cache", False):
            displayhook.flush()
        for names in (ns, hidden):  # some IPython versions (8.0) also keep a hidden copy of each `_N`
            for name in [n for n in list(names) if is_numbered_output(n)]:
                del names[name]
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

    `sys.last_*` alone is not enough: IPython also keeps the traceback in `InteractiveTB.tb`, and the
    exception in the last execution result's `error_in_exec`. Outside IPython (a script, the interactive
    interpreter) only `sys.last_*` holds it.
    """
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None

    def release() -> None:
        for attr in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, attr):
                delattr(sys, attr)
        if shell is None:
            return
        if getattr(shell, "InteractiveTB", None) is not None:
            shell.InteractiveTB.tb = None
        result = getattr(shell, "last_execution_result", None)
        if result is not None and getattr(result, "error_in_exec", None) is not None:
            result.error_in_exec = None

    return _heap_freed(release)


# ----------------------------------------------------------------------------- memory actions


@dataclass(frozen=True)
class ActionResult:
    """What an action did: memory before and after (bytes; None where not measured)."""

    action: str
    heap_before: int | None
    heap_after: int | None
    rss_before: int
    rss_after: int
    cuda_allocated_before: int | None = None
    cuda_allocated_after: int | None = None
    cuda_reserved_before: int | None = None
    cuda_reserved_after: int | None = None
    note: str = ""

    @property
    def heap_freed(self) -> int:
        if self.heap_before is None or self.heap_after is None:
            return 0
        return max(0, self.heap_before - self.heap_after)

    def __str__(self) -> str:
        parts = [f"{self.action}: RSS {format_bytes(self.rss_before)} → {format_bytes(self.rss_after)}"]
        if self.heap_before is not None and self.heap_after is not None:
            parts.append(f"heap {format_bytes(self.heap_before)} → {format_bytes(self.heap_after)}")
        if self.cuda_reserved_before is not None:
            parts.append(
                f"VRAM allocated {format_bytes(self.cuda_allocated_before)} → {format_bytes(self.cuda_allocated_after)}, "
                f"reserved {format_bytes(self.cuda_reserved_before)} → {format_bytes(self.cuda_reserved_after)}"
            )
        return " · ".join(parts) + (f" — {self.note}" if self.note else "")


def _snapshot(accelerator: AcceleratorProbe) -> tuple[int | None, int, int | None, int | None]:
    heap = HeapProbe().heap_bytes()
    vram = accelerator.read()
    allocated, reserved = vram[VRAM.column], vram[VRAM_RESERVED.column]
    return (
        None if heap != heap else int(heap),
        psutil.Process().memory_info().rss,
        None if allocated != allocated else int(allocated),
        None if reserved != reserved else int(reserved),
    )


def _measured(name: str, action: Callable[[], str], accelerator: AcceleratorProbe | None = None) -> ActionResult:
    """`action`, with what RAM, the heap and the accelerator in use held before and after it."""
    probe = accelerator or AcceleratorProbe()
    heap0, rss0, alloc0, res0 = _snapshot(probe)
    note = action()
    heap1, rss1, alloc1, res1 = _snapshot(probe)
    if res0 is not None and res1 is None:  # the accelerator stays initialised: no device holds memory any more
        alloc1 = res1 = 0
    return ActionResult(name, heap0, heap1, rss0, rss1, alloc0, alloc1, res0, res1, note)


def collect_garbage(accelerator: AcceleratorProbe | None = None) -> ActionResult:
    """`gc.collect()`, then the empty_cache() of the accelerator in use (CUDA, MPS, ...) when the user's
    code has initialised one (`accelerator`: the probe to ask, every device by default)."""

    probe = accelerator or AcceleratorProbe()

    def run() -> str:
        found = gc.collect()
        probe.empty_cache()
        return f"{found} unreachable objects collected"

    return _measured("gc + empty_cache", run, probe)


def return_heap_to_os() -> ActionResult:
    """glibc `malloc_trim(0)`: give freed heap pages back, so RSS drops to what is really in use."""

    def run() -> str:
        try:
            trimmed = ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            return "malloc_trim is not available here (not glibc)"
        return "pages returned" if trimmed else "nothing to return"

    return _measured("return heap to OS", run)


def release_notebook_caches(shell: Any | None = None) -> ActionResult:
    """The output cache and the last exception's references (never user variables)."""
    shell = _shell(shell)

    def run() -> str:
        out = release_output_cache(shell)
        exc = release_last_exception(shell)
        return f"output cache {out:,} B, last exception {exc:,} B freed"

    return _measured("release notebook caches", run)


# ----------------------------------------------------------------------------- sharing strategy


@dataclass(frozen=True)
class SharingInfo:
    """How DataLoader workers hand tensors to the main process, and what limits that."""

    strategy: str | None
    strategies: tuple[str, ...]
    shm_total_bytes: int | None
    shm_free_bytes: int | None
    open_files: int | None
    open_files_limit: int | None
    recommendation: str | None

    def __str__(self) -> str:
        shm = "no /dev/shm" if self.shm_total_bytes is None else (
            f"/dev/shm {format_bytes(self.shm_free_bytes)} free of {format_bytes(self.shm_total_bytes)}"
        )
        files = f"{self.open_files} of {self.open_files_limit} file descriptors open"
        text = f"sharing strategy {self.strategy} · {shm} · {files}"
        return text + (f" — {self.recommendation}" if self.recommendation else "")


SMALL_SHM_BYTES = 256 * (1 << 20)


def sharing_info(workers: int = 0, shm_path: str = DEFAULT_SHM_PATH) -> SharingInfo:
    """The current strategy, /dev/shm space, the open-file limit, and a recommendation with its reason."""
    import resource

    torch = sys.modules.get("torch")
    strategy = sharing_strategy()
    strategies = tuple(sorted(torch.multiprocessing.get_all_sharing_strategies())) if torch is not None else ()
    shm = ShmProbe(shm_path).usage()
    try:
        open_files: int | None = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_files = None
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit_value = None if limit == resource.RLIM_INFINITY else int(limit)
    advice = None
    if shm is not None and shm.total_bytes < SMALL_SHM_BYTES and workers > 0 and strategy == "file_descriptor":
        advice = (
            f"/dev/shm is only {shm.total_bytes >> 20} MiB (a container default): workers' batches may not fit — "
            "switch to file_system, or give the container more (--shm-size=8g or --ipc=host)"
        )
    elif open_files is not None and limit_value and strategy == "file_descriptor" and open_files > 0.8 * limit_value:
        advice = (
            f"{open_files} of {limit_value} file descriptors are open: file_descriptor sharing may fail "
            "('received 0 items of ancdata') — switch to file_system or raise the limit (ulimit -n)"
        )
    return SharingInfo(
        strategy, strategies, None if shm is None else shm.total_bytes,
        None if shm is None else shm.total_bytes - shm.used_bytes, open_files, limit_value, advice,
    )


def set_sharing_strategy(strategy: str) -> SharingInfo:
    """Switch torch.multiprocessing's sharing strategy; applies to DataLoaders created afterwards."""
    import torch.multiprocessing

    allowed = torch.multiprocessing.get_all_sharing_strategies()
    if strategy not in allowed:
        raise ValueError(f"sharing strategy must be one of {sorted(allowed)}, got {strategy!r}")
    torch.multiprocessing.set_sharing_strategy(strategy)
    return sharing_info()
