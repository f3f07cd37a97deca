"""What the leak detector finds, as plain data: a resource's step-aligned series, its finding, and the run's
diagnosis (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.model import VerdictName


@dataclass(frozen=True)
class Series:
    """One resource's step-aligned samples: steps (x) and bytes (y), plus what the limit is."""

    resource: str  # "heap", "ram", "vram", "vram_reserved", "shm"
    steps: Sequence[float]
    values: Sequence[float]
    limit_bytes: float | None = None  # exhaustion point (RAM limit, device memory, /dev/shm size)


@dataclass(frozen=True)
class ResourceFinding:
    resource: str
    verdict: VerdictName
    leak_kind: str | None
    per_step_bytes: float | None
    per_step_error_bytes: float | None
    warmup_steps: int
    noise_bytes: float
    total_growth_bytes: float
    sporadic_steps: tuple[tuple[int, int], ...] = ()  # (first, last) step each jump may have happened at
    steps_to_exhaustion: float | None = None
    net_growth_bytes: float = 0.0  # last minus first value after warm-up
    per_epoch_bytes: float | None = None  # a staircase's growth per epoch
    released_bytes: float = 0.0  # what the last reading gave back, left out of the judgement (see `released_at_the_end`)
    full_at_step: float | None = None  # the first step whose reading was at the limit (see `_ran_out_at`)
    started_at_step: float | None = None  # where growth that began part-way began (see `_started_late`)


@dataclass(frozen=True)
class Note:
    """One piece of advice as a rule found it: which it is (`key`, worded by the renderers' catalogue)
    and its facts. The rules word nothing, so their tests read facts, not sentences."""

    key: str
    facts: dict[str, Any] = field(default_factory=dict, hash=False)


def note(key: str, **facts: Any) -> Note:
    """`Note(key, facts)`, its facts given as keywords."""
    return Note(key, facts)


@dataclass(frozen=True)
class Diagnosis:
    """The run's verdict: the leaking resource (if any), its rate, when it runs out, and why."""

    verdict: VerdictName
    leak_kind: str | None
    resource: str | None
    per_step_bytes: float | None
    per_step_error_bytes: float | None
    steps_to_exhaustion: float | None
    seconds_to_exhaustion: float | None
    advice: tuple[Note, ...]
    findings: tuple[ResourceFinding, ...] = field(default=())
    per_epoch_bytes: float | None = None

    @property
    def sporadic_steps(self) -> tuple[tuple[int, int], ...]:
        chosen = next((f for f in self.findings if f.leak_kind == "sporadic" and f.resource == self.resource), None)
        return () if chosen is None else chosen.sporadic_steps


def growth_unaccounted(diagnosis: Diagnosis | None) -> float | None:
    """The bytes the leaking resource grew by, for a verdict that says leak or suspect: what a search
    beyond the names looks for when no holder's scans grow (None otherwise)."""
    if diagnosis is None or diagnosis.verdict not in ("leak", "suspect"):
        return None
    grown = [f.net_growth_bytes for f in diagnosis.findings if f.resource == diagnosis.resource]
    return grown[0] if grown and grown[0] > 0 else None


def readings_of(series: Series) -> tuple[list[float], list[float]]:
    """(steps, values) of the series' readings, those with a NaN left out (a source absent then)."""
    xs, ys = [], []
    for x, y in zip(series.steps, series.values):
        if not (math.isnan(x) or math.isnan(y)):
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys
