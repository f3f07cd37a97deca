"""A read-only view of a running session, for those who watch it go: the live figure and a rank's
stream (listeners), the flight recorder and the memory guard. They read the run's parts through it
and never reach the session itself; the verdict so far is worked out here, at most once a second."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

from ..core.model import Clock, DeviceMemory, LiveStatus, RankSummary, Suspect
from ..core.timeline import COLUMNS
from ..report.assemble import diagnose
from ..report.live_status import LIVE_VERDICT_ROWS, LIVE_VERDICT_STEPS, live_status, short_verdict
from ..analysis.findings import Diagnosis

if TYPE_CHECKING:
    from ..tracing.guard import MemoryGuard
    from ..finder.leak_finder import HolderSeries, LeakFinder
    from ..core.options import SessionOptions
    from ..probes.bundle import ProbeBundle
    from ..probes.limits import MemoryLimit
    from ..probes.shm import ShmReading
    from ..ranks.feed import RankFeeds
    from ..stream.feed import RankFeed
    from ..ranks.live import LiveRanks, RankLive
    from ..ranks.remote import RankHistory
    from ..render.results import Report
    from ..tracing.steps import RunTime, StepCounter
    from ..core.timeline import Timeline

LIVE_VERDICT_PERIOD_S = 1.0
#: a run without any step yet is judged live against seconds only after this long: until its loop
#: starts, a cell is still setting up (torch's own setup, the model, the data, the workers), memory
#: that grows until the first step and then stops
LIVE_SECONDS_GRACE_S = 10.0


class Listener(Protocol):
    """Receives live updates. `on_tick` runs on the sampler thread only (one writer); it may return
    the CPU seconds that work it handed to another thread cost there since its last call (counted
    against `tick_cpu_share` as its own). `on_finish` runs on the caller's thread after the sampler has
    stopped. A listener may also set `tick_max_period_s`: it is called at least that often, whatever its
    calls cost."""

    tick_period_s: float
    tick_cpu_share: float | None  # None: every tick_period_s; else as rarely as keeps on_tick under this share

    def on_tick(self, view: LiveView) -> float | None: ...

    def on_finish(self, view: LiveView, report: Report) -> None: ...


class FanOut:
    """Several listeners as one: each is called on its own period (the fastest sets the ticks)."""

    tick_cpu_share: float | None = None

    def __init__(self, listeners: list[Listener], clock: Callable[[], float] = time.monotonic) -> None:
        self._listeners = listeners
        self._clock = clock
        self._next_s = [0.0] * len(listeners)
        self.tick_period_s = min(listener.tick_period_s for listener in listeners)

    def on_tick(self, view: LiveView) -> float | None:
        now_s = self._clock()
        elsewhere_s = 0.0
        for i, listener in enumerate(self._listeners):
            if now_s >= self._next_s[i]:
                self._next_s[i] = now_s + listener.tick_period_s
                elsewhere_s += listener.on_tick(view) or 0.0
        return elsewhere_s

    def on_finish(self, view: LiveView, report: Report) -> None:
        for listener in self._listeners:
            listener.on_finish(view, report)


@dataclass(frozen=True)
class LiveSnapshot:
    """What the live figure draws at one moment, judged already: the figure draws it and decides
    nothing (the status line's verdict, the worst rank and the guard's thresholds are worked out here).

    The timeline is the run's own, read as it is when drawn: its series are bounded and append-only."""

    status: LiveStatus
    timeline: Timeline
    clock: Clock
    epoch_markers: tuple[tuple[float, float], ...]  # (seconds, step) at which each epoch began
    guard_thresholds: tuple[tuple[str, float, str], ...] = ()  # (column, bytes, label) the guard acts at
    rank_feeds: tuple[RankFeed, ...] = ()  # this node's ranks, each as it streamed so far
    worst_rank: RankLive | None = None
    remote: tuple[RankHistory, ...] = ()  # the other nodes' ranks' points, from the job's store
    report: Report | None = None  # the run's report, once it ended

    @property
    def running(self) -> bool:
        return self.report is None


class LiveView:
    """What a session measured so far (any thread may read; only the session writes the parts)."""

    def __init__(
        self,
        options: SessionOptions,
        runtime: RunTime,
        steps: StepCounter,
        timeline: Timeline,
        probes: ProbeBundle,
        finder: LeakFinder | None,
        ranks: RankFeeds | None,
        guard: MemoryGuard | None,
    ) -> None:
        self._options, self._runtime, self._steps = options, runtime, steps
        self._timeline = timeline
        self._probes, self._finder, self._ranks, self._guard = probes, finder, ranks, guard
        self._report: Report | None = None
        self._live: tuple[float, Diagnosis] | None = None  # (when, the live verdict)
        self._live_ranks: LiveRanks | None = None  # each rank's verdict as it forms
        #: (rank, attempt) of another node's rank -> (the summary it was made from, its state): remade only
        #: when the store reader hands a new summary; the ranks of the last call only
        self._remote_live: dict[tuple[int, int | None], tuple[RankSummary, RankLive]] = {}

    def _finished(self, report: Report) -> None:
        """The session's last word: the run is over and judged. The live verdict is worked out again over the
        whole run when next asked (it was at most a second old, and the last second's steps were not in it)."""
        self._report = report
        self._live = None

    # ---------------------------------------------------------------- the run
    @property
    def timeline(self) -> Timeline:
        return self._timeline

    @property
    def running(self) -> bool:
        return self._runtime.running

    @property
    def report(self) -> Report | None:
        """The report, once the run has ended."""
        return self._report

    @property
    def elapsed_s(self) -> float:
        return self._runtime.elapsed_s()

    @property
    def started_wall_s(self) -> float:
        return self._runtime.started_wall_s

    @property
    def interval_s(self) -> float:
        return self._options.interval_s

    @property
    def shm_path(self) -> str:
        return self._options.shm_path

    @property
    def clock(self) -> Clock:
        return self._steps.clock

    @property
    def steps(self) -> int:
        return self._steps.steps

    @property
    def clock_counts(self) -> dict[Clock, int]:
        return self._steps.counts

    def training_loader(self) -> int | None:
        return self._steps.training_loader(self.timeline)

    def epoch_markers(self) -> list[tuple[float, float]]:
        """(seconds, step) at which each epoch so far began: the training loader's passes."""
        clock = self.clock
        return [(m.t_s, float(m.step_of(clock))) for m in self.timeline.epochs_of(self.training_loader())]

    # ---------------------------------------------------------------- the probes
    @property
    def ram_limit(self) -> MemoryLimit:
        return self._probes.limit

    @property
    def heap_available(self) -> bool:
        return self._probes.heap_available

    @property
    def devices_at_start(self) -> tuple[DeviceMemory, ...]:
        return self._probes.devices_at_start

    def shm_usage(self) -> ShmReading | None:
        return self._probes.shm_usage()

    def device_uuids(self) -> list[str]:
        return self._probes.device_uuids()

    # ---------------------------------------------------------------- the leak finder
    @property
    def holder_scans_so_far(self) -> int:
        return self._finder.scans if self._finder is not None else 0

    def holders_so_far(self) -> tuple[HolderSeries, tuple[Suspect, ...]]:
        return self._finder.holders_so_far() if self._finder is not None else ({}, ())

    def live_holder(self) -> str | None:
        return self._finder.live_holder(self.clock) if self._finder is not None else None

    # ---------------------------------------------------------------- the guard and the ranks
    def guard_thresholds(self) -> list[tuple[str, float, str]]:
        return self._guard.thresholds() if self._guard is not None else []

    def rank_feeds(self) -> list[RankFeed]:
        return self._ranks.snapshot() if self._ranks is not None else []

    def remote_histories(self, skip: Collection[int]) -> tuple[RankHistory, ...]:
        """The other nodes' ranks' points, from the job's store (those in `skip` are this node's)."""
        return self._ranks.remote_histories(skip) if self._ranks is not None else ()

    def live_ranks(self) -> tuple[RankLive, ...]:
        """Each rank's verdict so far (each recomputed at most once a second), by rank number; once
        the run ended, as the report judged them."""
        if self._report is not None and self._report.ranks:
            from ..ranks.live import from_summary

            return tuple(from_summary(r) for r in self._report.ranks)
        feeds = self.rank_feeds()
        if not feeds or self._ranks is None:
            return ()
        from ..ranks.live import LiveRanks

        if self._live_ranks is None:
            self._live_ranks = LiveRanks(self._runtime.clock)
        local = self._live_ranks.judge(feeds)
        remote = self._remote_live_ranks(self._ranks.remote_summaries())  # the other nodes', from the job's store
        return tuple(sorted([*local, *remote], key=lambda r: r.rank))

    def _remote_live_ranks(self, summaries: tuple[RankSummary, ...]) -> list[RankLive]:
        """The other nodes' ranks as the status line judges them. The store's reader hands the same
        summary object while a rank's message (its seq) and status are unchanged, so such a rank costs a
        lookup here; what is kept is only the ranks of this call."""
        from ..ranks.live import from_summary

        kept: dict[tuple[int, int | None], tuple[RankSummary, RankLive]] = {}
        out = []
        for summary in summaries:
            slot = (summary.rank, summary.attempt)
            before = self._remote_live.get(slot)
            live = before[1] if before is not None and before[0] is summary else from_summary(summary)
            kept[slot] = (summary, live)
            out.append(live)
        self._remote_live = kept
        return out

    # ---------------------------------------------------------------- the verdict so far
    def live_verdict(self, loader: int | None = None) -> Diagnosis | None:
        """The verdict over the run so far, recomputed at most once a second (sampler thread); None
        before LIVE_VERDICT_STEPS steps (or samples, for a loop without a step clock, and only once it
        has gone LIVE_SECONDS_GRACE_S without a step). `loader`: the training loader, when the caller
        knows it already."""
        enough = self.timeline.by_time.count if self.clock == "time" else self.steps
        if enough < LIVE_VERDICT_STEPS or self._runtime.started_s is None:
            return None
        if self.clock == "time" and self.elapsed_s < LIVE_SECONDS_GRACE_S:
            return None
        now = self._runtime.clock()
        if self._live is None or now - self._live[0] >= LIVE_VERDICT_PERIOD_S:
            diagnosis = diagnose(
                self.timeline, self.steps, self.elapsed_s, float(self._probes.limit.limit_bytes),
                first_pass_batches=self._steps.first_pass_batches, max_points=64,
                clock=self.clock, loader=self.training_loader() if loader is None else loader,
                worker_count=max(1, self._probes.tree.workers), max_rows=LIVE_VERDICT_ROWS,
            )
            self._live = (now, diagnosis)
        return self._live[1]

    def verdict_within(self, age_s: float) -> Diagnosis | None:
        """The live verdict if one was worked out in the last `age_s` seconds, working out none."""
        live = self._live
        return live[1] if live is not None and self._runtime.clock() - live[0] <= age_s else None

    @property
    def last_reading(self) -> dict[str, float] | None:
        """The last background reading by column (None before the first): any thread may ask."""
        last = self.timeline.by_time.last
        return None if last is None else dict(zip(COLUMNS, last))

    @property
    def latest_verdict(self) -> Diagnosis | None:
        """The live verdict last computed (on the sampler thread), computing none: any thread may ask."""
        live = self._live
        return None if live is None else live[1]

    def last_live_verdict(self) -> tuple[float, str] | None:
        """(seconds into the run, the verdict line) of the last live verdict, if one was computed."""
        live, started_s = self._live, self._runtime.started_s
        if live is None or started_s is None:
            return None
        return live[0] - started_s, short_verdict(live[1])

    def snapshot(self, report: Report | None = None) -> LiveSnapshot:
        """What the live figure draws now (`report`: the run's, once it ended)."""
        ranks = self.live_ranks()
        feeds = tuple(self.rank_feeds())
        remote: tuple[RankHistory, ...] = ()
        worst = None
        if feeds:
            from ..ranks.feed import rank_numbers
            from ..ranks.live import worst_live

            worst = worst_live(ranks)
            remote = self.remote_histories(skip=set(rank_numbers(feeds).values()))
        return LiveSnapshot(
            status=self.live_status(ranks), timeline=self.timeline, clock=self.clock,
            epoch_markers=tuple(self.epoch_markers()), guard_thresholds=tuple(self.guard_thresholds()),
            rank_feeds=feeds, worst_rank=worst, remote=remote, report=report if report is not None else self.report,
        )

    def live_status(self, ranks: tuple[RankLive, ...] | None = None) -> LiveStatus:
        """A snapshot for the live status line (`ranks`: `live_ranks()`, where the caller has it already)."""
        loader = self.training_loader()
        status = live_status(
            self.timeline, self.steps, self.elapsed_s, self._probes.tree.workers, self.live_verdict(loader),
            clock=self.clock, loader=loader, holder=self.live_holder(),
        )
        if self._guard is not None:
            status = dataclasses.replace(status, guard=self._guard.status_text(self.clock))
        ranks = self.live_ranks() if ranks is None else ranks
        if not ranks:
            return status
        from ..ranks.live import worst_line

        stepping = [r for r in ranks if r.clock != "time"]
        rank_clock = stepping[0].clock if stepping else "optimizer"
        steps = [r.steps for r in stepping if r.clock == rank_clock]
        return dataclasses.replace(
            status,
            # without steps of its own, this process's verdict is over its seconds: the ranks' says more
            verdict=status.verdict if self.clock != "time" else None,
            ranks=len(ranks), rank_steps=(min(steps), max(steps)) if steps else None, rank_clock=rank_clock,
            worst_rank=worst_line(ranks),
        )
