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
from .findings import Note, note

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
) -> list[Note]:
    """The likely cause and the fix, from the last RAM and /dev/shm readings before the death: a full
    /dev/shm (or a bus error), a process tree at its memory limit, or neither."""
    ram_share = ram_bytes / ram_limit_bytes if ram_limit_bytes else 0.0
    shm_share = shm_used_bytes / shm_total_bytes if shm_used_bytes is not None and shm_total_bytes else 0.0
    if shm_share >= NEAR_FULL or (death.signal or "").lower().startswith("bus"):
        cause = "shm"
    else:
        cause = "ram" if ram_share >= NEAR_FULL else "neither"
    said = note("worker died", cause=cause, pids=death.pids, signal=death.signal, ram_share=ram_share,
                ram_bytes=ram_bytes, ram_limit_bytes=ram_limit_bytes, limit_source=limit_source, shm_path=shm_path,
                shm_share=shm_share, shm_used_bytes=shm_used_bytes or 0, shm_total_bytes=shm_total_bytes or 0)
    return [said] if cause == "neither" else [said, note("worker death fix", cause=cause)]


SHM_WARNING_SHARE = 0.8


def shm_warning(peak_bytes: float, total_bytes: float, path: str = DEFAULT_SHM_PATH) -> Note | None:
    """A warning when shared memory came close to full during the run (before it ends in a bus error)."""
    if not total_bytes or peak_bytes < SHM_WARNING_SHARE * total_bytes:
        return None
    return note("shm nearly full", path=path, peak_bytes=peak_bytes, total_bytes=total_bytes)


def _share(used: float, total: float | None) -> float | None:
    if total is None or total <= 0 or used != used:  # NaN: no reading
        return None
    return used / total


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
) -> list[Note]:
    """How a process that died during a watched run died, as far as its record can tell: when, its last
    readings against their limits, and the likeliest cause, said plainly when it cannot be known.

    `oom_kills_*` are the kernel's OOM-kill counters (the system's, each cgroup's) when the run began
    and now: one that went up counts kills since then, this process's most likely among them.
    `terminated_by`: the signal that terminated it, when its record says so (the cause is known then)."""
    ram_share = _share(ram_bytes, ram_limit_bytes)
    shm_share = _share(shm_bytes, shm_total_bytes)
    vram_share = _share(vram_reserved_bytes, vram_total_bytes)
    notes = [
        note("kernel died", terminated_by=terminated_by, died_at=died_at, ran_s=ran_s, steps=steps),
        note("last readings", ram_bytes=ram_bytes, ram_limit_bytes=ram_limit_bytes, ram_limit_source=ram_limit_source,
             shm_bytes=shm_bytes if shm_share is not None and shm_bytes > 0 else None, shm_total_bytes=shm_total_bytes,
             vram_reserved_bytes=vram_reserved_bytes if vram_share is not None and vram_reserved_bytes > 0 else None,
             vram_total_bytes=vram_total_bytes),
    ]
    if last_verdict:
        notes.append(note("live verdict then", verdict=last_verdict))
    kills = {k: oom_kills_now[k] - v for k, v in oom_kills_before.items() if k in oom_kills_now and oom_kills_now[k] > v}
    at_limit = tuple(
        (what, share) for what, share in (("ram", ram_share), ("shm", shm_share), ("vram", vram_share))
        if share is not None and share >= NEAR_FULL
    )
    notes.append(note("likeliest cause", terminated_by=terminated_by, kills=kills, at_limit=at_limit,
                      ram_limit_source=ram_limit_source))
    return notes
