"""From what a run gathered to its verdict, its live status line and its Report (pure).

The session gathers (probes, hooks, scans) and hands plain inputs here: the timeline, counts,
limits, device stats, suspects, how DataLoader workers ended, the exception that ended the block.
Everything that decides or assembles lives here, so it is tested on synthetic inputs in
milliseconds, without a running session.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from ..analysis.forensics import death_from_exits, explain_worker_death, parse_worker_death, shm_warning
from ..analysis.holder_share import HolderMemory, with_growth_shares
from ..analysis.holders import fuse, without_ruled_out
from ..analysis.holder_trends import with_trends, without_flat
from ..core.model import (
    Clock,
    RamSummary,
    ShmSummary,
    Status,
    VramSummary,
)
from ..core import resources
from ..core.ended import Ended
from ..core.options import DEFAULT_SHM_PATH
from .merge import with_ranks
from ..core.resources import HEAP, RAM, SHM
from ..render.advice import advice_lines, worded
from ..render.advice.sources import source_error_advice
from ..render.results import Report
from ..core.slopes import new_readings
from ..core.timeline import Timeline
from ..analysis.findings import Diagnosis, Note, Series
from ..analysis.phases import phase_notes
from ..analysis.verdict import decide
from .evidence import RunEvidence
from .rates import RATE_COLUMNS, per_step, rates_of
from .summaries import summaries, vram_headroom_bytes

#: rows of each series, and Theil–Sen points, that a rank's verdict in a report of many ranks judges at
#: most: the watcher judges every rank at the block's end on one thread, and a full timeline (~1,800
#: step rows) costs ~25 ms of CPU a rank, seconds for 64 ranks; thinned to this, ~5 ms. Over the
#: detector's shapes (a slow or fast leak, a staircase, sporadic jumps, a warm-up, a sawtooth, RSS creep,
#: noise) the thinned verdict is the full one, a leak's rate within a few percent
RANK_VERDICT_ROWS = 400
RANK_VERDICT_POINTS = 100
#: the Theil–Sen points of a run's own final verdict (its pairwise slopes: ~points²/2)
FINAL_VERDICT_POINTS = 200


# ----------------------------------------------------------------------------- the verdict


def training_loader(clock: Clock, credits: dict[tuple[Clock, int], int], passes: dict[int, int]) -> int | None:
    """The loader whose batches carry the steps of `clock` (its passes are the epochs; a validation
    loader iterated inside an epoch is not): the one most steps were made on, else the one with the
    most passes; None without any loader."""
    carried = {loader: n for (c, loader), n in credits.items() if c == clock}
    if carried:
        return max(carried, key=lambda loader: (carried[loader], -loader))
    if passes:
        return max(passes, key=lambda loader: (passes[loader], -loader))
    return None


def epoch_starts(timeline: Timeline, clock: Clock, loader: int | None) -> list[float]:
    """The step (of `clock`) or second at which each epoch began."""
    return [m.t_s if clock == "time" else float(m.step_of(clock)) for m in timeline.epochs_of(loader)]


def first_pass_steps(
    timeline: Timeline, clock: Clock, loader: int | None, first_pass_batches: int | None
) -> tuple[int, int] | None:
    """(first step, last step) of the first pass of a multi-worker DataLoader, if known."""
    epochs = timeline.epochs_of(loader)
    if first_pass_batches is None or not epochs or clock == "time":
        return None
    start = epochs[0].step_of(clock)
    return start + 1, start + first_pass_batches


def diagnose(
    timeline: Timeline,
    steps: int,
    elapsed_s: float,
    ram_limit_bytes: float,
    vram_limit_bytes: float | None = None,
    shm_limit_bytes: float | None = None,
    first_pass_batches: int | None = None,
    max_points: int = FINAL_VERDICT_POINTS,
    clock: Clock = "optimizer",
    loader: int | None = None,
    worker_count: int = 1,
    workers_persistent: bool = False,
    max_rows: int | None = None,
    ends_after_block: bool = False,
) -> Diagnosis:
    """The leak detector over every resource the run measured, against the steps of `clock`
    (the step-aligned series), or against seconds when the loop had no step clock at all.

    `max_rows`: judge at most this many rows of the series, thinned evenly (None: all of them); the
    live verdict's cost then stays the same however full the timeline is. `ends_after_block`: the last
    step-aligned row is the reading after the block (the final report's timeline)."""
    source, x_name = (timeline.by_time, "t_s") if clock == "time" else (timeline.by_step, "step")
    judged = [r for r in resources.RESOURCES if r.judged]
    columns = source.columns(x_name, *(r.column for r in judged), at_most=max_rows)
    step_x = columns[x_name]
    limits = {"ram": ram_limit_bytes, "device": vram_limit_bytes, "shm": shm_limit_bytes}
    heap, ram = columns[HEAP.column], columns[RAM.column]
    # the OOM killer counts resident memory: heap growth exhausts the headroom RSS has left
    rss_above_heap = ram[-1] - heap[-1] if len(heap) and not math.isnan(heap[-1]) else 0.0
    series = []
    for resource in judged:
        limit = None if resource.limit is None else limits[resource.limit]
        if resource.key == HEAP.key:
            limit = ram_limit_bytes - rss_above_heap
        xs: Sequence[float] = step_x
        values: Sequence[float] = columns[resource.column]
        if resource.sparse:  # from its first reading on: workers appearing is not growth
            xs, values = new_readings(xs, values)
            if not xs:
                continue
        series.append(Series(resource.key, xs, values, limit))
    if clock == "time":
        steps_per_s: float | None = 1.0  # a step is a second
    else:
        steps_per_s = steps / elapsed_s if elapsed_s > 0 else None
    return decide(
        [s for s in series if any(not math.isnan(v) for v in s.values)],
        epoch_steps=[e + (0.0 if clock == "time" else 1.0) for e in epoch_starts(timeline, clock, loader)],
        steps_per_s=steps_per_s,
        max_points=max_points,
        first_pass_steps=first_pass_steps(timeline, clock, loader, first_pass_batches),
        clock=clock,
        worker_count=worker_count,
        workers_persistent=workers_persistent,
        ends_after_block=ends_after_block,
    )


# ----------------------------------------------------------------------------- the report


def status_of(ended: Ended | None) -> Status:
    if ended is None:
        return "ok"
    return "interrupted" if ended.interrupted else "error"


def worker_death_advice(evidence: RunEvidence, ram: RamSummary, shm: ShmSummary | None) -> list[str]:
    """If a DataLoader worker died: the likely cause, from how it ended and the curves before it.

    Decided from the workers' exit statuses; the exception's text is only read when no status is
    known (workers started before the run, whose PIDs the hook never saw)."""
    death = death_from_exits(evidence.worker_exits)
    if death is None and evidence.ended is not None:
        death = parse_worker_death(evidence.ended.message)
    if death is None:
        return []
    by_time = evidence.timeline.by_time
    ram_before = [v for v in by_time.column(RAM.column)[-5:] if not math.isnan(v)]  # the last readings
    shm_before = [v for v in by_time.column(SHM.column)[-5:] if not math.isnan(v)]
    return list(advice_lines(explain_worker_death(
        death,
        ram_bytes=max(ram_before, default=float(ram.end_bytes)),
        ram_limit_bytes=float(ram.limit_bytes),
        shm_used_bytes=max(shm_before) if shm_before else None,
        shm_total_bytes=None if shm is None else float(shm.limit_bytes),
        limit_source=ram.limit_source,
        shm_path=evidence.shm.path if evidence.shm is not None else DEFAULT_SHM_PATH,
    )))


def _with_rates(summarised: dict[str, Any], diagnosis: Diagnosis, timeline: Timeline, clock: Clock) -> dict[str, Any]:
    """The summaries with their growth per step, for each resource that can leak: the verdict's own
    rate for the resource it names, so the table quotes the verdict's figure."""
    rates = rates_of(diagnosis)
    if diagnosis.resource is not None and diagnosis.per_step_bytes is not None:
        rates[diagnosis.resource] = diagnosis.per_step_bytes
    return {
        name: replace(summary, per_step_bytes=per_step(rates, timeline, name, clock))
        if summary is not None and name in RATE_COLUMNS else summary
        for name, summary in summarised.items()
    }


def _curves(
    evidence: RunEvidence, vram: VramSummary | None, shm: ShmSummary | None, max_rows: int | None, max_points: int
) -> Diagnosis:
    """The curves' verdict over the whole run (the reading after the block ends its series)."""
    return diagnose(
        evidence.timeline,
        evidence.steps,
        evidence.wall_s,
        ram_limit_bytes=float(evidence.ram_limit_bytes),
        vram_limit_bytes=None if vram is None else vram_headroom_bytes(vram),
        shm_limit_bytes=None if shm is None else shm.limit_bytes,
        first_pass_batches=evidence.first_pass_batches,
        clock=evidence.clock,
        loader=evidence.training_loader,
        worker_count=1 if evidence.workers is None else evidence.workers.max_count,
        workers_persistent=evidence.workers is not None and evidence.workers.pids_seen <= evidence.workers.max_count,
        ends_after_block=True,
        max_rows=max_rows,
        max_points=max_points,
    )


def _shm_warning(shm: ShmSummary | None) -> list[str]:
    """A /dev/shm that came close to full, where no worker died of it."""
    warning = None if shm is None else shm_warning(shm.peak_bytes, shm.limit_bytes, shm.path)
    return [worded(warning)] if warning else []


def holder_memory(evidence: RunEvidence) -> HolderMemory:
    """Where each holder's tensors mostly live, where that is not the heap: the curve it is judged against."""
    return {**{name: "shm" for name in evidence.holders_in_shared_memory},
            **{name: "vram" for name in evidence.holders_on_accelerator}}


def _phase_notes(evidence: RunEvidence, diagnosis: Diagnosis) -> list[Note]:
    """Where the leak grows, when most of it came in the passes of a phase a trainer marked (validation)."""
    if not evidence.phase_passes or diagnosis.resource is None:
        return []
    try:
        column = resources.by_key(diagnosis.resource).column
    except KeyError:
        return []
    values = [v for v in evidence.timeline.by_step.columns(column)[column] if not math.isnan(v)]
    run_growth = values[-1] - values[0] if len(values) > 1 else 0.0
    return phase_notes(evidence.phase_passes, diagnosis.verdict, diagnosis.resource, column, run_growth)


def assemble_report(
    evidence: RunEvidence, max_rows: int | None = None, max_points: int = FINAL_VERDICT_POINTS
) -> Report:
    """The Report of a run: summaries, the verdict and its advice, suspects, worker deaths.

    `max_rows`, `max_points`: what the verdict judges at most (`diagnose`); None judges every row, as a
    run's own report does. A report of many ranks bounds them (RANK_VERDICT_ROWS)."""
    timeline, ended = evidence.timeline, evidence.ended
    by_time = timeline.by_time
    summarised = summaries(evidence)
    ram, vram, shm = summarised["ram"], summarised["vram"], summarised["shm"]
    found = () if evidence.holder_search is None else evidence.holder_search.found
    curves = _curves(evidence, vram, shm, max_rows, max_points)
    memory = holder_memory(evidence)
    suspects = with_growth_shares(with_trends((*evidence.suspects, *found), evidence.holder_series), curves, memory)
    steps_per_s = 1.0 if evidence.clock == "time" else (evidence.steps / evidence.wall_s if evidence.wall_s > 0 else None)
    diagnosis = fuse(
        curves, suspects, evidence.clock, float(ram.limit_bytes - ram.end_bytes), steps_per_s,
        tracked=bool(evidence.holder_series), memory=memory,
        device_headroom_bytes=None if vram is None else vram_headroom_bytes(vram), searched=evidence.holder_search,
        shm_headroom_bytes=None if shm is None else float(shm.limit_bytes - shm.end_bytes),
    )
    death_advice = worker_death_advice(evidence, ram, shm) or _shm_warning(shm)
    summarised = _with_rates(summarised, diagnosis, timeline, evidence.clock)
    own = {f.name for f in fields(Report)}
    report = Report(
        status=status_of(ended),
        wall_s=evidence.wall_s,
        samples=by_time.count,
        interval_s=evidence.interval_s,
        steps=evidence.steps,
        epochs=timeline.epoch_count(evidence.training_loader),
        **{name: summary for name, summary in summarised.items() if name in own},
        extra=tuple(summary for name, summary in summarised.items() if name not in own and summary is not None),
        verdict=diagnosis.verdict,
        leak_kind=diagnosis.leak_kind,
        resource=diagnosis.resource,
        steps_to_exhaustion=diagnosis.steps_to_exhaustion,
        suspects=without_flat(without_ruled_out(suspects, curves, memory)),
        advice=(*evidence.guard_advice, *death_advice, *advice_lines(diagnosis.advice[:1]),
                *advice_lines(_phase_notes(evidence, diagnosis)), *advice_lines(diagnosis.advice[1:]),
                *source_error_advice(evidence.source_errors)),
        seconds_to_exhaustion=diagnosis.seconds_to_exhaustion,
        per_step_error_bytes=diagnosis.per_step_error_bytes,
        sporadic_steps=diagnosis.sporadic_steps,
        error=None if ended is None else ended.line(),
        source_errors=evidence.source_errors,
        clock=evidence.clock,
        optimizer_steps=evidence.steps if evidence.optimizer_steps is None else evidence.optimizer_steps,
        per_epoch_bytes=diagnosis.per_epoch_bytes,
        live_suspects_at_step=evidence.live_suspects_at_step,
        timeline=timeline,
    )
    return with_ranks(report, evidence.ranks)
