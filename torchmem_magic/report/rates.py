"""Growth per step of each resource: the detector's own rate where it had enough steps, else a first figure from
the series; one rule, so the status line and the report quote the same figure."""

from __future__ import annotations

from typing import Any

from ..analysis.findings import Diagnosis
from ..core import resources
from ..core.model import Clock, leak_summary
from ..core.slopes import robust_slope
from ..core.timeline import DecimatingSeries, Timeline

#: the step-aligned column each resource that can leak has its "growth per step" measured on
RATE_COLUMNS = {r.key: r.column for r in resources.RESOURCES if r.leak_rank is not None}


def rates_of(diagnosis: Diagnosis) -> dict[str, float]:
    """Bytes per step of each resource the detector could measure."""
    return {f.resource: f.per_step_bytes for f in diagnosis.findings if f.per_step_bytes is not None}


def growth_per_step(series: DecimatingSeries, column: str, x_name: str = "step", max_points: int = 1024) -> float | None:
    """Bytes per step (or per second, x_name "t_s") of `column` (None if it cannot say)."""
    cols = series.columns(x_name, column)
    return robust_slope(cols[x_name], cols[column], max_points)


def per_step(
    rates: dict[str, float], timeline: Timeline, resource: str, clock: Clock = "optimizer", max_points: int = 1024
) -> float | None:
    """Bytes per step of a resource: the detector's rate where it had enough steps, else the
    split-half slope of the step-aligned series (a first figure, before any verdict). One rule for
    the status line and the report, so both quote the same figure."""
    if resource in rates:
        return rates[resource]
    if clock == "time":
        return growth_per_step(timeline.by_time, RATE_COLUMNS[resource], "t_s", max_points)
    return growth_per_step(timeline.by_step, RATE_COLUMNS[resource], "step", max_points)


def leak_rate(report: Any, resource: str | None) -> float | None:
    """Growth per step of the resource a verdict named, as that resource's own summary on `report` (a
    Report, or a rank's summary) says."""
    rate = getattr(leak_summary(report, resource), "per_step_bytes", None)
    return None if rate is None else float(rate)
