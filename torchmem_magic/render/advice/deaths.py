"""Deaths: a DataLoader worker's, the kernel's (from its flight record), and a /dev/shm near full."""

from __future__ import annotations

from collections.abc import Callable

from ...core.units import format_bytes, format_duration

def _worker_died(cause: str, pids: tuple[int, ...], signal: str | None, ram_share: float, ram_bytes: float,
                 ram_limit_bytes: float, limit_source: str, shm_path: str, shm_share: float, shm_used_bytes: float,
                 shm_total_bytes: float) -> str:
    who = f"DataLoader worker {', '.join(map(str, pids))} died" + (f" ({signal})" if signal else "")
    if cause == "shm":
        return (f"{who}: {shm_path} was {shm_share:.0%} full ({format_bytes(shm_used_bytes)} of "
                f"{format_bytes(shm_total_bytes)}) — workers pass batches through shared memory and a full /dev/shm "
                "ends in a bus error")
    if cause == "ram":
        return (f"{who}: the process tree used {ram_share:.0%} of the {limit_source} memory limit "
                f"({format_bytes(ram_bytes)} of {format_bytes(ram_limit_bytes)}) — the OOM killer takes the biggest "
                "process, often a worker")
    return (f"{who}: neither memory nor {shm_path} was near its limit (RAM {ram_share:.0%} of the {limit_source} limit, "
            f"{shm_path} {shm_share:.0%}) — an external kill, or an OOM kill of another group; `dmesg` says which")


def _worker_death_fix(cause: str) -> str:
    if cause == "shm":
        return ("fix: give the container more shared memory (docker --shm-size=8g or --ipc=host), "
                "torch.multiprocessing.set_sharing_strategy('file_system'), or fewer workers / a lower prefetch_factor")
    return ("fix: find what grows (the verdict and holders above; workers copying a Python-object dataset "
            "page by page: use numpy/torch arrays), or use fewer workers / smaller batches")


def _shm_nearly_full(path: str, peak_bytes: float, total_bytes: float) -> str:
    return (
        f"{path} reached {peak_bytes / total_bytes:.0%} ({format_bytes(peak_bytes)} of {format_bytes(total_bytes)}): "
        "when it fills, DataLoader workers die with a bus error — give it more room (--shm-size / --ipc=host) or use "
        "torch.multiprocessing.set_sharing_strategy('file_system')"
    )


def _kernel_died(terminated_by: str | None, died_at: str, ran_s: float, steps: int) -> str:
    how = "died" if terminated_by is None else f"was terminated ({terminated_by})"
    return f"the kernel {how} during this run, at about {died_at}, {format_duration(ran_s)} and {steps:,} steps in"


def _last_readings(ram_bytes: float, ram_limit_bytes: int, ram_limit_source: str, shm_bytes: float | None,
                   shm_total_bytes: int | None, vram_reserved_bytes: float | None, vram_total_bytes: int | None) -> str:
    """`shm_bytes`, `vram_reserved_bytes`: None where there is nothing to say of them."""
    readings = [f"RAM {format_bytes(ram_bytes)} of {format_bytes(ram_limit_bytes)} ({ram_limit_source})"]
    if shm_bytes is not None:
        readings.append(f"/dev/shm {format_bytes(shm_bytes)} of {format_bytes(shm_total_bytes)}")
    if vram_reserved_bytes is not None:
        readings.append(f"VRAM reserved {format_bytes(vram_reserved_bytes)} of {format_bytes(vram_total_bytes)}")
    return "last readings (at most half a second before): " + ", ".join(readings)


def _live_verdict_then(verdict: str) -> str:
    return f"the live verdict then: {verdict}"


def _at_limit(what: str, share: float, ram_limit_source: str) -> str:
    if what == "ram":
        return f"RAM was at {share:.0%} of its limit ({ram_limit_source})"
    return f"/dev/shm was {share:.0%} full" if what == "shm" else f"VRAM was {share:.0%} reserved"


def _likeliest_cause(terminated_by: str | None, kills: dict[str, int], at_limit: tuple[tuple[str, float], ...],
                     ram_limit_source: str) -> str:
    """A signal from outside, the OOM killer (its counters went up, or RAM was at its limit), the limit a
    resource was at, or, said plainly, unknown."""
    limits = [_at_limit(what, share, ram_limit_source) for what, share in at_limit]
    if terminated_by is not None:
        return (f"{terminated_by} ended it from outside (a shutdown or restart of the kernel, a job scheduler's stop, "
                "a kill command): not the lack of a resource" + (f", although {'; '.join(limits)}" if limits else ""))
    if kills:
        where = ", ".join(f"{n} in {'the system' if k == 'system' else k.removeprefix('cgroup:')}" for k, n in kills.items())
        cause = f"the OOM killer killed processes since the run began ({where}): most likely this kernel"
        return cause + (f"; {'; '.join(limits)}" if limits else "")
    if any(what == "ram" for what, _ in at_limit):
        return f"{limits[0]}: most likely the OOM killer"
    if limits:
        return f"{'; '.join(limits)}: what killed it cannot be known from the record, that limit is the likeliest"
    return ("what killed it cannot be known from the record: no watched resource was near its limit (a kill from "
            "outside, a crash in native code, or a kernel restarted while it ran)")


#: the wording of each note, by its key
WORDS: dict[str, Callable[..., str]] = {
    "worker died": _worker_died,
    "worker death fix": _worker_death_fix,
    "shm nearly full": _shm_nearly_full,
    "kernel died": _kernel_died,
    "last readings": _last_readings,
    "live verdict then": _live_verdict_then,
    "likeliest cause": _likeliest_cause,
}
