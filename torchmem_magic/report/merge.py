"""Per-rank reports into one: which rank is worst, one line per rank, imbalance (pure, stdlib only).

Averages hide the rank that leaks, so the report leads with the worst rank and keeps every rank's
own verdict and holders. The worst rank is the one that died first (a killed rank stopped the run),
else the one with the most severe verdict, then the fastest growth, then the highest peak memory.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from ..core.model import RamSummary, RankSummary, ReportData, Suspect, VerdictName, headline_peak, last_of_each_rank
from ..core.timeline import Timeline
from .rates import leak_rate
from ..render.advice.ranks import (
    attempt_line,
    clean_line,
    death_line,
    foreign_context_line,
    imbalance_line,
    of_rank,
    rank_line,
    stale_line,
    stopped_by_line,
)

R = TypeVar("R", bound=ReportData)
SEVERITY: dict[str, int] = {"clean": 0, "unknown": 1, "suspect": 2, "leak": 3}
IMBALANCE_SHARE = 0.10  # a rank's peak this much above the median is worth a line


def summary_of(
    report: ReportData,
    *,
    rank: int,
    pid: int,
    host: str,
    status: str | None = None,
    ended: str | None = None,
    last_seen_s: float = 0.0,
    stalled_s: float = 0.0,
    exited_s: float | None = None,
    local_rank: int | None = None,
    node: int | None = None,
    attempt: int | None = None,
    dropped: int = 0,
    cuda_contexts: tuple[dict[str, Any], ...] = (),
) -> RankSummary:
    """One rank's entry, from the report assembled from what it streamed."""
    return RankSummary(
        rank=rank, pid=pid, host=host, ram=report.ram, heap=report.heap, vram=report.vram,
        steps=report.steps, verdict=report.verdict, leak_kind=report.leak_kind, resource=report.resource,
        steps_to_exhaustion=report.steps_to_exhaustion,
        suspects=tuple(replace(s, rank=rank) for s in report.suspects),
        clock=report.clock,
        per_step_bytes=leak_rate(report, report.resource),
        epochs=report.epochs,
        status=status or report.status, ended=ended or _first_line(report.error if report.status == "error" else None),
        wall_s=report.wall_s, last_seen_s=last_seen_s, stalled_s=stalled_s,
        exited_s=exited_s,
        local_rank=local_rank, advice=report.advice, dropped_messages=dropped, timeline=report.timeline,
        cuda_contexts=cuda_contexts, node=node, attempt=attempt, extra=report.extra,
    )


def _first_line(error: str | None) -> str | None:
    """The exception that ended a rank's run, its first line ("MemoryGuardError: memwatch guard: ...")."""
    return None if not error else error.splitlines()[0]


def _peak_bytes(rank: RankSummary) -> float:
    return headline_peak(rank)[1]


#: how launchers stop the other ranks once one died
STOPPED_BY_LAUNCHER = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
ERROR_CHARS = 200  # what the report quotes of the exception that stopped a rank
RAM_FULL = 0.9  # a dead rank's RAM this near its limit: most likely the OOM killer
STALLED_S = 0.1  # a rank whose last messages brought no new steps for longer had stopped stepping


def first_to_die(ranks: Sequence[RankSummary]) -> RankSummary | None:
    """The rank whose death ended the run: one known to have died of something else than the
    launcher's stop signal; among those (or, if none, among all that were killed) the first whose
    process the watcher saw end."""
    killed = [r for r in ranks if r.status == "killed"]
    if not killed:
        return None
    witnessed = [r for r in killed if r.ended is not None and r.ended not in STOPPED_BY_LAUNCHER]
    return first_ended(witnessed or killed)


class Ending(Protocol):
    """What tells when a rank stopped: its final report's entry, or its live state mid-run."""

    @property
    def exited_s(self) -> float | None: ...
    @property
    def last_seen_s(self) -> float: ...
    @property
    def stalled_s(self) -> float: ...


E = TypeVar("E", bound=Ending)


def first_ended(ranks: Sequence[E]) -> E:
    """The first to end, by when its process ended where that was seen for each; else by their
    streams: one still making steps when it went silent (the others, waiting in a collective for
    it, had stopped stepping before their launcher stopped them), else the first to go silent.
    Streams are a quarter second apart, so silence is the weaker witness."""
    if all(r.exited_s is not None for r in ranks):
        return min(ranks, key=lambda r: r.exited_s or 0.0)
    return min(ranks, key=lambda r: (r.stalled_s > STALLED_S, r.last_seen_s))


def worst_of(ranks: Sequence[RankSummary]) -> RankSummary | None:
    """The rank a report leads with (of each rank's last process, where torchrun restarted ranks)."""
    ranks = last_of_each_rank(ranks)
    if not ranks:
        return None
    died = first_to_die(ranks)
    return max(ranks, key=lambda r: (
        r is died, SEVERITY.get(r.verdict, 0), r.per_step_bytes or 0.0, _peak_bytes(r), -r.rank,
    ))


def restart_lines(ranks: Sequence[RankSummary]) -> list[str]:
    """Where torchrun restarted ranks: how each earlier attempt ended (the rank whose death ended it)."""
    lines = []
    for attempt in sorted({r.attempt for r in ranks if r.attempt is not None} - {max_attempt(ranks)}):
        died = first_to_die([r for r in ranks if r.attempt == attempt])
        again = sorted({r.rank for r in ranks if r.attempt == attempt + 1})
        lines.append(attempt_line(attempt, died, again))
    return lines


def max_attempt(ranks: Sequence[Any]) -> int | None:
    """How many times torchrun restarted a rank at most (None: no rank was restarted)."""
    return max((r.attempt for r in ranks if r.attempt is not None), default=None)


def rank_lines(ranks: Sequence[RankSummary]) -> list[str]:
    """One line per rank that is not clean, one for the clean ones, deaths, restarts, and imbalance."""
    lines: list[str] = restart_lines(ranks)  # the attempts before torchrun's last restart: a line each
    current = last_of_each_rank(ranks)
    died = first_to_die(current)
    for rank in sorted(current, key=lambda r: (r is not died, -SEVERITY.get(r.verdict, 0), r.rank)):
        if rank.status == "killed":
            ram = rank.ram
            lines.append(death_line(rank, rank is died, bool(ram.limit_bytes) and ram.end_bytes >= RAM_FULL * ram.limit_bytes))
        elif rank.status == "stale":
            lines.append(stale_line(rank))
        elif rank.status == "error" and rank.ended and rank.ended not in STOPPED_BY_LAUNCHER:
            lines.append(stopped_by_line(rank, ERROR_CHARS))
        if rank.verdict != "clean":
            lines.append(rank_line(rank))
    for rank in ranks:
        for context in rank.cuda_contexts:
            if not context.get("own", True):
                lines.append(foreign_context_line(rank.rank, context))
    clean = sorted(r.rank for r in current if r.verdict == "clean")
    if clean:
        lines.append(clean_line(clean))
    top = above_median([(rank, _peak_bytes(rank)) for rank in current])
    if top is not None:
        rank, peak, median = top
        lines.append(imbalance_line(headline_peak(rank)[0].short, peak, f"rank {rank.rank}", median))
    return lines


K = TypeVar("K")


def above_median(peaks: Sequence[tuple[K, float]]) -> tuple[K, float, float] | None:
    """(whose, its peak, the median of all) for the highest peak, when it is more than IMBALANCE_SHARE
    above the median; None for fewer than two or none so far above."""
    if len(peaks) < 2:
        return None
    median = statistics.median(peak for _, peak in peaks)
    whose, peak = max(peaks, key=lambda p: p[1])
    if median > 0 and peak > (1 + IMBALANCE_SHARE) * median:
        return whose, peak, median
    return None


def job_ram(report: ReportData, ranks: Sequence[RankSummary]) -> RamSummary:
    """The RAM row of a watcher that made no steps itself: the job's processes (its process tree, the
    watcher's own process aside) from the first rank's start to the last rank's last message. Before
    and after those, the tree is the watcher alone, and its own memory is no figure of the job."""
    timeline = report.timeline
    if not isinstance(timeline, Timeline):  # a report read back from its file keeps the row it had
        return report.ram
    start_s = max(0.0, min(r.last_seen_s - r.wall_s for r in ranks))
    end_s = max(r.last_seen_s for r in ranks)
    columns = timeline.by_time.columns("t_s", "ram_bytes", "rss_bytes")
    job = [tree - (own if own == own else 0.0)  # NaN: the watcher's own RSS not read then
           for t, tree, own in zip(columns["t_s"], columns["ram_bytes"], columns["rss_bytes"])
           if start_s <= t <= end_s and tree == tree]
    if not job:
        return report.ram
    return replace(report.ram, start_bytes=int(job[0]), end_bytes=int(job[-1]), peak_bytes=int(max(job)),
                   per_step_bytes=None)


def with_ranks(report: R, ranks: tuple[RankSummary, ...] | None) -> R:
    """`report` (the watcher's own) with its ranks: their table, the worst rank, and the verdict of all.

    The watcher's own curves include the ranks' memory (they are its children), so when it made no
    steps itself its verdict is the ranks'; the step clock, the rate and the projection then come
    from the worst rank, and every rank's holders join the suspects (each with its rank)."""
    if not ranks:
        return report
    ranks = tuple(sorted(ranks, key=lambda r: r.rank))
    worst = worst_of(ranks)
    assert worst is not None
    own_counts = report.clock != "time" and report.steps > 0
    verdict: VerdictName = worst.verdict
    if own_counts and SEVERITY[report.verdict] >= SEVERITY[worst.verdict]:
        verdict = report.verdict
    from_worst = verdict == worst.verdict and (not own_counts or SEVERITY[worst.verdict] > SEVERITY[report.verdict])
    suspects: list[Suspect] = list(report.suspects) if own_counts else []
    for rank in sorted(ranks, key=lambda r: r is not worst):
        suspects.extend(rank.suspects)
    changes: dict[str, object] = {
        "ranks": ranks,
        "worst_rank": worst.rank,
        "verdict": verdict,
        "suspects": tuple(suspects),
        "advice": (*rank_lines(ranks), *(of_rank(worst.rank, a) for a in worst.advice[:3] if from_worst),
                   *(report.advice if own_counts else ())),
    }
    if from_worst:
        changes.update(
            leak_kind=worst.leak_kind, resource=worst.resource, steps_to_exhaustion=worst.steps_to_exhaustion,
            seconds_to_exhaustion=None, per_step_error_bytes=None, sporadic_steps=(), per_epoch_bytes=None,
        )
    if not own_counts:  # steps are the worst rank's; the watcher's own rates were per second: dropped
        changes.update(
            steps=worst.steps, clock=worst.clock, epochs=worst.epochs, optimizer_steps=worst.steps if worst.clock == "optimizer" else 0,
            ram=job_ram(report, ranks),
            heap=None,  # the watcher's own heap: the ranks' are in their entries
            shm=None if report.shm is None else replace(report.shm, per_step_bytes=None),
            vram=None if report.vram is None else replace(report.vram, per_step_bytes=None),
            extra=tuple(replace(summary, per_step_bytes=None) for summary in report.extra),
        )
    return replace(report, **changes)  # type: ignore[arg-type]  # (typed keys would repeat the dataclass)
