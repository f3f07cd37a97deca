"""The one-line live status of a running session: current values, growth per step so far, the verdict as it
forms."""

from __future__ import annotations

from ..analysis.findings import Diagnosis
from ..core.model import Clock, LiveStatus
from ..core.resources import HEAP, RAM, SHM, VRAM, VRAM_RESERVED
from ..core.timeline import Timeline
from .rates import per_step, rates_of

LIVE_VERDICT_STEPS = 30  # the status line quotes a verdict from this many steps on
#: rows of each series the live verdict judges at most (thinned evenly from the timeline's): recomputed
#: every second on the sampler thread, its cost must not grow with the run; the final report reads them all
LIVE_VERDICT_ROWS = 160


def short_verdict(diagnosis: Diagnosis) -> str:
    """'leak: per-iteration in heap', 'clean', ...: the verdict as the status line shows it."""
    if diagnosis.leak_kind is None:
        return diagnosis.verdict
    return f"{diagnosis.verdict}: {diagnosis.leak_kind} in {diagnosis.resource}"


def live_status(
    timeline: Timeline,
    steps: int,
    elapsed_s: float,
    workers: int,
    live: Diagnosis | None,
    clock: Clock = "optimizer",
    loader: int | None = None,
    holder: str | None = None,
) -> LiveStatus:
    """The one-line live status: current values, growth per step so far, the verdict as it forms.

    `live` is the detector's latest verdict over the run so far (None before `LIVE_VERDICT_STEPS`);
    its rates are the growth figures, so the status line and the final report quote one estimator.
    """
    by_time = timeline.by_time
    rates = rates_of(live) if live is not None else {}
    return LiveStatus(
        elapsed_s=elapsed_s,
        steps=steps,
        epochs=timeline.epoch_count(loader),
        ram_bytes=by_time.last_value(RAM.column),
        heap_bytes=by_time.last_value(HEAP.column),
        vram_allocated_bytes=by_time.last_value(VRAM.column),
        vram_reserved_bytes=by_time.last_value(VRAM_RESERVED.column),
        shm_used_bytes=by_time.last_value(SHM.column),
        workers=workers,
        ram_per_step=per_step(rates, timeline, "ram", clock, 256),
        heap_per_step=per_step(rates, timeline, "heap", clock, 256),
        vram_per_step=per_step(rates, timeline, "vram", clock, 256),
        verdict=None if live is None else short_verdict(live),
        clock=clock,
        holder=holder,
    )
