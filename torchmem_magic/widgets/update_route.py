"""The live figure redrawn from the thread whose widget messages reach the page: the sampler thread,
or the training thread at the next step boundary (`live_route` decides which, from the kernel)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .live_route import LiveRoute
    from ..session.live_view import LiveView
    from ..render.results import Report
    from ..core.step_requests import StepRequests
    from .live import LiveFigure


@dataclass
class UpdateCounts:
    """Where a run's figure was redrawn from. Plain numbers and text, nothing of the run: the last
    finished run's stay readable as `last_counts` (e.g. to check the route in a notebook)."""

    route: str
    why: str
    sampler: int = 0  # redraws on the sampler thread
    training_thread: int = 0  # redraws at a step boundary, on the training thread
    resent: int = 0  # full re-sends of the figure's models (after best-effort redraws from the sampler)


#: the counts of the last run that finished with a live figure
last_counts: UpdateCounts | None = None


class RoutedUpdates:
    """A LiveFigure as the session's listener, redrawn from the thread its route names.

    On the training-thread route the sampler thread only asks for a redraw (through the run's
    `StepRequests`, one at a time); it runs at the next step, on the training thread. What it costs
    there (that thread's CPU time) is handed back to the sampler, which counts it as its tick's, so the
    cap of the sampler route bounds it: at most one redraw per `tick_period_s`, and as rarely as keeps
    the redraws under `tick_cpu_share` of the run's time, though one at least every `tick_max_period_s`.
    Before the loop's first step, and while an asked redraw has waited `tick_max_period_s` for a step
    (a phase without steps), the sampler thread redraws itself, best effort: a front end may drop those
    messages, and ipywidgets sends a trait only when it changes, so the next redraw on the training
    thread (or the final one) first re-sends every model of the figure in full.
    """

    def __init__(
        self,
        figure: LiveFigure,
        requests: StepRequests,
        route: LiveRoute,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.figure = figure
        self.tick_period_s = figure.tick_period_s
        self.tick_cpu_share = figure.tick_cpu_share
        self.tick_max_period_s = figure.tick_max_period_s
        self.counts = UpdateCounts(route.route, route.why)
        self._on_steps = route.route == "training thread"
        self._requests = requests
        self._clock, self._cpu_clock = clock, cpu_clock
        self._lock = threading.Lock()  # the training thread adds to `_spent_s`, the sampler takes it
        self._spent_s = 0.0  # CPU seconds of the training thread's redraws since the sampler's last tick
        self._asked_s: float | None = None  # when the redraw that waits for a step was asked
        self._stale = False  # the sampler thread redrew on the training-thread route since the last re-send

    # ---------------------------------------------------------------- Listener (the sampler thread)
    def on_tick(self, view: LiveView) -> float | None:
        with self._lock:
            spent_s, self._spent_s = self._spent_s, 0.0
        if not self._on_steps:
            self._redraw_here(view)
            return spent_s
        asked_s = self._asked_s
        waited_too_long = asked_s is not None and self._clock() - asked_s >= self.tick_max_period_s
        if view.clock == "time" or waited_too_long:  # no step to run it (yet, or for a while)
            self._redraw_here(view)
            self._stale = True  # after the redraw: one on the training thread meanwhile does not hide it
        elif asked_s is None:
            self._asked_s = self._clock()
            self._requests.request(functools.partial(self._redraw_at_step, view))
        return spent_s

    def on_finish(self, view: LiveView, report: Report) -> None:
        global last_counts
        if self._stale:
            self._resend()
        self.figure.on_finish(view, report)
        last_counts = self.counts

    # ---------------------------------------------------------------- drawing
    def _redraw_here(self, view: LiveView) -> None:
        self.figure.on_tick(view)
        self.counts.sampler += 1

    def _redraw_at_step(self, view: LiveView) -> None:
        """At a step boundary, on the training thread (a `StepRequests` action)."""
        started_s = self._cpu_clock()
        try:
            if self._stale:
                self._resend()
            self.figure.on_tick(view)
            self.counts.training_thread += 1
        finally:
            self._asked_s = None
            spent_s = self._cpu_clock() - started_s
            with self._lock:
                self._spent_s += spent_s

    def _resend(self) -> None:
        self._stale = False
        self.figure.resend()
        self.counts.resent += 1
