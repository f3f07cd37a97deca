"""What a run gathered, as plain data: the input of the report's assembly (stdlib only).

The session gathers (probes, hooks, scans) and hands these over; assembling a report from them is
pure, so it is tested on synthetic evidence in milliseconds, without a running session.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.forensics import WorkerExit
from ..analysis.holders import HolderSearch
from ..analysis.phases import PhasePass
from ..core.ended import Ended
from ..core.model import Clock, DeviceMemory, RankSummary, SourceErrors, Suspect
from ..core.timeline import Timeline


@dataclass(frozen=True)
class ShmEvidence:
    """The shared-memory filesystem at the end of the run."""

    path: str
    total_bytes: int
    strategy: str | None  # torch.multiprocessing's sharing strategy
    torch_segments: int


@dataclass(frozen=True)
class WorkerEvidence:
    """DataLoader workers seen during the run."""

    max_count: int
    pids_seen: int
    peaks: tuple[tuple[int, int, int], ...]  # (pid, PSS peak, USS peak)


@dataclass(frozen=True)
class RunEvidence:
    """Everything a run gathered, as plain data: the input of `assemble_report`."""

    timeline: Timeline = field(metadata={"key": None})  # streamed apart, row by row, as it is made
    steps: int  # steps of `clock`
    wall_s: float
    interval_s: float
    ram_limit_bytes: int  # what the OOM killer enforces
    ram_limit_source: str  # "cgroup v2", "cgroup v1" or "system"
    heap_available: bool
    shm: ShmEvidence | None = None
    workers: WorkerEvidence | None = None
    worker_exits: tuple[WorkerExit, ...] = ()
    devices_start: tuple[DeviceMemory, ...] = ()
    devices_end: tuple[DeviceMemory, ...] = ()
    first_pass_batches: int | None = None  # batches in a multi-worker DataLoader's first pass
    suspects: tuple[Suspect, ...] = ()
    ended: Ended | None = None  # what ended the block, if anything (as data: never the exception)
    source_errors: tuple[SourceErrors, ...] = ()
    clock: Clock = "optimizer"  # what a step is
    optimizer_steps: int | None = None  # None: the same as `steps` (the clock is the optimizer)
    training_loader: int | None = None  # the loader whose passes are the epochs (None: every pass)
    holder_series: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # name -> (step, bytes) at scans
    live_suspects_at_step: int | None = None
    holders_on_accelerator: frozenset[str] = frozenset()  # holders whose tensors are mostly on a device
    holders_in_shared_memory: frozenset[str] = frozenset()  # ... mostly in shared-memory segments
    ranks: tuple[RankSummary, ...] | None = None  # the processes of a multi-process run, each judged on its own
    guard_advice: tuple[str, ...] = ()  # what the memory guard did, first in the advice
    holder_search: HolderSearch | None = None  # where the memory was looked for when no holder grew
    phase_passes: tuple[PhasePass, ...] = ()  # passes of phases a trainer's callback marked (validation, ...)
