"""Where the ranks of a torchrun job meet across nodes: the job's own c10d store, and what they
write there (stdlib only: identity, key names, the summaries' wire form, a silent rank's status).

torchrun hands every rank the address of a TCPStore that lives as long as the job (the one its
rendezvous uses, served by the agent of node 0) and the run's id. Each rank of a multi-node job
keeps one key there, its rolling summary, overwritten about once a second, so the store holds one
small value per rank however long the run; deaths go to one append-only events key (a line per
process that died). Keys are namespaced by run id, not by torchrun's restart count: that count is a
node's own (a node whose ranks restart because another node's failed does not count it), so it
names no attempt of the whole job. A restarted rank is a new process that takes over its key;
readers tell its attempts apart by the process id its summaries carry. Every node's watcher reads
all of them; ranks of its own node it also has from their local stream, in full detail.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..core.model import RankSummary, Suspect
from ..core.schema import from_dict

KEY_ROOT = "torchmem_magic"
WIRE_VERSION = 1
PUBLISH_PERIOD_S = 1.0  # a rank rewrites its key about this often
STALE_AFTER_S = 3.5  # a key unchanged this long (three publications missed) is a stale rank's
MAX_SUSPECTS = 5  # the holders a summary carries, largest first: the top holder is what a reader needs
MAX_SERIES_POINTS = 16  # each holder's (step, bytes) series, thinned evenly
MAX_ADVICE = 6


@dataclass(frozen=True)
class JobStore:
    """A rank's job, as torchrun's environment describes it: its store and where the rank stands."""

    host: str
    port: int
    run_id: str
    attempt: int  # torchrun's restart count on the rank's node (not in the keys: see above)
    world_size: int
    local_world_size: int
    node: int | None  # the node rank (GROUP_RANK)

    @property
    def multi_node(self) -> bool:
        """More ranks than this node runs: only then does another node need what a rank writes."""
        return self.world_size > self.local_world_size

    @property
    def prefix(self) -> str:
        return f"{KEY_ROOT}/{self.run_id}/"

    def summary_key(self, rank: int) -> str:
        return f"{self.prefix}rank/{rank}"

    @property
    def events_key(self) -> str:
        return f"{self.prefix}events"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def fields(self) -> dict[str, Any]:
        """As it travels in a rank's hello to its node's watcher."""
        return {"host": self.host, "port": self.port, "run_id": self.run_id, "attempt": self.attempt,
                "world_size": self.world_size, "local_world_size": self.local_world_size, "node": self.node}


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def job_of(env: Mapping[str, str]) -> JobStore | None:
    """The job of a process torchrun started (None for anything else: a plain script, a notebook's
    forked ranks, a DataLoader worker's missing variables)."""
    host, port, run_id = env.get("MASTER_ADDR"), _int(env.get("MASTER_PORT")), env.get("TORCHELASTIC_RUN_ID")
    world, local = _int(env.get("WORLD_SIZE")), _int(env.get("LOCAL_WORLD_SIZE"))
    if not host or port is None or not run_id or world is None or local is None:
        return None
    return JobStore(host, port, run_id, _int(env.get("TORCHELASTIC_RESTART_COUNT")) or 0, world, local,
                    _int(env.get("GROUP_RANK")))


def job_from_fields(fields: Any) -> JobStore | None:
    """The job a rank's hello names (None when it names none or is malformed)."""
    if not isinstance(fields, dict):
        return None
    try:
        node = fields.get("node")
        return JobStore(str(fields["host"]), int(fields["port"]), str(fields["run_id"]), int(fields["attempt"]),
                        int(fields["world_size"]), int(fields["local_world_size"]),
                        None if node is None else int(node))
    except (KeyError, TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------- summaries on the wire


@dataclass(frozen=True)
class Published:
    """A rank's summary as read from the store."""

    summary: RankSummary
    seq: int  # how many the rank wrote before this one: a reader sees it change while the rank lives
    sent_wall_s: float  # the rank's wall clock when it wrote it
    final: bool  # written when its run ended (its status then is the run's)


def _thinned(series: tuple[tuple[int, int], ...]) -> list[list[int]]:
    if len(series) <= MAX_SERIES_POINTS:
        return [list(p) for p in series]
    last = len(series) - 1
    picks = sorted({round(i * last / (MAX_SERIES_POINTS - 1)) for i in range(MAX_SERIES_POINTS)})
    return [list(series[i]) for i in picks]


def _suspect_fields(suspect: Suspect) -> dict[str, Any]:
    fields = suspect.to_dict()
    fields["series"] = _thinned(suspect.series)
    return fields


def encode_summary(summary: RankSummary, seq: int, sent_wall_s: float, final: bool) -> bytes:
    """A rank's summary as it is written under its key: bounded (top holders, thinned series, the
    first lines of advice), a few KB whatever the run."""
    fields = summary.to_dict()
    fields["suspects"] = [_suspect_fields(s) for s in summary.suspects[:MAX_SUSPECTS]]
    fields["advice"] = list(summary.advice[:MAX_ADVICE])
    message = {"v": WIRE_VERSION, "seq": seq, "t": sent_wall_s, "final": final, "summary": fields}
    return json.dumps(message, separators=(",", ":")).encode()


def decode_summary(data: bytes) -> Published | None:
    """What `encode_summary` wrote; None for anything else (another tool's key, a newer version)."""
    try:
        message = json.loads(data)
        if not isinstance(message, dict) or message.get("v") != WIRE_VERSION:
            return None
        summary: RankSummary = from_dict(RankSummary, message["summary"])
        return Published(replace(summary, via="store"), int(message["seq"]), float(message["t"]), bool(message["final"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def encode_death(rank: int, pid: int, ended: str | None) -> bytes:
    """One line of the events key: a rank's process that died, and how, as its node's watcher saw it."""
    return json.dumps({"rank": rank, "pid": pid, "ended": ended}, separators=(",", ":")).encode() + b"\n"


def decode_deaths(data: bytes) -> dict[tuple[int, int], str | None]:
    """(rank, pid) -> how that process ended, from the events key (lines that are not ours are skipped)."""
    deaths: dict[tuple[int, int], str | None] = {}
    for line in data.splitlines():
        try:
            event = json.loads(line)
            rank, pid = event["rank"], event["pid"]
            if isinstance(rank, int) and isinstance(pid, int):
                deaths[(rank, pid)] = None if event.get("ended") is None else str(event["ended"])
        except (ValueError, TypeError, KeyError):
            continue
    return deaths


def remote_status(
    published: Published, silent_s: float, store_lost: bool, deaths: Mapping[tuple[int, int], str | None],
    replaced: bool = False, job_failed: bool = False,
) -> tuple[str, str | None]:
    """(status, how it ended) of another node's rank as this watcher knows it: its run's own status
    once it wrote its final summary; "killed" when its node's watcher reported its death, or when a
    restart's new process took over its key (`replaced`); "stale" when its summaries stopped arriving
    (its key unchanged for STALE_AFTER_S, or the store itself gone before it finished) with nothing
    to say why, but "killed" once the job is over and failed (`job_failed`: it was stopped with it);
    else "running"."""
    summary = published.summary
    if published.final:
        return summary.status, summary.ended
    if (summary.rank, summary.pid) in deaths:
        return "killed", deaths[(summary.rank, summary.pid)]
    if replaced:
        return "killed", None
    if store_lost or silent_s > STALE_AFTER_S:
        return ("killed" if job_failed else "stale"), None
    return "running", None
