"""Leak verdicts from step-aligned memory series (pure: no I/O, no torch, no IPython).

For each resource the series is memory after each sampled step (of the loop's step clock) against the step index.

1. Warm-up: growth concentrated at the start (the optimizer's state at step 1, caches that fill
   over 5 or 50 steps) is cut off when a regular rest (flat or a steady leak, no jumps) follows
   for at least two thirds of the run; where later jumps make the rest irregular, only leading
   jumps far faster than the rest's own growth are.
2. Per-iteration leak: a Theil–Sen slope (median of pairwise slopes) after warm-up, significant
   against the series' own noise (a robust residual scale) *and* with a total growth that noise
   alone cannot make (`min_total_bytes` and `fit_noise_scales` noise scales).
3. Per-epoch leak: most of the growth happens across epoch boundaries (a validation pass that
   keeps its outputs) while the steps inside an epoch are flat: a staircase.
4. Sporadic leak: a few steps, spread over the run, carry the growth as jumps that never come
   back; they are named. A jump is judged against its step gap (thinned sampling reads every k-th
   step, and a steady leak grows k times its rate between two samples: that is no jump).
5. Not leaks: plateaus, sawtooth temporaries (they come back), CUDA reserved growing while
   allocated is flat (the caching allocator; said as a note).

The maths on one series (robust slopes, noise, jumps, the warm-up, a release at the end) is in
`slopes.py`; the shapes of growth in `shape_rules.py`, the rules that explain growth away in
`explaining_rules.py`, their thresholds and switches in `verdict_table.py`; here one resource is judged
and the run's leaking resource chosen and worded.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core import resources
from ..core.model import VerdictName
from ..core.slopes import changes_of, growth_stopped, released_at_the_end, warmup_length
from .epochs import closes_last_epoch, crossing_epochs
from .explaining_rules import EXPLAINING_RULES, Evidence, Explained
from .findings import Diagnosis, Note, ResourceFinding, Series, note, readings_of
from .shape_rules import SHAPE_RULES, Shape, fit_line
from .verdict_table import MIB, Thresholds, table

__all__ = ["MIB", "RESOURCE_ORDER", "analyse", "decide"]

#: priority when several resources leak: heap in use is retention itself; RSS may only be fragmentation
RESOURCE_ORDER = resources.leak_order(resources.RESOURCES)
#: the resources for which a reading at the limit means the run ran out of it
_FATAL_WHEN_FULL = frozenset(r.key for r in resources.RESOURCES if r.full_is_fatal)
#: what a resource's leak is reported as, where that is another resource (reserved VRAM as VRAM)
_REPORTED_AS = {r.key: r.reported for r in resources.RESOURCES}


def _ran_out_at(xs: Sequence[float], ys: Sequence[float], limit_bytes: float | None, t: Thresholds) -> int | None:
    """Index of the first reading at the limit, when the series filled up to it in this run and was still
    there at the end; else None.

    Past that point the series cannot grow: a full /dev/shm mount stays full until the workers die of
    it. Filled within a few steps (workers running ahead of a slow loop), it reads as a warm-up and a
    plateau, so it is judged by how it filled, not by a fit."""
    if not limit_bytes or len(ys) < 2 or ys[-1] < t.full_share * limit_bytes:
        return None
    full = next(i for i, y in enumerate(ys) if y >= t.full_share * limit_bytes)
    if full == 0 or min(ys[: full + 1]) > t.filled_from_share * limit_bytes or xs[full] <= xs[0]:
        return None
    return full


def _ran_out(series: Series, xs: Sequence[float], ys: Sequence[float], t: Thresholds) -> ResourceFinding | None:
    """A resource that filled up to its limit in the run (where that is fatal): a leak at the rate it filled,
    whatever a fit would say of the plateau at the limit."""
    full = _ran_out_at(xs, ys, series.limit_bytes, t) if series.resource in _FATAL_WHEN_FULL else None
    if full is None:
        return None
    start = min(range(full + 1), key=lambda i: ys[i])
    fill = ys[full] - ys[start]
    rate = fill / max(xs[full] - xs[start], 1.0)
    return ResourceFinding(
        series.resource, "leak", "per-iteration", rate, None, 0, 0.0, fill, steps_to_exhaustion=0.0,
        net_growth_bytes=fill, full_at_step=xs[full],
    )


def analyse(
    series: Series, epoch_steps: Sequence[float] = (), max_points: int = 200, ends_after_block: bool = False
) -> ResourceFinding:
    """The verdict for one resource (`max_points` bounds the Theil–Sen cost: ~n²/2 slopes): ran out at its
    limit, else the first of SHAPE_RULES switched on that finds growth, else clean.

    `ends_after_block`: the last reading was taken after the block, so its interval also holds what ran
    after the last step."""
    xs, ys = readings_of(series)
    in_force = table()
    t = in_force.thresholds
    ran_out = _ran_out(series, xs, ys, t) if in_force.on("ran-out") else None
    if ran_out is not None:
        return ran_out
    released = released_at_the_end(ys)
    if released:
        xs, ys = xs[:-1], ys[:-1]
    whole = changes_of(xs, ys) if len(ys) > t.min_steps else None
    warmup = warmup_length(xs, ys, whole) if whole is not None else 0
    if len(ys) - warmup < t.min_steps:
        # a fill cut as warm-up, then a flat rest read too few times for a verdict of its own: growth
        # that stopped is still clean, judged on the whole run
        stopped = whole is not None and in_force.on("filled-then-flat") and growth_stopped(
            xs, ys, whole.noise, t.flat_of_rise, t.late_min_readings, t.level_after_over_before)
        return ResourceFinding(series.resource, "clean" if stopped else "unknown", None, 0.0 if stopped else None,
                               None, warmup, whole.noise if stopped and whole else 0.0, 0.0, released_bytes=released)
    xs, ys = xs[warmup:], ys[warmup:]
    changes = whole if whole is not None and warmup == 0 else changes_of(xs, ys)  # once, where nothing was cut
    boundary = crossing_epochs(xs, epoch_steps)
    if ends_after_block and not released and epoch_steps and closes_last_epoch(ys, boundary):
        boundary.add(len(ys) - 1)
    shape = Shape(series, xs, ys, warmup, changes.noise, fit_line(xs, ys, changes.noise, max_points, t),
                  list(changes.jumps), boundary, released, tuple(epoch_steps), max_points)
    found = (rule(shape, t) for name, rule in SHAPE_RULES if in_force.on(name))
    return next((f for f in found if f is not None), None) or shape.finding("clean", None)


def _leaking(findings: dict[str, ResourceFinding], explained: Sequence[Explained]) -> ResourceFinding | None:
    """The leaking resource: the first leak (else suspect) in RESOURCE_ORDER that no rule explained; a rule's
    finding instead of one (the workers still copying) where it says more."""
    not_leaks = frozenset().union(*(x.not_leaks for x in explained))
    chosen = None
    for name in RESOURCE_ORDER:
        f = findings.get(name)
        if f is None or f.verdict not in ("leak", "suspect") or name in not_leaks:
            continue
        if chosen is None or (chosen.verdict == "suspect" and f.verdict == "leak"):
            chosen = f
    for instead in (x.instead for x in explained if x.instead is not None):
        if chosen is None or (chosen.verdict == "suspect" and instead.verdict == "leak"):
            chosen = instead
    return chosen


def _too_few_steps(findings: Sequence[ResourceFinding], clock: str) -> Note:
    warm = max((f.warmup_steps for f in findings), default=0)
    return note("too few steps", needs=table().thresholds.min_steps + warm, clock=clock)


def _headline(chosen: ResourceFinding, clock: str) -> Note:
    """The leak, its kind, resource and rate (a sporadic leak's steps, a per-epoch leak's epochs)."""
    return note("leak", leak_kind=chosen.leak_kind, resource=chosen.resource, per_step_bytes=chosen.per_step_bytes or 0,
                error_bytes=chosen.per_step_error_bytes, per_epoch_bytes=chosen.per_epoch_bytes,
                sporadic_steps=chosen.sporadic_steps, started_at_step=chosen.started_at_step, clock=clock)


def _when_it_runs_out(chosen: ResourceFinding, clock: str, seconds: float | None) -> list[Note]:
    """When the leaking resource runs out (or since when it was full), and what the block's end gave back."""
    rate, notes = chosen.per_step_bytes or 0, []
    if chosen.full_at_step is not None:
        notes.append(note("full since", resource=chosen.resource, full_at_step=chosen.full_at_step,
                          per_step_bytes=rate, clock=clock))
    elif chosen.steps_to_exhaustion is not None:
        notes.append(note("runs out in", resource=chosen.resource, per_step_bytes=rate,
                          steps=chosen.steps_to_exhaustion, seconds=seconds if clock != "time" else None, clock=clock))
    if chosen.released_bytes:
        notes.append(note("released at the end", released_bytes=chosen.released_bytes))
    return notes


def decide(
    series: Sequence[Series],
    epoch_steps: Sequence[float] = (),
    steps_per_s: float | None = None,
    max_points: int = 200,
    first_pass_steps: tuple[int, int] | None = None,
    clock: str = "optimizer",
    worker_count: int = 1,
    workers_persistent: bool = False,
    ends_after_block: bool = False,
) -> Diagnosis:
    """The run's verdict from every resource's series: each judged alone (`analyse`), the EXPLAINING_RULES
    applied in order, then the leaking resource chosen and worded.

    Args:
        series: step-aligned series ("heap", "ram" (process tree), "rss" (kernel alone), "workers", "vram",
            "vram_reserved", "shm"). Only heap, vram, ram and shm can be the leaking resource.
        epoch_steps: step counts at which each epoch (DataLoader iterator) started.
        steps_per_s: to turn steps until exhaustion into wall-clock time.
        first_pass_steps: (first, last) step of a multi-worker DataLoader's first pass, to project
            where copy-on-access growth will stop.
        clock: what a step is ("optimizer", "batch", ..., "time": x is seconds), for the wording.
        worker_count: the most DataLoader workers seen at once (their first touches are bounded by their number).
        workers_persistent: the same workers ran through every epoch (no more of them seen than at once): their
            growth is judged over the whole run, not epoch by epoch (an epoch may hold one PSS reading or none).
        ends_after_block: the last row is the reading after the block (the final report), not a step's.
    """
    by_resource = {s.resource: s for s in series}
    findings = {name: analyse(s, epoch_steps, max_points, ends_after_block) for name, s in by_resource.items()}
    evidence = Evidence(by_resource, findings, () if workers_persistent else epoch_steps, worker_count, first_pass_steps)
    in_force = table()
    explained = [x for x in (rule(evidence, in_force.thresholds) for name, rule in EXPLAINING_RULES if in_force.on(name))
                 if x is not None]
    advice = [x.note for x in explained if x.note is not None]
    chosen = _leaking(findings, explained)
    if chosen is None:
        relevant = [f for f in findings.values() if f.resource in RESOURCE_ORDER]
        verdict: VerdictName = "unknown" if all(f.verdict == "unknown" for f in relevant) else "clean"
        if verdict == "unknown":  # also when no step was sampled at all
            advice.insert(0, _too_few_steps(relevant, clock))
        return Diagnosis(verdict, None, None, None, None, None, None, tuple(advice), tuple(findings.values()))
    seconds = None
    if chosen.steps_to_exhaustion is not None and steps_per_s:
        seconds = chosen.steps_to_exhaustion / steps_per_s
    advice[:0] = [_headline(chosen, clock), *_when_it_runs_out(chosen, clock, seconds)]
    return Diagnosis(
        chosen.verdict, chosen.leak_kind, _REPORTED_AS.get(chosen.resource, chosen.resource),
        chosen.per_step_bytes, chosen.per_step_error_bytes, chosen.steps_to_exhaustion, seconds,
        tuple(advice), tuple(findings.values()), chosen.per_epoch_bytes,
    )
