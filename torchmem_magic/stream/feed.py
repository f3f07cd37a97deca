"""A run's stream read back: what one rank process (or a flight record) sent, message by message, rebuilt into
its timeline and its evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..analysis.forensics import WorkerExit
from ..core.model import Suspect
from ..core.options import DEFAULT_INTERVAL_MS
from ..core.schema import from_dict
from ..core.timeline import Timeline
from ..report.evidence import RunEvidence
from .protocol import apply_events, evidence_from


@dataclass
class RankFeed:
    """What one rank process sent so far."""

    pid: int
    rank: int | None = None
    local_rank: int | None = None
    host: str = ""
    started_wall_s: float = 0.0
    offset_s: float = 0.0  # the rank's t_s 0 in the watcher's seconds
    interval_s: float = DEFAULT_INTERVAL_MS / 1000
    ram_limit_bytes: int = 0
    ram_limit_source: str = "system"
    heap_available: bool = False
    timeline: Timeline = field(default_factory=Timeline)
    clock: str = "time"
    counts: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0  # the rank's own seconds at its last message
    last_seen_s: float = 0.0  # the watcher's seconds at its last message
    progress_s: float = 0.0  # the watcher's seconds at the last message that brought more steps
    dropped: int = 0
    holder_series: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    suspects: tuple[Suspect, ...] = ()
    final: dict[str, Any] | None = None
    exit: WorkerExit | None = None
    exited_s: float | None = None  # the watcher's seconds when its process ended, where that was seen
    cuda_devices: tuple[str, ...] = ()  # UUIDs of the devices its allocator uses
    cuda_contexts: dict[str, int] = field(default_factory=dict)  # device UUID -> most the driver saw it hold
    job: dict[str, Any] | None = None  # the multi-node job it belongs to (torchrun's store), if any
    oom_killed: bool = False  # SIGKILLed while the kernel's OOM-kill counters rose: the OOM killer, most likely
    oom_decided: bool = False  # decided once, when the exit is first known: a later rise is another process's kill

    @property
    def steps(self) -> int:
        return int(self.counts.get(self.clock, 0)) if self.clock != "time" else 0

    def evidence(self) -> RunEvidence:
        """The rank's evidence: what it sent at the end, else what it had sent when it stopped."""
        if self.final is not None:
            return evidence_from(self.final, self.timeline)
        return RunEvidence(
            timeline=self.timeline, steps=self.steps, wall_s=self.elapsed_s, interval_s=self.interval_s,
            ram_limit_bytes=self.ram_limit_bytes, ram_limit_source=self.ram_limit_source,
            heap_available=self.heap_available, clock=self.clock,  # type: ignore[arg-type]
            optimizer_steps=int(self.counts.get("optimizer", 0)), suspects=self.suspects,
            holder_series=self.holder_series,
        )


def apply_message(feed: RankFeed, message: dict[str, Any], now_s: float, watcher_started_wall_s: float) -> None:
    """What one message of a rank's stream (or of a flight record) tells about it, into its feed;
    `now_s` is when it came, in the watcher's seconds."""
    feed.last_seen_s = now_s
    if isinstance(message.get("rank"), int):
        feed.rank = message["rank"]
    if isinstance(message.get("local_rank"), int):
        feed.local_rank = message["local_rank"]
    kind = message["k"]
    if kind == "hello":
        feed.host = str(message.get("host", ""))
        feed.started_wall_s = float(message.get("started_wall_s", 0.0))
        feed.offset_s = feed.started_wall_s - watcher_started_wall_s
        feed.interval_s = float(message.get("interval_s", 0.1))
        feed.ram_limit_bytes = int(message.get("ram_limit_bytes", 0))
        feed.ram_limit_source = str(message.get("ram_limit_source", "system"))
        feed.heap_available = bool(message.get("heap_available", False))
        feed.job = message.get("job") if isinstance(message.get("job"), dict) else None
    elif kind == "events":
        apply_events(feed.timeline, message.get("events", []))
        steps_before = feed.steps
        feed.clock = str(message.get("clock", feed.clock))
        feed.counts = dict(message.get("counts", feed.counts))
        if feed.steps > steps_before:
            feed.progress_s = now_s
        feed.elapsed_s = float(message.get("t_s", feed.elapsed_s))
        feed.dropped = int(message.get("dropped", feed.dropped))
    elif kind == "holders":
        feed.holder_series = {n: [(int(s), int(b)) for s, b in p] for n, p in message.get("series", {}).items()}
        feed.suspects = tuple(from_dict(Suspect, s) for s in message.get("suspects", ()))
    elif kind == "devices":
        feed.cuda_devices = tuple(str(u) for u in message.get("cuda", ()))
    elif kind == "final":
        feed.final = dict(message.get("evidence", {}))
        feed.dropped = int(message.get("dropped", feed.dropped))
