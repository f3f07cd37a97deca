"""What a watcher hands to the processes it watches as ranks (plain data; no heavy imports)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..scan.results import Root

if TYPE_CHECKING:
    from ..hooks import StepClock, TrainingHooks


@dataclass(frozen=True)
class StartScan:
    """What the scan before a run found: each name's retained bytes, the names cheap to re-measure,
    and what the scan cost. A process forked from the watcher inherits exactly those objects, so it
    takes this over instead of walking (and copying, page by page) the inherited heap again."""

    baseline: dict[str, int]
    cheap: frozenset[str]
    cost_s: float


@dataclass(frozen=True)
class RankSettings:
    """Where a rank sends its stream, how often it samples, where its leak finder looks."""

    address: str
    interval_ms: float
    shm_path: str = "/dev/shm"
    roots: Callable[[], list[Root]] | None = None  # the watcher's roots, as a forked rank inherits them
    sources: tuple[str, ...] = ()  # code in which a holder's fix line is looked for
    scan: bool = True  # False: no leak finder in the rank (`watch --no-scan`), only its curves
    guard: float | None = None  # `watch --guard`: the share of a limit at which the rank's loop is stopped
    inherited_scan: StartScan | None = None  # the watcher's, for a rank forked from it


#: called in a process forked from a watched one when the hooks it inherited fire there
ForkedProcessHandler = Callable[[RankSettings, "TrainingHooks", "StepClock | None"], None]
