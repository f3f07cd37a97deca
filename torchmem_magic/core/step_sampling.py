"""Which steps get a step-aligned sample: all of them while that is cheap, every k-th
otherwise (pure: the caller passes the times, so tests drive it with numbers, not sleeps).

A step sample costs a few µs on the training thread (more when glibc's `mallinfo2` walks a heap
that has churned a lot). The first `dense_steps` are all sampled while their total stays under
`dense_cost_s`, so a verdict forms within a few dozen steps; past that, a sample may cost at most
`budget` of a step: `stride = ceil(cost / (budget x step time))`. Whatever a sample costs, the steps are
sampled at least twice each time their number doubles (the stride is at most half the steps so far): on a
churned heap a sample costs milliseconds, the budget's stride passes a thousand, and a short loop would
otherwise keep no sample between its first few dozen steps and its end (a cache filled in its first
hundred steps then reads as growth all the way through).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def smoothed(previous_s: float, value_s: float) -> float:
    """An exponential average of a measured cost, started at the first measurement (not at 0)."""
    return 0.8 * previous_s + 0.2 * value_s if previous_s else value_s


@dataclass
class StepSamplingPolicy:
    """Decides the stride between sampled steps from what samples cost and how long steps take. The
    session samples a step whose number reaches `next_sampled_step`: a comparison, no call at every step."""

    budget: float = 0.003  # a step sample may cost ~0.3% of a step (cache effects double the measured cost)
    dense_steps: int = 64
    dense_cost_s: float = 0.02
    dense_budget: float = 0.05
    max_stride: int = 1024
    stride: int = 1
    sample_cost_s: float = 0.0  # smoothed CPU cost of one step sample (training thread)
    filing_cost_s: float = 0.0  # smoothed CPU cost of filing one row (sampler thread)
    dense_spent_s: float = 0.0  # CPU time all step samples took so far
    next_sampled_step: int = 0  # the first step sampled from now on (0: the next one, whichever it is)
    _last_sample_s: float | None = None
    _last_sampled_step: int = 0

    def sample_next(self) -> None:
        """Sample the next step whatever the stride (the benchmarks time a sampled step this way)."""
        self.next_sampled_step = 0

    def sample_within(self, steps: int) -> None:
        """Sample again `steps` steps after the last sampled one at the latest, whatever the stride (the
        memory guard's next check at a step, closer than the stride while a resource nears its threshold)."""
        self.next_sampled_step = min(self.next_sampled_step, self._last_sampled_step + steps)

    @property
    def last_sampled_step(self) -> int:
        return self._last_sampled_step

    def sampled(self, step: int, started_s: float, cost_s: float) -> None:
        """After a sample of `step` taken at `started_s` (wall clock) that cost `cost_s` of CPU."""
        previous, self._last_sample_s = self._last_sample_s, started_s
        steps_between, self._last_sampled_step = step - self._last_sampled_step, step
        self.sample_cost_s = smoothed(self.sample_cost_s, cost_s)
        self.dense_spent_s += cost_s
        step_s = 0.0 if previous is None else (started_s - previous) / max(steps_between, 1)
        dense = step < self.dense_steps
        if dense and self.dense_spent_s < self.dense_cost_s:
            self.stride = 1
        elif step_s > 0:  # from the second sampled step on: the first has no step period yet
            budget = self.dense_budget if dense else self.budget
            cost = self.sample_cost_s + self.filing_cost_s
            self.stride = max(1, min(self.max_stride, math.ceil(cost / (budget * step_s)), step // 2))
        self.next_sampled_step = step + self.stride

    def filed(self, rows: int, cost_s: float) -> None:
        """The sampler thread filed `rows` queued rows in `cost_s` of CPU: that counts against the budget."""
        if rows:
            self.filing_cost_s = smoothed(self.filing_cost_s, cost_s / rows)

    def mark_sampled(self, step: int) -> None:
        """A sample of `step` was taken outside the policy (the final one at stop)."""
        self._last_sampled_step = step
