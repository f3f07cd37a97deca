"""The result objects of a memwatch run (stdlib only). `to_dict()` follows SPEC.md, schema 1."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA_VERSION = 1

Status = Literal["ok", "error", "interrupted"]
Verdict = Literal["leak", "suspect", "clean", "unknown"]


@dataclass(frozen=True)
class RamSummary:
    """Process tree resident memory: kernel RSS plus children (DataLoader workers by PSS)."""

    start_bytes: int
    end_bytes: int
    peak_bytes: int
    per_step_bytes: float | None  # robust slope over the step-aligned series
    limit_bytes: int  # what the OOM killer enforces: cgroup limit, else system total
    limit_source: str  # "cgroup v2", "cgroup v1" or "system"

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start_bytes,
            "end": self.end_bytes,
            "peak": self.peak_bytes,
            "per_step": self.per_step_bytes,
            "limit": self.limit_bytes,
            "limit_source": self.limit_source,
        }


@dataclass(frozen=True)
class HeapSummary:
    """CPU heap in use by the kernel process (glibc mallinfo2: uordblks + hblkhd)."""

    start_bytes: int
    end_bytes: int
    peak_bytes: int
    per_step_bytes: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start_bytes,
            "end": self.end_bytes,
            "peak": self.peak_bytes,
            "per_step": self.per_step_bytes,
        }


@dataclass(frozen=True)
class VramSummary:
    """Accelerator memory summed over the watched devices."""

    allocated_start_bytes: int
    allocated_end_bytes: int
    allocated_peak_bytes: int
    reserved_end_bytes: int
    reserved_peak_bytes: int
    per_step_bytes: float | None
    limit_bytes: int | None  # total memory of the watched devices
    devices: tuple[str, ...]
    alloc_retries: int | None  # cudaMalloc retries during the run (fragmentation / near-OOM)
    per_device: tuple[dict[str, Any], ...] = ()  # end-of-run stats per device, incl. free/total

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocated_start": self.allocated_start_bytes,
            "allocated_end": self.allocated_end_bytes,
            "allocated_peak": self.allocated_peak_bytes,
            "reserved_end": self.reserved_end_bytes,
            "reserved_peak": self.reserved_peak_bytes,
            "per_step": self.per_step_bytes,
            "limit": self.limit_bytes,
            "devices": list(self.devices),
            "num_alloc_retries": self.alloc_retries,
            "per_device": [dict(d) for d in self.per_device],
        }


@dataclass(frozen=True)
class ShmSummary:
    """Usage of the shared-memory filesystem DataLoader workers pass batches through."""

    start_bytes: int
    end_bytes: int
    peak_bytes: int
    limit_bytes: int
    strategy: str | None  # torch.multiprocessing sharing strategy
    per_step_bytes: float | None
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start_bytes,
            "end": self.end_bytes,
            "peak": self.peak_bytes,
            "limit": self.limit_bytes,
            "strategy": self.strategy,
            "per_step": self.per_step_bytes,
            "path": self.path,
        }


@dataclass(frozen=True)
class WorkerSummary:
    """DataLoader worker processes seen during the run."""

    max_count: int  # most workers alive at once
    peak_bytes: int  # peak of their summed memory (PSS where available)
    pids_seen: int  # distinct worker processes over the run

    def to_dict(self) -> dict[str, Any]:
        return {"max": self.max_count, "peak": self.peak_bytes, "pids_seen": self.pids_seen}


@dataclass(frozen=True)
class Suspect:
    """A name in the user namespace that keeps tensors or autograd graphs alive."""

    name: str
    path: str
    kind: str
    tensors: int
    graph_nodes: int
    retained_bytes: int
    new_in_cell: bool
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "kind": self.kind,
            "tensors": self.tensors,
            "graph_nodes": self.graph_nodes,
            "retained_bytes": self.retained_bytes,
            "new_in_cell": self.new_in_cell,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class Report:
    """What one `%%memwatch` cell (or `with memwatch():` block) measured.

    Attributes:
        status: "ok", "error" (the body raised) or "interrupted" (KeyboardInterrupt).
        wall_s: seconds the body ran.
        samples: background samples taken (the step-aligned ones are extra).
        interval_s: the background sampling period.
        steps / epochs: optimizer steps and DataLoader iterators started while it ran.
        timeline: the bounded sampled series (not part of `to_dict()`), for plotting afterwards.
    """

    status: Status
    wall_s: float
    samples: int
    interval_s: float
    steps: int
    epochs: int
    ram: RamSummary
    heap: HeapSummary | None
    vram: VramSummary | None
    shm: ShmSummary | None
    workers: WorkerSummary | None
    verdict: Verdict = "unknown"
    leak_kind: str | None = None
    resource: str | None = None
    steps_to_exhaustion: float | None = None
    suspects: tuple[Suspect, ...] = ()
    advice: tuple[str, ...] = ()
    error: str | None = None  # "ExceptionType: message" when status is not ok
    timeline: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable data, SPEC.md schema 1 (plus a few documented extra keys)."""

        def opt(part: Any) -> Any:
            return None if part is None else part.to_dict()

        return {
            "schema": SCHEMA_VERSION,
            "status": self.status,
            "wall_s": self.wall_s,
            "samples": self.samples,
            "interval_s": self.interval_s,
            "steps": self.steps,
            "epochs": self.epochs,
            "ram": self.ram.to_dict(),
            "heap": opt(self.heap),
            "vram": opt(self.vram),
            "shm": opt(self.shm),
            "workers": opt(self.workers),
            "verdict": self.verdict,
            "leak_kind": self.leak_kind,
            "resource": self.resource,
            "steps_to_exhaustion": self.steps_to_exhaustion,
            "suspects": [s.to_dict() for s in self.suspects],
            "advice": list(self.advice),
            "error": self.error,
        }

    def __str__(self) -> str:
        from .render.text import report_text

        return report_text(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        from .render.text import report_html

        return report_html(self)
