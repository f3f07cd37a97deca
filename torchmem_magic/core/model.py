"""What a memwatch run and a memcheck measured, as plain data (stdlib only; nothing here renders).

`to_dict()` writes the documented JSON schema of reports, version 1: plain JSON-serialisable data
that stays stable for code reading saved reports. Field names carry units (`peak_bytes`); the
schema's keys drop the `_bytes` suffix (`peak`) unless a field says otherwise in its metadata, so
each class states its schema once, in its fields. The objects users hold, which also print and
display themselves, are the subclasses in `results.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from . import resources
from .schema import from_dict, schema_dict, schema_key

REPORT_SCHEMA_VERSION = 2  # 2 added the step clock (version-1 readers keep working: nothing removed)
MEMCHECK_SCHEMA_VERSION = 1

Status = Literal["ok", "error", "interrupted", "killed"]
VerdictName = Literal["leak", "suspect", "clean", "unknown"]
#: what one "step" is in a report: the best clock the loop had, in this order; "time" (seconds) when none ticked
Clock = Literal["optimizer", "backward", "batch", "forward", "time"]
STEP_CLOCKS: tuple[Clock, ...] = ("optimizer", "backward", "batch", "forward")


class _SchemaDict:
    """`to_dict()` from the dataclass fields: plain JSON-serialisable data under the schema's keys."""

    def to_dict(self) -> dict[str, Any]:
        return schema_dict(self)


class _VersionedSchemaDict(_SchemaDict):
    """A top-level result's `to_dict()`: the schema version first, so readers of saved data can tell
    which layout they hold."""

    schema_version: ClassVar[int]

    def to_dict(self) -> dict[str, Any]:
        """`{"schema": N, ...}` followed by one key per field, as plain JSON-serialisable data."""
        return {"schema": self.schema_version, **super().to_dict()}


@dataclass(frozen=True)
class ResourceSummary(_SchemaDict):
    """A resource's figures over the run, where the report has no summary of its own for it: what
    every resource has. It is written under its own key (`name`), beside the report's other summaries."""

    start_bytes: int
    end_bytes: int
    peak_bytes: int
    per_step_bytes: float | None
    limit_bytes: int | None = None
    name: str = field(default="", metadata={"key": None})  # its row's `summary` key in the resources table


def _spread_from(cls: type[Any], data: dict[str, Any]) -> tuple[ResourceSummary, ...]:
    """The summaries saved under keys of their own: those of the resources table's rows that `cls` has
    no field for (keys of rows unknown here are left: a newer writer's)."""
    own = {schema_key(f) for f in fields(cls)}
    names = dict.fromkeys(r.summary for r in resources.RESOURCES if r.summary and r.summary not in own)
    return tuple(replace(from_dict(ResourceSummary, data[name]), name=name) for name in names if name in data)


#: the metadata of a field holding summaries that each take a key of their own (`ResourceSummary.name`)
SPREAD: dict[str, Any] = {"key": None, "spread": _spread_from}


def resource_summary(part: Any, name: str | None) -> Any:
    """The summary called `name` on a report or a rank's entry: its own field, else one of its
    `extra` summaries; None where it has none."""
    if not name:
        return None
    if name in {f.name for f in fields(part)}:
        return getattr(part, name)
    return next((s for s in getattr(part, "extra", ()) if s.name == name), None)


def headline_peak(part: Any) -> tuple[resources.Resource, float]:
    """The peak a run or a rank is compared and ranked by, with its resource: its accelerator's memory
    where it used one, else its RAM."""
    for row in resources.headline_rows():
        summary = resource_summary(part, row.summary)
        if summary is not None and summary.peak_bytes:
            return row, float(summary.peak_bytes)
    return resources.RAM, float(part.ram.peak_bytes)


def leak_summary(part: Any, resource: str | None) -> Any:
    """The summary of the resource a verdict names ("heap"), found through the resources table; None
    where the report has none, or the name is no resource that can leak."""
    row = next((r for r in resources.RESOURCES if r.key == resource and r.leak_rank is not None), None)
    return None if row is None else resource_summary(part, row.summary)


@dataclass(frozen=True)
class RamSummary(_SchemaDict):
    """Process tree resident memory: kernel RSS plus children (DataLoader workers by PSS)."""

    start_bytes: int
    end_bytes: int
    peak_bytes: int
    per_step_bytes: float | None  # the leak detector's slope after warm-up (split-half slope over all steps when too few)
    limit_bytes: int  # what the OOM killer enforces: cgroup limit, else system total
    limit_source: str  # "cgroup v2", "cgroup v1" or "system"


@dataclass(frozen=True)
class HeapSummary(_SchemaDict):
    """CPU heap in use by the kernel process (glibc mallinfo2: uordblks + hblkhd)."""

    start_bytes: int
    end_bytes: int
    peak_bytes: int
    per_step_bytes: float | None


@dataclass(frozen=True)
class DeviceMemory(_SchemaDict):
    """One accelerator's memory as its allocator and driver report it."""

    name: str  # "cuda:0", "mps"
    allocated_bytes: int
    reserved_bytes: int
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    num_alloc_retries: int | None
    total_bytes: int | None
    free_bytes: int | None  # what the driver says is still free on the device (all processes)


@dataclass(frozen=True)
class VramSummary(_SchemaDict):
    """Accelerator memory summed over the watched devices."""

    allocated_start_bytes: int
    allocated_end_bytes: int
    allocated_peak_bytes: int
    reserved_end_bytes: int
    reserved_peak_bytes: int
    per_step_bytes: float | None
    limit_bytes: int | None  # total memory of the watched devices
    devices: tuple[str, ...]
    num_alloc_retries: int | None  # cudaMalloc retries during the run (fragmentation / near-OOM)
    per_device: tuple[DeviceMemory, ...] = ()  # end-of-run stats per device, incl. free/total

    @property
    def peak_bytes(self) -> int:
        """What the tensors used at most: the figure a summary's peak means for every resource."""
        return self.allocated_peak_bytes

    @property
    def end_bytes(self) -> int:
        """What the tensors used at the end, as every resource's summary says it."""
        return self.allocated_end_bytes


@dataclass(frozen=True)
class ShmSummary(_SchemaDict):
    """Usage of the shared-memory filesystem DataLoader workers pass batches through."""

    start_bytes: int
    end_bytes: int
    peak_bytes: int
    limit_bytes: int
    strategy: str | None  # torch.multiprocessing sharing strategy
    per_step_bytes: float | None
    path: str
    torch_segments: int = 0  # torch_* segments in use at the end (named files + unlinked ones held open)


@dataclass(frozen=True)
class WorkerSummary(_SchemaDict):
    """DataLoader worker processes seen during the run."""

    max_count: int = field(metadata={"key": "max"})  # most workers alive at once
    peak_bytes: int  # peak of their summed memory (PSS where available)
    pids_seen: int  # distinct worker processes over the run
    per_worker: tuple[dict[str, int], ...] = ()  # {"pid", "pss_peak", "uss_peak"} for each worker seen


@dataclass(frozen=True)
class Suspect(_SchemaDict):
    """A name in the user namespace that keeps tensors or autograd graphs alive."""

    name: str
    path: str
    kind: str
    tensors: int
    graph_nodes: int
    retained_bytes: int = field(metadata={"key": "retained_bytes"})
    new_in_cell: bool
    fix: str
    growth_per_step: float | None = None  # bytes a step this holder grew by over the run
    series: tuple[tuple[int, int], ...] = ()  # (step, retained bytes) at each scan of the run
    first_seen_step: int | None = None  # 0 when it held memory before the cell started
    rank: int | None = None  # the rank whose process holds it, in a multi-process run
    growth_share: float | None = None  # the share (0–1) of the leak's growth it explains; None: no leak to share
    #: retained_bytes by the memory it lives in: "heap", "shm" (shared-memory segments), "vram"
    retained_by_resource: Mapping[str, int] = field(default_factory=dict, metadata={"key": "retained_by_resource"})


def by_retained(suspects: Iterable[Suspect]) -> tuple[Suspect, ...]:
    """Suspects in the schema's order: largest `retained_bytes` first; equal sizes by name, then
    path, then rank (a single process's holder before the ranks'), so the order never depends on
    which scan or which rank came first."""
    return tuple(sorted(suspects, key=lambda s: (-s.retained_bytes, s.name, s.path, -1 if s.rank is None else s.rank)))


class _LargestFirst:
    """A result holding suspects keeps them in the schema's order whoever built it (the report's
    assembly, a merge of ranks, a saved file read back, a flight record replayed)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "suspects", by_retained(getattr(self, "suspects")))


@dataclass(frozen=True)
class RankSummary(_LargestFirst, _SchemaDict):
    """One rank (process) of a multi-process run: its own memory, steps, verdict and holders.

    `status` says how the rank ended: "ok", "error", "interrupted", "killed" (it stopped reporting
    without finishing: a signal, the OOM killer, or its launcher stopping it), or "running" (still
    alive when the watch ended), or "stale" (a rank of another node whose summaries stopped reaching
    this watcher through the job's store, with nothing to say why). `ended` is how, where known
    ("SIGKILL", "exit code 1"). `via` says how its figures came: "stream" (this node's rank, every
    reading) or "store" (another node's rank: its last rolling summary in the job's c10d store).
    """

    rank: int
    pid: int
    host: str
    ram: RamSummary
    heap: HeapSummary | None
    vram: VramSummary | None
    steps: int
    verdict: VerdictName
    leak_kind: str | None
    resource: str | None
    steps_to_exhaustion: float | None
    suspects: tuple[Suspect, ...]
    clock: Clock = "optimizer"
    per_step_bytes: float | None = None  # the verdict's rate for `resource`
    epochs: int = 0
    status: str = "ok"
    ended: str | None = None
    wall_s: float = 0.0
    last_seen_s: float = 0.0  # seconds into the watch of its last message
    stalled_s: float = 0.0  # how long it had made no step when its last message came
    exited_s: float | None = None  # seconds into the watch when its process ended, where the watcher saw it
    local_rank: int | None = None
    advice: tuple[str, ...] = ()
    dropped_messages: int = field(default=0, metadata={"key": "dropped"})  # lost to a full transport buffer
    #: the driver's view (NVML): {"device": UUID, "used": bytes, "own": its allocator uses that device}
    cuda_contexts: tuple[dict[str, Any], ...] = ()
    node: int | None = None  # the launcher's node rank (torchrun's GROUP_RANK), where it has one
    via: str = "stream"
    attempt: int | None = None  # where torchrun restarted the rank: which of its processes (0, 1, ...); else None
    timeline: Any = field(default=None, repr=False, compare=False, metadata={"key": None})
    extra: tuple[ResourceSummary, ...] = field(default=(), metadata=SPREAD)  # resources without a field here


class Attempted(Protocol):
    """A rank's entry that may be one of several processes of that rank (torchrun restarted it)."""

    @property
    def rank(self) -> int: ...
    @property
    def attempt(self) -> int | None: ...


A = TypeVar("A", bound=Attempted)


def last_of_each_rank(ranks: Sequence[A]) -> list[A]:
    """Each rank's last process: where torchrun restarted a rank, the entry of its last attempt."""
    last: dict[int, A] = {}
    for entry in ranks:
        if entry.rank not in last or (entry.attempt or 0) > (last[entry.rank].attempt or 0):
            last[entry.rank] = entry
    return [entry for entry in ranks if last[entry.rank] is entry]


def earlier_processes(ranks: Sequence[A]) -> set[int]:
    """`id()` of each entry that is a restarted rank's earlier process (what a table labels)."""
    last = {id(entry) for entry in last_of_each_rank(ranks)}
    return {id(entry) for entry in ranks if id(entry) not in last}


@dataclass(frozen=True)
class TensorFinding(_SchemaDict):
    """One tensor reachable from what was checked (an entry of a memcheck's `findings`)."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    bytes: int  # its storage's bytes (0 when an earlier finding already counted that storage)
    requires_grad: bool
    grad_fn: str | None
    graph_nodes: int
    retained_bytes: int = field(metadata={"key": "retained_bytes"})  # storage counted here + its graph


@dataclass(frozen=True)
class MemcheckData(_LargestFirst, _VersionedSchemaDict):
    """What `%memcheck EXPR` / `memcheck(obj)` found.

    `retained_bytes` is what deleting the checked object would free: tensors counted once by
    storage, plus what their autograd graphs alone keep alive (saved activations, ~700 B a node).
    `estimated` says a graph was too big to walk in full and its figures were extrapolated.
    """

    expr: str
    tensors: int
    bytes: int
    graph_tensors: int
    graph_nodes: int
    retained_bytes: int = field(metadata={"key": "retained_bytes"})
    devices: tuple[str, ...]
    truncated: bool
    findings: tuple[TensorFinding, ...]
    advice: tuple[str, ...]
    estimated: bool = False
    skipped_objects: int = 0  # objects whose introspection raised (skipped, never fatal)
    suspects: tuple[Suspect, ...] = ()  # whole-namespace checks: per-name holders, largest first
    elapsed_s: float = 0.0

    schema_version: ClassVar[int] = MEMCHECK_SCHEMA_VERSION


@dataclass(frozen=True)
class ReportData(_LargestFirst, _VersionedSchemaDict):
    """What one `%%memwatch` cell (or `with memwatch():` block) measured.

    Attributes:
        status: "ok", "error" (the body raised), "interrupted" (KeyboardInterrupt) or "killed" (the
            process died during the run: a report rebuilt from its flight record).
        wall_s: seconds the body ran.
        samples: background samples taken (the step-aligned ones are extra).
        interval_s: the background sampling period.
        clock: what one step is: "optimizer" steps, "backward" passes, DataLoader "batch"es,
            outermost "forward" calls, or "time" (then rates are per second).
        steps: steps of that clock; `optimizer_steps` counts optimizer steps whatever the clock.
        epochs: passes of the loader that carries the steps (a validation pass inside is not one).
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
    extra: tuple[ResourceSummary, ...] = field(default=(), metadata=SPREAD)  # resources without a field here
    verdict: VerdictName = "unknown"
    leak_kind: str | None = None
    resource: str | None = None
    steps_to_exhaustion: float | None = None
    suspects: tuple[Suspect, ...] = ()
    advice: tuple[str, ...] = ()
    error: str | None = None  # "ExceptionType: message" when status is not ok
    seconds_to_exhaustion: float | None = None  # steps_to_exhaustion at the run's step rate
    per_step_error_bytes: float | None = None  # uncertainty of the leaking resource's per-step growth
    sporadic_steps: tuple[tuple[int, int], ...] = ()  # (first, last) step each sporadic jump lies in
    source_errors: tuple[SourceErrors, ...] = field(default=(), metadata={"key": "errors"})  # sources that failed
    clock: Clock = "optimizer"
    optimizer_steps: int = 0
    per_epoch_bytes: float | None = None  # a per-epoch leak's growth per epoch of the training loader
    live_suspects_at_step: int | None = None  # first step a holder was named while the cell ran
    ranks: tuple[RankSummary, ...] | None = None  # per-rank reports of a multi-process run; None: one process
    worst_rank: int | None = None
    timeline: Any = field(default=None, repr=False, compare=False, metadata={"key": None})

    schema_version: ClassVar[int] = REPORT_SCHEMA_VERSION


@dataclass(frozen=True)
class LiveStatus:
    """What the one-line live status under the figure shows; sizes in bytes, NaN where absent."""

    elapsed_s: float
    steps: int
    epochs: int
    ram_bytes: float
    heap_bytes: float
    vram_allocated_bytes: float
    vram_reserved_bytes: float
    shm_used_bytes: float
    workers: int
    ram_per_step: float | None
    heap_per_step: float | None
    vram_per_step: float | None
    verdict: str | None = None  # the verdict as it forms, once the run has enough steps for one
    clock: Clock = "optimizer"
    holder: str | None = None  # the fastest-growing holder so far: "val_outputs +2.9 MiB/step, autograd graphs"
    ranks: int = 0  # processes streaming as ranks (0: a single-process run)
    rank_steps: tuple[int, int] | None = None  # the slowest and the fastest rank's steps of `rank_clock`
    rank_clock: Clock = "optimizer"
    worst_rank: str | None = None  # "worst rank 1: leak +67.8 KiB/step in heap (outputs)", once judged
    guard: str | None = None  # the memory guard's warning: "guard: RAM 61% of 4.0 GiB, 90% in ~2 min at +5.0 MiB/s"

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class SourceErrors(_SchemaDict):
    """A source of figures that failed while the run went on (a probe, a hook, the sampler thread)."""

    source: str  # "step/epoch hooks", "heap probe", "sampler thread"
    count: int
    last: str  # the last failure, "OSError: ..."
    cost: str | None = None  # what the failures cost, where it is not gaps in this report's figures
