"""When the leak finder's next scan during a run may come: the scans' share of the run's time (beyond a one-off
allowance), gaps that widen as the run goes on, the first scans paced by steps, and a countdown of steps
between two clock readings, so that most steps only compare two numbers."""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_SCANS = 66
#: scans thin out as the run goes on (each waits a quarter of the run so far), so MAX_SCANS cover
#: the first seconds densely and still reach hours into a long run
GAP_SHARE_OF_RUN = 0.25
#: the first scans also come at steps 2, 4, 8, ... (each at twice the last scan's step), budget permitting:
#: a fast loop makes hundreds of steps within the time gaps, and a holder's growth is judged per step
STEP_PACED_SCANS = 6
FULL_SCAN_EVERY = 5
#: `due_at` reads the clock only now and then: the steps between two readings span at most half the time
#: left to wait (at the step period the last two readings measured) and at most this share of the whole
#: wait, and never more than MAX_UNCHECKED_STEPS. A wait is read some ten times; when the steps suddenly
#: turn slower, the sampler thread's reading (`due_by_time`) bounds how late its scan comes (see `due_at`)
UNCHECKED_SHARE_OF_WAIT = 0.25
MAX_UNCHECKED_STEPS = 1024
NEVER = 1 << 62  # a step no loop reaches


class ScanSchedule:
    """The scans' timetable (see the module's docstring); the tracker asks `due_at` at every step and tells
    `scanned` what each scan cost.

    Args:
        full_scan_cost_s: what a scan of everything is expected to cost, so the first full scan also waits
            for room in the budget.
        budget_share: most of the run's wall time the scans may take, beyond a one-off `start_allowance_s`
            that lets the first scans come quickly (a holder is named within a few dozen steps).
        start_allowance_s: the one-off, in the training thread's CPU time: on a busy machine a scan's
            wall time stretches with the other processes' share of the core, and an allowance in wall
            time would then buy fewer of the first scans than a quiet machine gives (too few to judge a
            short loop's holder). The share above is wall time over wall time, which the load stretches
            alike.
        min_gap_s: least time between two scans.
        clock: seconds (injectable for tests).
        cpu_clock: the training thread's CPU seconds (the scans run there); by default `clock` where one
            is injected, else the thread's CPU clock.
    """

    def __init__(
        self,
        full_scan_cost_s: float = 0.0,
        budget_share: float = 0.01,
        start_allowance_s: float = 0.06,
        min_gap_s: float = 0.02,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] | None = None,
    ) -> None:
        self._budget_share = budget_share
        self._min_gap_s = min_gap_s
        self.clock = clock
        self.cpu_clock = cpu_clock or (time.thread_time if clock is time.perf_counter else clock)
        self._started_s: float | None = None  # the first step: setup before the loop does not count
        self._next_scan_s = 0.0
        self._budget_ready_s = 0.0  # when the scans so far are back within the budget
        self._next_scan_step = 0  # a step-paced scan is due at this step, time gaps aside (NEVER: no more)
        self._paced_from = 0  # the scan count when the current step clock began
        #: `due` reads the clock at this step next; before it nothing can be due, so the steps before it
        #: need not ask (NEVER: no more scans)
        self.check_at_step = 0
        self._wait_from_s = 0.0  # when the current wait began (the last scan's end, or the first step)
        self._read_s = 0.0  # the last clock reading and its step (NEVER: none to measure from)
        self._read_at_step = NEVER
        self._step_period_s = float("inf")  # measured between the last two readings (inf: not known)
        self._unnumbered_steps = 0  # the calls of `due` without a step
        self._allowance_left_cpu_s = start_allowance_s
        self._charged_s = 0.0  # the scans' wall time beyond what the allowance covered
        self._full_cost_s = full_scan_cost_s  # what the last scan of everything cost

    def due(self, step: int | None = None) -> bool:
        """Whether a scan may run now, at `step` (see `due_at`); without `step`, only the time-paced
        scans come, each call counted as a step."""
        if step is None:
            self._unnumbered_steps += 1
            return self.due_at(self._unnumbered_steps, False)
        return self.due_at(step)

    def due_at(self, step: int, numbered: bool = True) -> bool:
        """Whether a scan may run now, at `step` (called at every step: most only compare `step` with the
        step of the next clock reading).

        The step-paced scans come at the very steps a reading at every step would give. So do the
        time-paced ones (and a step-paced one waiting for the budget) while the steps take less than
        twice the period the last two readings measured: the next reading is at most half the time
        left away. Steps that suddenly turn k times slower make a scan late by at most
        k x UNCHECKED_SHARE_OF_WAIT of its wait and by at most MAX_UNCHECKED_STEPS steps, and where the
        sampler thread asks `due_by_time`, by at most its interval and a step; the next reading measures
        the new period. At a reading, each
        attribute is read once and min/max are spelled as comparisons (a builtin's call costs more
        than the arithmetic)."""
        if step < self.check_at_step:
            return False
        now = self.clock()
        if self._started_s is None:
            self._started_s = self._wait_from_s = now
        read_at_step = self._read_at_step
        if step > read_at_step:
            self._step_period_s = (now - self._read_s) / (step - read_at_step)
        self._read_s, self._read_at_step = now, step
        next_scan_step = self._next_scan_step if numbered else NEVER
        wake_s = self._budget_ready_s if step >= next_scan_step else self._next_scan_s
        if now >= wake_s:
            self.check_at_step = 0  # read again at the next step, should no scan follow
            return True
        unread_s = UNCHECKED_SHARE_OF_WAIT * (wake_s - self._wait_from_s)
        left_s = 0.5 * (wake_s - now)
        if left_s < unread_s:
            unread_s = left_s
        period_s = self._step_period_s
        if unread_s >= MAX_UNCHECKED_STEPS * period_s:
            next_check = step + MAX_UNCHECKED_STEPS
        elif unread_s >= 2.0 * period_s:
            next_check = step + int(unread_s / period_s)
        else:
            next_check = step + 1
        if step < next_scan_step < next_check:
            next_check = next_scan_step
        self.check_at_step = next_check
        return False

    def due_by_time(self) -> bool:
        """Whether the time the next scan waits for has come (the sampler thread asks at its readings):
        then the next step reads the clock. Steps that turned much slower since the last reading would
        otherwise leave the scan to the reading they were counted to, a wait's share later or more."""
        check_at_step = self.check_at_step
        if self._started_s is None or check_at_step == 0 or check_at_step == NEVER:
            return False
        wake_s = self._budget_ready_s if self._next_scan_step != NEVER else self._next_scan_s
        if self.clock() < wake_s:
            return False
        self.check_at_step = 0
        return True

    def soon(self) -> None:
        """A scan is wanted as soon as the budget allows (any thread may ask)."""
        self._next_scan_s = self._budget_ready_s
        self.check_at_step = 0

    def full_scan_allowed(self, started_s: float, scans: int) -> bool:
        """Whether the scan starting at `started_s` looks everywhere: every FULL_SCAN_EVERY-th, when the budget
        has room for what the last full scan cost."""
        loop_started_s = started_s if self._started_s is None else self._started_s
        allowed_s = self._allowance_left_cpu_s + self._budget_share * (started_s - loop_started_s)
        return scans % FULL_SCAN_EVERY == FULL_SCAN_EVERY - 1 and self._charged_s + self._full_cost_s <= allowed_s

    def scanned(self, step: int, started_s: float, cpu_started_s: float, full: bool, scans: int) -> float:
        """A scan at `step` (the `scans`-th) ended: charge it and set when the next may come; its wall time."""
        loop_started_s = started_s if self._started_s is None else self._started_s
        now, cpu_s = self.clock(), self.cpu_clock() - cpu_started_s
        wall_s = now - started_s
        if full:
            self._full_cost_s = wall_s
        covered = 1.0 if cpu_s <= self._allowance_left_cpu_s else self._allowance_left_cpu_s / cpu_s
        self._allowance_left_cpu_s = max(0.0, self._allowance_left_cpu_s - cpu_s)
        self._charged_s += wall_s * (1.0 - covered)
        # the scans so far stay within budget_share of the run when the next one waits until then
        gap_s = max(self._min_gap_s, GAP_SHARE_OF_RUN * (now - loop_started_s))
        self._budget_ready_s = loop_started_s + self._charged_s / self._budget_share
        self._next_scan_s = max(now + gap_s, self._budget_ready_s)
        self._next_scan_step = 2 * max(step, 1) if scans - self._paced_from < STEP_PACED_SCANS else NEVER
        # the next step reads the clock and measures the step period from here: the scan is no step's time
        self._read_s = self._wait_from_s = now
        self.check_at_step = 0 if scans < MAX_SCANS else NEVER
        return wall_s

    def restart(self, scans: int) -> None:
        """A better step clock replaced the current one (after `scans` scans): the step-paced scans begin again."""
        self._next_scan_step, self._paced_from = 0, scans
        # its steps 1 and 2 read the clock: the new clock's period is measured between them (the old
        # clock's last reading was at a later step: none is measured across the two)
        self.check_at_step = 0 if scans < MAX_SCANS else NEVER
        self._step_period_s = float("inf")
