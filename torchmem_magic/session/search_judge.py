"""The session's own decision to search beyond the names mid-run: on the sampler thread, from its own live
verdict, whatever front end (or none) is attached, so that `memwatch()`, the gate and the callbacks search as
the live figure does. The live view only reads the verdict; this is the one place that acts on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..analysis.findings import growth_unaccounted
from .live_view import LIVE_VERDICT_PERIOD_S, LiveView

if TYPE_CHECKING:
    from ..finder.leak_finder import LeakFinder

#: how often the session works out a verdict of its own for this, where no listener did one in the last
#: second: a recompute on a full timeline costs about 4 ms, so 0.1 % of a core at this period
OWN_VERDICT_PERIOD_S = 4.0


class SearchJudge:
    """Asks the leak finder for a search back when the verdict so far sees growth (see the module's docstring)."""

    def __init__(self, view: LiveView, finder: LeakFinder, clock: Callable[[], float]) -> None:
        self._view, self._finder, self._clock = view, finder, clock
        self._own_next_s = 0.0

    def on_reading(self) -> None:
        """At each reading of a running session: costs a check until the finder could search."""
        if not self._finder.search_possible():
            return
        diagnosis = self._view.verdict_within(LIVE_VERDICT_PERIOD_S)
        if diagnosis is None:
            now = self._clock()
            if now < self._own_next_s:
                return
            self._own_next_s = now + OWN_VERDICT_PERIOD_S
            diagnosis = self._view.live_verdict()
        grown = growth_unaccounted(diagnosis)
        if grown is not None:
            self._finder.want_search(grown)
