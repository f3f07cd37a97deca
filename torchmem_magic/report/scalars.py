"""The run's figures as a trainer's logger records them: one scalar per curve and the leak rate, under names
that sort together wherever they land (TensorBoard, CSV, W&B, MLflow)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..core.resources import RESOURCES

SCALAR_PREFIX = "memwatch/"
#: the leak rate where the verdict so far says leak or suspect, else 0 (absent until there is a verdict, and
#: where a leak has no rate)
GROWTH_TAG = SCALAR_PREFIX + "growth_bytes_per_step"
#: the curves logged: every resource drawn as a curve (a count, such as the workers alive, is none)
LOGGED_COLUMNS = tuple(r.column for r in RESOURCES if r.colour is not None and r.kind != "count")
#: the verdicts whose rate is a leak's (the others log 0)
GROWING_VERDICTS = ("leak", "suspect")


def memory_scalars(reading: Mapping[str, float], verdict: str | None, per_step_bytes: float | None) -> dict[str, float]:
    """`memwatch/<column>` for each curve's value in `reading` (one absent or NaN is left out: no CUDA, no
    workers yet) and the growth tag once there is a `verdict`: `per_step_bytes` where it is a leak's, else 0."""
    scalars = {}
    for column in LOGGED_COLUMNS:
        value = reading.get(column, math.nan)
        if not math.isnan(value):
            scalars[SCALAR_PREFIX + column] = float(value)
    if verdict is None or verdict == "unknown":
        return scalars
    if verdict not in GROWING_VERDICTS:
        scalars[GROWTH_TAG] = 0.0
    elif per_step_bytes is not None:  # a leak with no rate (a sporadic one's may have none) is no 0
        scalars[GROWTH_TAG] = float(per_step_bytes)
    return scalars
