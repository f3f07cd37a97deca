"""Why did a DataLoader worker die? An explanation from the curves just before it (pure).

PyTorch reports "DataLoader worker (pid N) is killed by signal: Killed." (SIGKILL: usually the OOM
killer) or "... Bus error." (SIGBUS: /dev/shm full). The curves say which is likely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .units import format_bytes

_WORKER_DEATH = re.compile(r"DataLoader worker \(pid(?:\(s\))? ?([\d, ]+)\) (?:is killed by signal: ([\w ]+)|exited unexpectedly)")
NEAR_FULL = 0.9


@dataclass(frozen=True)
class WorkerDeath:
    pids: tuple[int, ...]
    signal: str | None  # "Killed", "Bus error", ... or None ("exited unexpectedly")


def parse_worker_death(message: str) -> WorkerDeath | None:
    match = _WORKER_DEATH.search(message)
    if match is None:
        return None
    pids = tuple(int(p) for p in re.findall(r"\d+", match.group(1)))
    signal = match.group(2).strip().rstrip(".") if match.group(2) else None
    return WorkerDeath(pids, signal)


def explain_worker_death(
    death: WorkerDeath,
    ram_bytes: float,
    ram_limit_bytes: float,
    shm_used_bytes: float | None,
    shm_total_bytes: float | None,
    limit_source: str = "system",
) -> list[str]:
    """The likely cause and the fix, from the last RAM and /dev/shm readings before the death."""
    who = f"DataLoader worker {', '.join(map(str, death.pids))} died" + (f" ({death.signal})" if death.signal else "")
    ram_share = ram_bytes / ram_limit_bytes if ram_limit_bytes else 0.0
    shm_share = shm_used_bytes / shm_total_bytes if shm_used_bytes is not None and shm_total_bytes else 0.0
    if shm_share >= NEAR_FULL or (death.signal or "").lower().startswith("bus"):
        return [
            f"{who}: /dev/shm was {shm_share:.0%} full ({format_bytes(shm_used_bytes or 0)} of {format_bytes(shm_total_bytes or 0)}) — "
            "workers pass batches through shared memory and a full /dev/shm ends in a bus error",
            "fix: give the container more shared memory (docker --shm-size=8g or --ipc=host), "
            "torch.multiprocessing.set_sharing_strategy('file_system'), or fewer workers / a lower prefetch_factor",
        ]
    if ram_share >= NEAR_FULL:
        return [
            f"{who}: the process tree used {ram_share:.0%} of the {limit_source} memory limit "
            f"({format_bytes(ram_bytes)} of {format_bytes(ram_limit_bytes)}) — the OOM killer takes the biggest process, often a worker",
            "fix: find what grows (the verdict and holders above; workers copying a Python-object dataset "
            "page by page: use numpy/torch arrays), or use fewer workers / smaller batches",
        ]
    return [
        f"{who}: neither memory nor /dev/shm was near its limit (RAM {ram_share:.0%} of the {limit_source} limit, "
        f"/dev/shm {shm_share:.0%}) — an external kill, or an OOM kill of another group; `dmesg` says which",
    ]


SHM_WARNING_SHARE = 0.8


def shm_warning(peak_bytes: float, total_bytes: float, path: str = "/dev/shm") -> str | None:
    """A warning when shared memory came close to full during the run (before it ends in a bus error)."""
    if not total_bytes or peak_bytes < SHM_WARNING_SHARE * total_bytes:
        return None
    return (
        f"{path} reached {peak_bytes / total_bytes:.0%} ({format_bytes(peak_bytes)} of {format_bytes(total_bytes)}): when it fills, "
        "DataLoader workers die with a bus error — give it more room (--shm-size / --ipc=host) or use "
        "torch.multiprocessing.set_sharing_strategy('file_system')"
    )
