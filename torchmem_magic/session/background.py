"""What runs on the sampler thread at each reading: every probe read in full (children found, PSS at their
slow rates), the step rows the training thread queued filed, what the ranks sent, the flight record, the
guard's check of the reading, a scan whose time has come announced to the loop's next step, the session's own
decision to search beyond the names; and the live listener's tick."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.step_requests import StepRequests
from ..core.timeline import Timeline
from ..probes.bundle import ProbeBundle
from ..tracing.frames import RunningFrame
from ..tracing.steps import RunTime, StepCounter
from .live_view import Listener, LiveView

if TYPE_CHECKING:
    from ..finder.leak_finder import LeakFinder
    from ..flight.recorder import FlightRecorder
    from ..ranks.feed import RankFeeds
    from .search_judge import SearchJudge
    from ..tracing.guard import MemoryGuard


@dataclass
class BackgroundReadings:
    """The session's part on the sampler thread (see the module's docstring), made once its parts are open."""

    steps: StepCounter
    timeline: Timeline
    runtime: RunTime
    probes: ProbeBundle
    requests: StepRequests
    view: LiveView
    cpu_clock: Callable[[], float]
    ranks: RankFeeds | None = None
    recorder: FlightRecorder | None = None
    guard: MemoryGuard | None = None
    listener: Listener | None = None
    finder: LeakFinder | None = None
    search: SearchJudge | None = None
    #: (a frame, what runs once it no longer runs), checked at each reading
    returned: list[tuple[RunningFrame, Callable[[], None]]] = field(default_factory=list)

    def row(self, after_the_run: bool = False) -> dict[str, float]:
        """The full reading, incl. children discovery and PSS at their slow rates; during the run, the heap
        figure of a step sample filed now, where there is one (no second walk of the heap so soon). The
        reading `after_the_run` walks the heap itself: it must see what the end of the block released."""
        filed = self.steps.file_rows(self.timeline, self.cpu_clock)
        if filed is not None and not after_the_run:
            self.probes.offer_heap(filed)
        if self.ranks is not None:
            self.ranks.poll()
        running = not self.runtime.ended
        row = self.probes.background_row(running)
        row["t_s"], row["step"] = self.runtime.elapsed_s(), float(self.steps.steps)
        if running:
            if self.recorder is not None:  # the row itself is recorded when the sampler appends it: at the next flush
                self.recorder.on_sample(self.view, row["t_s"])
            if self.guard is not None:
                stop = self.guard.check(row, self.view)
                if stop is not None:
                    self.requests.raise_at_step(stop)
            if self.finder is not None:
                self.finder.wake_if_scan_due()
            if self.search is not None:
                self.search.on_reading()
            if self.returned:  # a list read, at most, on every other run's readings
                self._check_returned()
        return row

    def _check_returned(self) -> None:
        """Run, once each, what waits for a frame that is no longer running (see `MemwatchSession.end_when_returned`)."""
        for entry in [e for e in self.returned if not e[0].running()]:
            self.returned.remove(entry)
            entry[1]()

    def on_tick(self) -> float | None:
        return self.listener.on_tick(self.view) if self.listener is not None else None

    def final(self) -> None:
        """One last reading (also as a step-aligned row if the stride skipped the last steps)."""
        if self.ranks is not None:
            self.ranks.poll(force=True)  # what the ranks sent since the sampler's last read
        row = self.row(after_the_run=True)  # also files queued step rows
        self.timeline.by_time.append(row)
        self.steps.final_row(self.timeline, row)
