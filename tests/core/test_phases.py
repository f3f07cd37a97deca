"""Where a leak grows, from the passes of a phase a trainer's callback marked (pure, synthetic passes)."""

from __future__ import annotations

from torchmem_magic.analysis.phases import PhasePass, phase_notes
from torchmem_magic.render.advice import advice_lines

MIB = 1 << 20


def _passes(name: str, grown_mib: list[float], column: str = "heap_bytes") -> list[PhasePass]:
    return [PhasePass(name, 100 * i, {column: 500.0 * MIB}, {column: (500.0 + g) * MIB})
            for i, g in enumerate(grown_mib)]


def test_passes_that_added_most_of_the_growth_are_where_it_grows() -> None:
    passes = [*_passes("validation", [4, 4, 4]), *_passes("test", [0.1])]
    notes = phase_notes(passes, "leak", "heap", "heap_bytes", run_growth_bytes=13 * MIB)
    assert [(n.facts["phase"], n.facts["passes"], n.facts["grown_bytes"]) for n in notes] == [("validation", 3, 12 * MIB)]
    assert advice_lines(notes)[0].startswith("it grows while validating: 4.0 MiB a pass over 3 passes, 92% of what heap")


def test_passes_that_added_little_of_it_or_a_clean_run_say_nothing() -> None:
    passes = _passes("validation", [1, 1, 1])
    assert phase_notes(passes, "leak", "heap", "heap_bytes", run_growth_bytes=40 * MIB) == []  # a training leak
    assert phase_notes(_passes("validation", [4, 4]), "clean", "heap", "heap_bytes", run_growth_bytes=8 * MIB) == []
    assert phase_notes(_passes("validation", [0.5, 0.5]), "leak", "heap", "heap_bytes", run_growth_bytes=1 * MIB) == []


def test_a_reading_without_the_column_adds_nothing() -> None:
    nan = float("nan")
    passes = [PhasePass("evaluation", 10, {"heap_bytes": nan}, {"heap_bytes": 9.0 * MIB}),
              PhasePass("evaluation", 20, {}, {"heap_bytes": 9.0 * MIB})]
    assert phase_notes(passes, "leak", "heap", "heap_bytes", run_growth_bytes=4 * MIB) == []
