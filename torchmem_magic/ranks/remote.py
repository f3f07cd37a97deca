"""The watcher's reader of its job's store: every rank's latest summary, kept when the store goes.

Started once a rank of this node names a multi-node job. Its thread reads every rank's key about
once a second, and every READ_ENDING_PERIOD_S once this node's ranks have finished: the other
nodes' final summaries arrive then, and the store (served by node 0's launcher) lives only until
every node's launcher is done. It stops reading once every rank's final summary is in, or at the
first failure (one line in `problem`, unless it only marks the job's end). What it last read stays:
a rank whose summaries stopped arriving keeps its last figures, with its status (`job.remote_status`).
It also writes the deaths this node's watcher witnessed, for the other nodes' reports.

For the live figure's curves of the other nodes' ranks, each keeps a history of what its summaries
said each time its key changed (a point about a second): bounded (`HISTORY_POINTS` rows, merged
pairwise beyond that as a timeline's are, so peaks stay), figures only, and none for this node's
ranks, whose every reading comes by their stream.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from ..core.model import RankSummary, headline_peak
from ..core.resources import HEAP, RAM, VRAM
from ..core.timeline import DecimatingSeries
from .job import PUBLISH_PERIOD_S, JobStore, Published, decode_deaths, decode_summary, encode_death, remote_status
from .store_client import StoreClient, StoreUnavailable

READ_ENDING_PERIOD_S = 0.02
#: rows of each other-node rank's history (a row about a second: the first ~8 min at full detail)
HISTORY_POINTS = 512
#: what a history row holds: the watcher's seconds, the rank's steps, then its readings
HISTORY_COLUMNS = ("t_s", "step", RAM.column, HEAP.column, VRAM.column)


@dataclass(frozen=True)
class RankHistory:
    """Another node's rank as its summaries said, one row each time its key changed: what its live
    curves are drawn from. `columns`: HISTORY_COLUMNS, NaN where a summary had no such reading."""

    rank: int
    host: str
    node: int | None
    clock: str
    peak_bytes: float  # its last summary's peak: VRAM allocated where it has CUDA, else RAM
    peak_of: str  # "VRAM" or "RAM"
    columns: dict[str, array[float]]


def _history_row(summary: RankSummary, now_s: float) -> dict[str, float]:
    nan = float("nan")
    return {
        "t_s": now_s, "step": float(summary.steps), RAM.column: float(summary.ram.end_bytes),
        HEAP.column: nan if summary.heap is None else float(summary.heap.end_bytes),
        VRAM.column: nan if summary.vram is None else float(summary.vram.allocated_end_bytes),
    }


def _peak_of(summary: RankSummary) -> tuple[float, str]:
    """The peak the rank is ranked by, and its resource's short name ("VRAM", "RAM")."""
    row, peak_bytes = headline_peak(summary)
    return peak_bytes, row.short


class RemoteRanks:
    """Every rank's summary from the job's store, as this watcher last read it."""

    def __init__(self, job: JobStore, clock: Callable[[], float], silence_stderr: bool = False) -> None:
        self.job = job
        #: this process is the `watch` command's own: torch's warning of a failed store call may be kept off
        #: fd 2 around each call (never in a user's process: fd 2 is process-wide, their threads write to it)
        self._silence_stderr = silence_stderr
        self._clock = clock  # the watcher's seconds (those of its feeds' `last_seen_s`)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ending = False
        self._latest: dict[int, Published] = {}
        self._changed_s: dict[int, float] = {}  # rank -> when its key last changed, in the watcher's seconds
        #: rank -> its earlier processes' last summaries (and when each last changed): a restart's new
        #: process took over the key
        self._earlier: dict[int, list[tuple[Published, float]]] = {}
        self._history: dict[int, DecimatingSeries] = {}  # rank of another node -> a row each time its key changed
        #: (rank, attempt) -> (what its summary was built from: pid, seq, status, how it ended, when its key
        #: changed; the summary): an unchanged rank's is reused, so the live figure's every call costs a lookup
        #: a rank; only the entries of the last call are kept
        self._built: dict[tuple[int, int | None], tuple[tuple[object, ...], RankSummary]] = {}
        self._deaths: dict[tuple[int, int], str | None] = {}  # (rank, pid) -> how it ended
        self._to_report: list[tuple[int, int, str | None]] = []  # deaths seen here, not yet written
        self._reported: set[tuple[int, int]] = set()
        self.problem: str | None = None
        self.lost = False  # the store can no longer be read
        self.reads = 0
        self._thread = threading.Thread(target=self._run, name="torchmem_magic-store-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def ending(self) -> None:
        """This node's ranks are done: read often now, until the others' final summaries are in."""
        self._ending = True
        self._wake.set()

    def report_death(self, rank: int, pid: int, ended: str | None) -> None:
        """A rank's process of this node died without finishing: tell the other nodes (once)."""
        with self._lock:
            if (rank, pid) in self._reported:
                return
            self._reported.add((rank, pid))
            self._to_report.append((rank, pid, ended))
        self._wake.set()

    def _run(self) -> None:
        try:
            client = StoreClient(self.job.host, self.job.port)
        except StoreUnavailable as exc:
            self.problem, self.lost = str(exc), True
            return
        except Exception as exc:  # no torch.distributed in the watcher's Python, say
            self.problem, self.lost = f"the job's store cannot be used ({type(exc).__name__}: {exc})", True
            return
        client.quiet = self._silence_stderr  # our own line says it; elsewhere torch's one warning may show
        keys = [self.job.summary_key(rank) for rank in range(self.job.world_size)]
        try:
            while not self._stop.is_set():
                self._write_deaths(client)
                self._read(client, keys)
                if self._all_final():
                    return
                self._wake.wait(READ_ENDING_PERIOD_S if self._ending else PUBLISH_PERIOD_S)
                self._wake.clear()
        except StoreUnavailable as exc:
            self.lost = True
            if not self._ending:  # the store goes with the job: only a loss mid-run is worth a line
                self.problem = str(exc)
        finally:
            client.close()

    def _write_deaths(self, client: StoreClient) -> None:
        with self._lock:
            pending, self._to_report = self._to_report, []
        for rank, pid, ended in pending:
            client.append(self.job.events_key, encode_death(rank, pid, ended))

    def _read(self, client: StoreClient, keys: list[str]) -> None:
        values = client.read([*keys, self.job.events_key])
        now_s = self._clock()
        with self._lock:
            self.reads += 1
            if self.job.events_key in values:
                self._deaths = decode_deaths(values.pop(self.job.events_key))
            for value in values.values():
                published = decode_summary(value)
                if published is None:
                    continue
                rank = published.summary.rank
                before = self._latest.get(rank)
                if before is not None and before.summary.pid != published.summary.pid:  # restarted: a new process
                    self._earlier.setdefault(rank, []).append((before, self._changed_s.get(rank, now_s)))
                    before = None
                if before is None or before.seq != published.seq:
                    self._changed_s[rank] = now_s
                    self._note(published.summary, now_s)
                self._latest[rank] = published

    def _note(self, summary: RankSummary, now_s: float) -> None:
        """One row of a rank's history (under the lock); none for this node's own ranks."""
        if self.job.node is not None and summary.node == self.job.node:
            return
        series = self._history.get(summary.rank)
        if series is None:
            series = self._history[summary.rank] = DecimatingSeries(HISTORY_POINTS)
        series.append(_history_row(summary, now_s))

    def _all_final(self) -> bool:
        with self._lock:
            return len(self._latest) >= self.job.world_size and all(p.final for p in self._latest.values())

    def summaries(self, skip: Collection[int] = (), job_failed: bool = False) -> tuple[RankSummary, ...]:
        """Every rank read so far but those in `skip` (this node's, known in full from their stream),
        with its status as this watcher knows it and `last_seen_s` when its key last changed. A rank
        that torchrun restarted has an entry for each of its processes seen, `attempt` 0, 1, ...
        `job_failed`: the job is over and failed, so a rank gone silent without finishing was stopped."""
        now_s = self._clock()
        with self._lock:
            out = []
            built: dict[tuple[int, int | None], tuple[tuple[object, ...], RankSummary]] = {}
            for rank, published in sorted(self._latest.items()):
                if rank in skip:
                    continue
                earlier = self._earlier.get(rank, [])
                for attempt, (old, changed_s) in enumerate(earlier):
                    status, ended = remote_status(old, now_s - changed_s, self.lost, self._deaths, replaced=True)
                    out.append(self._summary(old, status, ended, changed_s, attempt, built))
                changed_s = self._changed_s.get(rank, now_s)
                status, ended = remote_status(published, now_s - changed_s, self.lost, self._deaths,
                                              job_failed=job_failed)
                out.append(self._summary(published, status, ended, changed_s, len(earlier) if earlier else None, built))
            self._built = built  # a rank no longer reported (this node's now, say) keeps nothing
            return tuple(out)

    def _summary(
        self, published: Published, status: str, ended: str | None, changed_s: float, attempt: int | None,
        built: dict[tuple[int, int | None], tuple[tuple[object, ...], RankSummary]],
    ) -> RankSummary:
        """A rank's summary with its status as this watcher knows it (under the lock): the one built at
        the last call while its process, its message (seq) and its status are the same."""
        slot = (published.summary.rank, attempt)
        source = (published.summary.pid, published.seq, status, ended, changed_s)
        kept = self._built.get(slot)
        if kept is not None and kept[0] == source:
            summary = kept[1]
        else:
            summary = replace(published.summary, status=status, ended=ended, last_seen_s=changed_s, attempt=attempt)
        built[slot] = (source, summary)
        return summary

    def histories(self, skip: Collection[int] = ()) -> tuple[RankHistory, ...]:
        """Each other-node rank's history but those in `skip`, by rank (copies: the reader's thread goes on)."""
        with self._lock:
            kept = [(rank, series, self._latest[rank].summary) for rank, series in sorted(self._history.items())
                    if rank not in skip]
        out = []
        for rank, series, summary in kept:
            peak_bytes, peak_of = _peak_of(summary)
            out.append(RankHistory(rank, summary.host, summary.node, summary.clock, peak_bytes, peak_of,
                                   series.columns(*HISTORY_COLUMNS)))
        return tuple(out)

    def close(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
