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
- `final`: the rest of the evidence (`RunEvidence` but its timeline, through the serialization a saved
  report uses), sent when the rank's run ends.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..core.model import Clock
from ..core.schema import from_dict, schema_dict
from ..report.evidence import RunEvidence
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
    """Everything in `evidence` but the timeline (streamed already), as a saved report's data is written."""
    return schema_dict(evidence)


def evidence_from(fields: dict[str, Any], timeline: Timeline) -> RunEvidence:
    """The RunEvidence a rank sent (`evidence_fields`), around the timeline rebuilt from its stream."""
    evidence: RunEvidence = from_dict(RunEvidence, fields, timeline=timeline)
    return evidence
