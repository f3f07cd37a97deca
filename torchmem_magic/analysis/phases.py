"""Growth inside the passes of a phase of their own, such as validation, test or a Trainer's evaluation (pure).

A trainer's callback marks where each pass of such a phase began and ended, with a reading at each end.
A leak that grows only while validating reads, on the curves, as a staircase or a few jumps between two
optimizer steps; the passes say where the steps went up. What a phase's passes added, summed over them,
against what the leaking resource grew over the whole run, says whether the phase is where it grows."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .findings import Note, note

MIB = 1 << 20
PHASE_MIN_BYTES = 2 * MIB  # a phase's passes must add at least this to be where a leak grows
PHASE_SHARE_OF_RUN = 0.5  # ... and at least this share of what the resource grew over the run


@dataclass(frozen=True)
class PhasePass:
    """One pass of a phase: its name ("validation"), the step it came after, the readings at its two ends
    (timeline columns to bytes)."""

    name: str
    step: int
    before: Mapping[str, float]
    after: Mapping[str, float]

    def grew(self, column: str) -> float:
        """What the pass added to `column` (0 where either reading lacks it)."""
        start, end = self.before.get(column), self.after.get(column)
        if start is None or end is None or math.isnan(start) or math.isnan(end):  # the source was absent
            return 0.0
        return end - start


def phase_notes(passes: Sequence[PhasePass], verdict: str, resource: str, column: str,
                run_growth_bytes: float) -> list[Note]:
    """'it grows while validating' for each phase whose passes added most of what the leaking `resource` (a
    leak or a suspect; timeline `column`) grew over the run (`run_growth_bytes`, its last reading less its
    first)."""
    if verdict not in ("leak", "suspect"):
        return []
    notes = []
    for name in dict.fromkeys(p.name for p in passes):
        mine = [p for p in passes if p.name == name]
        grown = sum(p.grew(column) for p in mine)
        if grown >= max(PHASE_MIN_BYTES, PHASE_SHARE_OF_RUN * run_growth_bytes):
            notes.append(note("grows in phase", phase=name, passes=len(mine), grown_bytes=grown,
                              run_growth_bytes=run_growth_bytes, resource=resource))
    return notes
