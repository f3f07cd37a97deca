"""A rank of a multi-node torchrun job, summarised in the job's store for the other nodes' watchers.

About once a second the rank's sampler thread assembles the rank's report so far, exactly as its own
node's watcher would for a rank killed at that moment (the same `assemble_report` over the same
evidence), keeps its summary row (readings, steps, verdict, top holders with their growth) and hands
it to the publisher's thread; at the end the summary of its final report replaces it. A rank of a
single-node job (every rank has a local watcher) and any process torchrun did not start publish
nothing and open nothing.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..report.merge import summary_of
from ..core.model import RankSummary
from ..ranks.job import PUBLISH_PERIOD_S, JobStore, encode_summary, job_of
from ..ranks.publisher import SummaryPublisher
from ..report.assemble import RANK_VERDICT_POINTS, RANK_VERDICT_ROWS, assemble_report
from ..report.evidence import RunEvidence

if TYPE_CHECKING:
    from ..session.live_view import LiveView
    from ..render.results import Report


def rolling_summary(view: LiveView, rank: int, local_rank: int | None, node: int | None, host: str) -> RankSummary:
    """The rank's summary over its run so far (sampler thread: the timeline is not being appended meanwhile),
    judged on the bounded rows a watcher judges a rank of many on: made every second, its cost must not
    grow with the run."""
    series, suspects = view.holders_so_far()
    limit = view.ram_limit
    evidence = RunEvidence(
        timeline=view.timeline, steps=view.steps, wall_s=view.elapsed_s, interval_s=view.interval_s,
        ram_limit_bytes=limit.limit_bytes, ram_limit_source=limit.source, heap_available=view.heap_available,
        suspects=suspects, clock=view.clock, optimizer_steps=int(view.clock_counts.get("optimizer", 0)),
        training_loader=view.training_loader(), holder_series=series,
    )
    report = assemble_report(evidence, max_rows=RANK_VERDICT_ROWS, max_points=RANK_VERDICT_POINTS)
    return summary_of(report, rank=rank, pid=os.getpid(), host=host, status="running", local_rank=local_rank, node=node)


class StorePublishing:
    """One rank's key in its job's store: rolling summaries, then the final one."""

    def __init__(self, job: JobStore, rank: int, local_rank: int | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job, self.rank, self.local_rank = job, rank, local_rank
        self.host = socket.gethostname()
        self.publisher = SummaryPublisher(job.host, job.port, job.summary_key(rank))
        self._clock = clock
        self._next_s = 0.0
        self._seq = 0
        self.build_s = 0.0  # this rank's sampler-thread seconds spent assembling summaries (its cost)

    @classmethod
    def for_rank(cls, env: Mapping[str, str], rank: int | None, local_rank: int | None) -> StorePublishing | None:
        """The publishing of a rank of a multi-node torchrun job; None for every other process."""
        job = job_of(env)
        if job is None or not job.multi_node or rank is None:
            return None
        return cls(job, rank, local_rank)

    def start(self) -> None:
        self.publisher.start()

    def _encoded(self, summary: RankSummary, final: bool) -> bytes:
        data = encode_summary(summary, self._seq, time.time(), final)
        self._seq += 1
        return data

    def on_tick(self, view: LiveView) -> None:
        """At most once every PUBLISH_PERIOD_S: the summary so far, handed to the publisher's thread."""
        now = self._clock()
        if now < self._next_s or self.publisher.problem is not None:
            return
        self._next_s = now + PUBLISH_PERIOD_S
        started = time.thread_time()
        try:
            summary = rolling_summary(view, self.rank, self.local_rank, self.job.node, self.host)
        except Exception as exc:  # a summary it cannot make is one it stops trying to make; the stream goes on
            self.publisher.problem = f"rank {self.rank} cannot summarise its run ({type(exc).__name__}: {exc})"
            return
        finally:
            self.build_s += time.thread_time() - started
        self.publisher.offer(self._encoded(summary, final=False))

    def finish(self, report: Report | None) -> bool:
        """The run ended: its final report's summary replaces the rolling one (True when written)."""
        if report is None:
            return self.publisher.finish(None, timeout_s=0.0)
        try:
            summary = summary_of(report, rank=self.rank, pid=os.getpid(), host=self.host, local_rank=self.local_rank,
                                 node=self.job.node)
            final: bytes | None = self._encoded(summary, final=True)
        except Exception:  # the rolling summary stays: its readers will see it go stale
            final = None
        return self.publisher.finish(final)
