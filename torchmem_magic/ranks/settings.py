"""What a watcher hands to the processes it watches as ranks (plain data; no heavy imports)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.options import DEFAULT_SHM_PATH
from ..finder.scan.results import Root, StartScan

if TYPE_CHECKING:
    from ..tracing.hooks import StepClock, TrainingHooks


@dataclass(frozen=True)
class RankSettings:
    """Where a rank sends its stream, how often it samples, where its leak finder looks."""

    address: str
    interval_ms: float
    shm_path: str = DEFAULT_SHM_PATH
    roots: Callable[[], list[Root]] | None = None  # the watcher's roots, as a forked rank inherits them
    sources: tuple[str, ...] = ()  # code in which a holder's fix line is looked for
    scan: bool = True  # False: no leak finder in the rank (`watch --no-scan`), only its curves
    guard: float | None = None  # `watch --guard`: the share of a limit at which the rank's loop is stopped
    inherited_scan: StartScan | None = None  # the watcher's, for a rank forked from it


#: called in a process forked from a watched one when the hooks it inherited fire there
ForkedProcessHandler = Callable[[RankSettings, "TrainingHooks", "StepClock | None"], None]
