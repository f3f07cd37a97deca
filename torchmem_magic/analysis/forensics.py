"""Why did a DataLoader worker die? An explanation from how it ended and the curves just before (pure).

The process probe reads each worker's exit status: SIGKILL is usually the OOM killer, SIGBUS a full
/dev/shm. That is what decides, not the text of whatever exception the training loop happened to
see (torch's "DataLoader worker (pid N) is killed by signal: Killed.", or only a reset connection
when the machine is busy). The curves say which limit was near.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from ..core.options import DEFAULT_SHM_PATH
from ..core.units import format_bytes, format_duration

_WORKER_DEATH = re.compile(r"DataLoader worker \(pid(?:\(s\))? ?([\d, ]+)\) (?:is killed by signal: ([\w ]+)|exited unexpectedly)")
NEAR_FULL = 0.9


@dataclass(frozen=True)
class WorkerExit:
    """How one DataLoader worker process ended: by a signal, or with an exit code."""

    pid: int
    signal_number: int | None  # SIGKILL (the OOM killer), SIGBUS (/dev/shm full), ...
    exit_code: int | None  # when it exited on its own; 0 is a normal end of epoch

    @property
    def abnormal(self) -> bool:
        return self.signal_number is not None or bool(self.exit_code)

    @property
    def signal_name(self) -> str | None:
        """'Killed', 'Bus error': the words torch's own message uses."""
        if self.signal_number is None:
            return None
        try:
            return signal.strsignal(self.signal_number) or f"signal {self.signal_number}"
        except ValueError:
            return f"signal {self.signal_number}"


@dataclass(frozen=True)
class WorkerDeath:
    pids: tuple[int, ...]
    signal: str | None  # "Killed", "Bus error", ... or None ("exited unexpectedly")


def death_from_exits(exits: Iterable[WorkerExit]) -> WorkerDeath | None:
    """The death that explains a failed run, from the workers' exit statuses.

    A signal other than SIGTERM comes first: SIGTERM is also how torch stops the remaining workers
    once one has died. A non-zero exit code (an exception inside the worker) comes last.
    """
    abnormal = [e for e in exits if e.abnormal]
    if not abnormal:
        return None
    rank = {signal.SIGTERM.value: 1, None: 2}
    cause = min(abnormal, key=lambda e: rank.get(e.signal_number, 0))
    same = [e.pid for e in abnormal if (e.signal_number, e.exit_code) == (cause.signal_number, cause.exit_code)]
    return WorkerDeath(tuple(sorted(same)), cause.signal_name)


def parse_worker_death(message: str) -> WorkerDeath | None:
    """torch's message for a dead worker, as raised into whatever code runs when SIGCHLD arrives."""
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
    shm_path: str = DEFAULT_SHM_PATH,
) -> list[str]:
    """The likely cause and the fix, from the last RAM and /dev/shm readings before the death."""
    who = f"DataLoader worker {', '.join(map(str, death.pids))} died" + (f" ({death.signal})" if death.signal else "")
    ram_share = ram_bytes / ram_limit_bytes if ram_limit_bytes else 0.0
    shm_share = shm_used_bytes / shm_total_bytes if shm_used_bytes is not None and shm_total_bytes else 0.0
    if shm_share >= NEAR_FULL or (death.signal or "").lower().startswith("bus"):
        return [
            f"{who}: {shm_path} was {shm_share:.0%} full ({format_bytes(shm_used_bytes or 0)} of {format_bytes(shm_total_bytes or 0)}) — "
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
        f"{who}: neither memory nor {shm_path} was near its limit (RAM {ram_share:.0%} of the {limit_source} limit, "
        f"{shm_path} {shm_share:.0%}) — an external kill, or an OOM kill of another group; `dmesg` says which",
    ]


SHM_WARNING_SHARE = 0.8


def shm_warning(peak_bytes: float, total_bytes: float, path: str = DEFAULT_SHM_PATH) -> str | None:
    """A warning when shared memory came close to full during the run (before it ends in a bus error)."""
    if not total_bytes or peak_bytes < SHM_WARNING_SHARE * total_bytes:
        return None
    return (
        f"{path} reached {peak_bytes / total_bytes:.0%} ({format_bytes(peak_bytes)} of {format_bytes(total_bytes)}): when it fills, "
        "DataLoader workers die with a bus error — give it more room (--shm-size / --ipc=host) or use "
        "torch.multiprocessing.set_sharing_strategy('file_system')"
    )


def _share(used: float, total: float | None) -> float | None:
    if total is None or total <= 0 or used != used:  # NaN: no reading
        return None
    return used / total


def _likeliest_cause(terminated_by: str | None, kills: dict[str, int], at_limit: list[str], ram_full: bool) -> str:
    """What most likely ended a process that died during a run: a signal from outside, the OOM killer (its
    counters went up, or RAM was at its limit), the limit a resource was at, or, said plainly, unknown."""
    if terminated_by is not None:
        return (f"{terminated_by} ended it from outside (a shutdown or restart of the kernel, a job scheduler's stop, "
                "a kill command): not the lack of a resource" + (f", although {'; '.join(at_limit)}" if at_limit else ""))
    if kills:
        where = ", ".join(f"{n} in {'the system' if k == 'system' else k.removeprefix('cgroup:')}" for k, n in kills.items())
        cause = f"the OOM killer killed processes since the run began ({where}): most likely this kernel"
        return cause + (f"; {'; '.join(at_limit)}" if at_limit else "")
    if ram_full:
        return f"{at_limit[0]}: most likely the OOM killer"
    if at_limit:
        return f"{'; '.join(at_limit)}: what killed it cannot be known from the record, that limit is the likeliest"
    return ("what killed it cannot be known from the record: no watched resource was near its limit (a kill from "
            "outside, a crash in native code, or a kernel restarted while it ran)")


def death_explanation(
    *,
    died_at: str,
    ran_s: float,
    steps: int,
    ram_bytes: float,
    ram_limit_bytes: int,
    ram_limit_source: str,
    shm_bytes: float,
    shm_total_bytes: int | None,
    vram_reserved_bytes: float,
    vram_total_bytes: int | None,
    oom_kills_before: dict[str, int],
    oom_kills_now: dict[str, int],
    last_verdict: str | None,
    terminated_by: str | None = None,
) -> list[str]:
    """How a process that died during a watched run died, as far as its record can tell: when, its last
    readings against their limits, and the likeliest cause, said plainly when it cannot be known.

    `oom_kills_*` are the kernel's OOM-kill counters (the system's, each cgroup's) when the run began
    and now: one that went up counts kills since then, this process's most likely among them.
    `terminated_by`: the signal that terminated it, when its record says so (the cause is known then)."""
    how = "died" if terminated_by is None else f"was terminated ({terminated_by})"
    lines = [f"the kernel {how} during this run, at about {died_at}, {format_duration(ran_s)} and {steps:,} steps in"]
    readings = [f"RAM {format_bytes(ram_bytes)} of {format_bytes(ram_limit_bytes)} ({ram_limit_source})"]
    ram_share = _share(ram_bytes, ram_limit_bytes)
    shm_share = _share(shm_bytes, shm_total_bytes)
    vram_share = _share(vram_reserved_bytes, vram_total_bytes)
    if shm_share is not None and shm_bytes > 0:
        readings.append(f"/dev/shm {format_bytes(shm_bytes)} of {format_bytes(shm_total_bytes)}")
    if vram_share is not None and vram_reserved_bytes > 0:
        readings.append(f"VRAM reserved {format_bytes(vram_reserved_bytes)} of {format_bytes(vram_total_bytes)}")
    lines.append("last readings (at most half a second before): " + ", ".join(readings))
    if last_verdict:
        lines.append(f"the live verdict then: {last_verdict}")
    kills = {k: oom_kills_now[k] - v for k, v in oom_kills_before.items() if k in oom_kills_now and oom_kills_now[k] > v}
    at_limit = []
    if ram_share is not None and ram_share >= NEAR_FULL:
        at_limit.append(f"RAM was at {ram_share:.0%} of its limit ({ram_limit_source})")
    if shm_share is not None and shm_share >= NEAR_FULL:
        at_limit.append(f"/dev/shm was {shm_share:.0%} full")
    if vram_share is not None and vram_share >= NEAR_FULL:
        at_limit.append(f"VRAM was {vram_share:.0%} reserved")
    ram_full = ram_share is not None and ram_share >= NEAR_FULL
    lines.append(_likeliest_cause(terminated_by, kills, at_limit, ram_full))
    return lines
