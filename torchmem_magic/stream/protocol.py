"""What a watched rank tells the watching session, as small JSON datagrams (stdlib only).

A rank streams everything its own session gathers: its timeline's rows and loader passes as they
are made, its holders after each mid-run scan, and at the end the rest of its evidence. The
watching side rebuilds the rank's timeline from the stream and assembles the rank's report with
the same `assemble_report` a single process uses, so a rank that finished and one that was
SIGKILLed (whose evidence stops at its last message) are judged by one path.

Messages (`"k"` is the kind; every message carries the sender's `pid`):
- `hello`: who the rank is (rank, local rank, host), when it started, its interval and RAM limit;
  for a rank of a multi-node torchrun job also `job`, where its job's store is (`job.JobStore.fields`).
- `events`: timeline events in order (`["t", row]` a background row, `["s", row]` a step row,
  `["r"]` step rows restart for a better clock, `["p", t_s, loader, steps]` a loader pass), the
  clock counts so far, and how many events a full buffer dropped.
- `holders`: the holders' series and the suspects at the last mid-run scan.
- `final`: the rest of the evidence, sent when the rank's run ends normally.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from ..core.ended import Ended
from ..core.model import Clock, DeviceMemory, SourceErrors, Suspect, from_schema_dict
from ..report.evidence import RunEvidence, WorkerEvidence
from ..core.timeline import COLUMNS, NAN, Row, Timeline

#: the sink's address, set for a watched command's processes (with the bootstrap on PYTHONPATH)
ENV_SINK = "TORCHMEM_MAGIC_SINK"
MAX_EVENTS_PER_MESSAGE = 200  # ~30 KB: well inside a Unix datagram


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any] | None:
    """The message, or None for anything that is not one of ours (a stray datagram is ignored)."""
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(message, dict) or not isinstance(message.get("k"), str) or not isinstance(message.get("pid"), int):
        return None
    return message


def events_message(pid: int, clock: str, counts: Mapping[Clock, int], t_s: float, dropped: int, events: list[Any],
                   **identity: Any) -> dict[str, Any]:
    """An `events` message: timeline events in order, with the clock counts and the sender's seconds."""
    return {"k": "events", "pid": pid, **identity, "clock": clock, "counts": dict(counts), "t_s": t_s,
            "dropped": dropped, "events": events}


def row_values(row: Row) -> list[float | None]:
    """A row in column order, NaN as null (JSON has no NaN)."""
    out: list[float | None] = []
    for name in COLUMNS:
        value = row.get(name, NAN)
        out.append(None if math.isnan(value) else value)
    return out


def row_of(values: list[Any]) -> dict[str, float]:
    return {name: NAN if v is None else float(v) for name, v in zip(COLUMNS, values)}


def apply_events(timeline: Timeline, events: list[Any]) -> None:
    """Replay a rank's timeline events into the watching side's copy of its timeline."""
    for event in events:
        kind = event[0]
        if kind == "t":
            timeline.by_time.append(row_of(event[1]))
        elif kind == "s":
            timeline.by_step.append(row_of(event[1]))
        elif kind == "r":
            timeline.restart_steps()
        elif kind == "p":
            timeline.add_pass(float(event[1]), int(event[2]), tuple(int(n) for n in event[3]))


# ----------------------------------------------------------------------------- evidence


def evidence_fields(evidence: RunEvidence) -> dict[str, Any]:
    """Everything in `evidence` but the timeline (streamed already) and host-wide figures (shm)."""
    workers = evidence.workers
    return {
        "steps": evidence.steps,
        "wall_s": evidence.wall_s,
        "interval_s": evidence.interval_s,
        "ram_limit_bytes": evidence.ram_limit_bytes,
        "ram_limit_source": evidence.ram_limit_source,
        "heap_available": evidence.heap_available,
        "workers": None if workers is None else [workers.max_count, workers.pids_seen, [list(p) for p in workers.peaks]],
        "devices_start": [d.to_dict() for d in evidence.devices_start],
        "devices_end": [d.to_dict() for d in evidence.devices_end],
        "first_pass_batches": evidence.first_pass_batches,
        "suspects": [s.to_dict() for s in evidence.suspects],
        "error": None if evidence.ended is None else asdict(evidence.ended),
        "source_errors": [e.to_dict() for e in evidence.source_errors],
        "clock": evidence.clock,
        "optimizer_steps": evidence.optimizer_steps,
        "training_loader": evidence.training_loader,
        "holder_series": {name: [list(p) for p in points] for name, points in evidence.holder_series.items()},
        "live_suspects_at_step": evidence.live_suspects_at_step,
        "holders_on_accelerator": sorted(evidence.holders_on_accelerator),
    }


def _ended(error: Any) -> Ended | None:
    """What ended a rank's run, as it sent it (`asdict(Ended)`; a [type name, message] pair from an older
    sender)."""
    if not error:
        return None
    if isinstance(error, list):
        name, message = str(error[0]), str(error[1])
        return Ended(name, message, interrupted=name == "KeyboardInterrupt")
    ended: Ended = from_schema_dict(Ended, error)
    return ended


def evidence_from(fields: dict[str, Any], timeline: Timeline) -> RunEvidence:
    """The RunEvidence a rank sent (`evidence_fields`), around the timeline rebuilt from its stream."""
    workers = fields.get("workers")
    return RunEvidence(
        timeline=timeline,
        steps=int(fields.get("steps", 0)),
        wall_s=float(fields.get("wall_s", 0.0)),
        interval_s=float(fields.get("interval_s", 0.1)),
        ram_limit_bytes=int(fields.get("ram_limit_bytes", 0)),
        ram_limit_source=str(fields.get("ram_limit_source", "system")),
        heap_available=bool(fields.get("heap_available", False)),
        workers=None if workers is None else WorkerEvidence(
            int(workers[0]), int(workers[1]), tuple((int(a), int(b), int(c)) for a, b, c in workers[2])
        ),
        devices_start=tuple(from_schema_dict(DeviceMemory, d) for d in fields.get("devices_start", ())),
        devices_end=tuple(from_schema_dict(DeviceMemory, d) for d in fields.get("devices_end", ())),
        first_pass_batches=fields.get("first_pass_batches"),
        suspects=tuple(from_schema_dict(Suspect, s) for s in fields.get("suspects", ())),
        ended=_ended(fields.get("error")),
        source_errors=tuple(from_schema_dict(SourceErrors, e) for e in fields.get("source_errors", ())),
        clock=fields.get("clock", "time"),
        optimizer_steps=fields.get("optimizer_steps"),
        training_loader=fields.get("training_loader"),
        holder_series={
            str(name): [(int(s), int(b)) for s, b in points] for name, points in fields.get("holder_series", {}).items()
        },
        live_suspects_at_step=fields.get("live_suspects_at_step"),
        holders_on_accelerator=frozenset(str(name) for name in fields.get("holders_on_accelerator", ())),
    )
