"""Each rank's verdict while the run goes, and which rank is the worst (from the feeds alone: no I/O, no torch).

A leak on one rank of many is worth seeing while the run can still be stopped, so the status line
names the worst rank as it forms. A rank's live verdict is the detector the final report uses, over
what the rank streamed so far; it is recomputed at most once a second per rank, since ranks stream
four times a second and the detector is not free (~2.5 ms a rank on a full timeline), and at most
`MAX_REJUDGED_PER_CALL` ranks a call, the longest unjudged first: with 64 ranks, rejudging all of them
at once would cost the sampler thread a sixth of a second at every redraw. The worst rank is chosen as at the end
(`merge.worst_of`): a rank that died, then the most severe verdict, the fastest growth, the peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from ..analysis.holder_trends import holder_trend, top_holder, top_trend
from ..core.model import Clock, RankSummary, VerdictName, headline_peak, resource_summary
from ..report.assemble import diagnose
from ..report.live_status import LIVE_VERDICT_ROWS, LIVE_VERDICT_STEPS
from ..core import resources
from ..core.resources import headline_rows
from ..core.units import format_bytes, rate_unit
from .feed import attempt_numbers, died_of, rank_numbers
from ..stream.feed import RankFeed
from ..report.merge import SEVERITY, STOPPED_BY_LAUNCHER, first_ended

LIVE_RANK_PERIOD_S = 1.0
#: ranks whose verdict is rejudged in one call (a rank new, or renumbered, is judged whatever the count)
MAX_REJUDGED_PER_CALL = 8
LIVE_MAX_POINTS = 64  # the detector's pairwise slopes over at most this many points: cheap enough per rank


@dataclass(frozen=True)
class RankLive:
    """One rank's state as the status line judges it mid-run."""

    rank: int
    pid: int
    verdict: VerdictName  # "unknown" until the rank made LIVE_VERDICT_STEPS steps
    resource: str | None = None
    per_step_bytes: float | None = None
    clock: Clock = "optimizer"
    steps: int = 0
    peak_bytes: float = 0.0  # its highest memory reading (VRAM allocated when it has CUDA, else RAM)
    holder: str | None = None  # its fastest-growing holder, once one grows
    died: str | None = None  # how it stopped without finishing ("SIGKILL", "exit code 1", "stopped")
    last_seen_s: float = 0.0
    stalled_s: float = 0.0  # how long it had made no step when its last message came
    exited_s: float | None = None  # the watcher's seconds when its process ended, where that was seen
    host: str = ""
    node: int | None = None  # the launcher's node rank, in a multi-node job
    via: str = "stream"  # "store": another node's rank, as its last summary in the job's store says
    stale: bool = False  # another node's rank whose summaries stopped coming, with nothing to say why
    attempt: int | None = None  # where torchrun restarted the rank: which of its processes
    readings: tuple[tuple[str, float], ...] = ()  # (resource key, its last reading) of each resource streamed


def _peak_bytes(feed: RankFeed) -> float:
    """As `headline_peak` tells a finished rank's: its accelerator's memory where it has one, else RAM."""
    series = feed.timeline.by_time
    for row in headline_rows():
        peak = series.max(row.column)
        if not math.isnan(peak) and peak > 0:
            return peak
    return 0.0


def _readings(feed: RankFeed) -> tuple[tuple[str, float], ...]:
    """The last reading of each resource the rank streamed, by its key (what a dashboard gauges)."""
    series = feed.timeline.by_time
    readings = ((r.key, series.last_value(r.column)) for r in resources.RESOURCES if r.kind != "count")
    return tuple((key, value) for key, value in readings if not math.isnan(value))


def _growing_holder(feed: RankFeed) -> str | None:
    top = top_trend(holder_trend(name, points) for name, points in feed.holder_series.items())
    return None if top is None else top.name


def _died(feed: RankFeed) -> str | None:
    """How a rank that stopped streaming without its final message ended (None: it is running or finished)."""
    if feed.final is not None or feed.exit is None or not feed.exit.abnormal:
        return None  # an exit code 0 without the final message yet: it is finishing
    return died_of(feed)


def judge_rank(feed: RankFeed, rank: int, attempt: int | None = None) -> RankLive:
    """The live verdict of one rank from what it streamed so far."""
    clock: Clock = feed.clock if feed.clock in ("optimizer", "backward", "batch", "forward", "time") else "time"  # type: ignore[assignment]
    enough = feed.timeline.by_time.count if clock == "time" else feed.steps
    verdict: VerdictName = "unknown"
    resource, rate = None, None
    if enough >= LIVE_VERDICT_STEPS:
        diagnosis = diagnose(
            feed.timeline, feed.steps, feed.elapsed_s, float(feed.ram_limit_bytes),
            max_points=LIVE_MAX_POINTS, clock=clock, max_rows=LIVE_VERDICT_ROWS,
        )
        verdict, resource = diagnosis.verdict, diagnosis.resource
        rate = diagnosis.per_step_bytes if diagnosis.verdict in ("leak", "suspect") else None
    return RankLive(
        rank=rank, pid=feed.pid, verdict=verdict, resource=resource, per_step_bytes=rate, clock=clock,
        steps=feed.steps, peak_bytes=_peak_bytes(feed), holder=_growing_holder(feed), died=_died(feed),
        last_seen_s=feed.last_seen_s, stalled_s=feed.last_seen_s - feed.progress_s, exited_s=feed.exited_s,
        host=feed.host, node=None if feed.job is None else feed.job.get("node"), attempt=attempt,
        readings=_readings(feed),
    )


def from_summary(summary: RankSummary) -> RankLive:
    """A finished rank, as the final report judged it (so the last status line agrees with the report)."""
    top = top_holder(summary.suspects, or_largest=summary.verdict == "leak")
    peak = headline_peak(summary)[1]
    died = (summary.ended or "stopped") if summary.status == "killed" else None
    return RankLive(
        rank=summary.rank, pid=summary.pid, verdict=summary.verdict, resource=summary.resource,
        per_step_bytes=summary.per_step_bytes, clock=summary.clock, steps=summary.steps, peak_bytes=float(peak),
        holder=None if top is None else top.name, died=died, last_seen_s=summary.last_seen_s,
        stalled_s=summary.stalled_s, exited_s=summary.exited_s, host=summary.host, node=summary.node,
        via=summary.via, stale=summary.status == "stale", attempt=summary.attempt,
        readings=_last_readings(summary),
    )


def _last_readings(summary: RankSummary) -> tuple[tuple[str, float], ...]:
    """A finished rank's last reading of each resource its entry summarises (by the resource's key)."""
    readings = ((r.key, getattr(resource_summary(summary, r.summary), "end_bytes", None))
                for r in resources.RESOURCES if r.summary == r.key)
    return tuple((key, float(value)) for key, value in readings if value is not None)


def worst_first(ranks: Sequence[RankLive]) -> list[RankLive]:
    """The ranks, the worst first: the first to die of something else than its launcher's stop signal
    (else the first to die), then the other dead, then by the most severe verdict, fastest growth,
    highest peak; ties by rank number."""
    dead = [r for r in ranks if r.died is not None]
    witnessed = [r for r in dead if r.died not in STOPPED_BY_LAUNCHER]
    first_dead = first_ended(witnessed or dead) if dead else None
    return sorted(ranks, key=lambda r: (
        r is not first_dead, r.died is None, -SEVERITY.get(r.verdict, 0), -(r.per_step_bytes or 0.0), -r.peak_bytes,
        r.rank,
    ))


def worst_live(ranks: Sequence[RankLive]) -> RankLive | None:
    """The rank the status line names (the first of `worst_first`)."""
    return worst_first(ranks)[0] if ranks else None


def worst_line(ranks: Sequence[RankLive]) -> str | None:
    """'worst rank 1: leak +67.8 KiB/step in heap (outputs)'; 'ranks clean so far'; None before any verdict."""
    worst = worst_live(ranks)
    if worst is None:
        return None
    if worst.died is not None:
        return f"rank {worst.rank} stopped ({worst.died}) at {worst.steps:,} {rate_unit(worst.clock)}s"
    if worst.verdict == "unknown":
        return None
    if worst.verdict == "clean":
        return "ranks clean so far" if len(ranks) > 1 else f"rank {worst.rank} clean so far"
    line = f"worst rank {worst.rank}: {worst.verdict}"
    if worst.per_step_bytes is not None:
        line += f" {format_bytes(worst.per_step_bytes, signed=True)}/{rate_unit(worst.clock)}"
        if worst.resource:
            line += f" in {worst.resource}"
    if worst.holder:
        line += f" ({worst.holder})"
    return line


class LiveRanks:
    """Each rank's live verdict, recomputed at most once every `period_s` per rank and for at most
    `max_per_call` ranks a call, the stalest first (sampler thread)."""

    def __init__(
        self, clock: Callable[[], float], period_s: float = LIVE_RANK_PERIOD_S, max_per_call: int = MAX_REJUDGED_PER_CALL
    ) -> None:
        self._clock = clock
        self._period_s = period_s
        self._max_per_call = max_per_call
        self._cache: dict[int, tuple[float, RankLive]] = {}  # pid -> (when, verdict)
        self.judged = 0  # detector runs so far (what the period and the cap bound)

    def judge(self, feeds: Iterable[RankFeed]) -> tuple[RankLive, ...]:
        feeds = list(feeds)
        numbers = rank_numbers(feeds)
        now = self._clock()
        cache = self._cache
        unjudged = [f for f in feeds if f.pid not in cache or cache[f.pid][1].rank != numbers[f.pid]]
        stale = sorted((f for f in feeds if f.pid in cache and now - cache[f.pid][0] >= self._period_s
                        and cache[f.pid][1].rank == numbers[f.pid]), key=lambda f: cache[f.pid][0])
        for feed in [*unjudged, *stale[: max(0, self._max_per_call - len(unjudged))]]:
            self.judged += 1
            cache[feed.pid] = (now, judge_rank(feed, numbers[feed.pid]))
        attempts = attempt_numbers(feeds, numbers)  # a restart's processes of one rank: 0, 1, ...
        judged = (cache[f.pid][1] if attempts[f.pid] is None else replace(cache[f.pid][1], attempt=attempts[f.pid])
                  for f in feeds)
        return tuple(sorted(judged, key=lambda r: (r.rank, r.attempt or 0)))
