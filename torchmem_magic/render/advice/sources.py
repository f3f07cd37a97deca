"""The report's word on sources of figures that failed during the run (a probe, the hooks, the sampler)."""

from __future__ import annotations

from collections.abc import Sequence

from ...core.model import SourceErrors

GAPS = "its figures in this report are incomplete"


def source_error_advice(errors: Sequence[SourceErrors]) -> list[str]:
    """One line per source that failed: what it cost (its figures have gaps, unless it says otherwise), and why."""
    return [
        f"the {e.source} failed {e.count:,} time{'s' if e.count != 1 else ''} (last: {e.last}): "
        f"{e.cost or GAPS}"
        for e in errors
    ]
