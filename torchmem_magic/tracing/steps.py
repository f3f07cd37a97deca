"""The run's clocks: its seconds (`RunTime`), and its steps (`StepCounter`: which clock counts them, how
many each clock made, which loader's batches carry them, and the step-aligned rows the training
thread queues for the sampler thread to file)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..core.model import STEP_CLOCKS, Clock
from ..report.assemble import training_loader
from ..core.step_gate import GatedClock, StepGate
from ..core.step_sampling import StepSamplingPolicy
from ..core.timeline import Row, Timeline


class RunTime:
    """When the run started and ended, on the session's clock (seconds) and on the wall clock."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.started_s: float | None = None
        self.ended_s: float | None = None
        self.started_wall_s = 0.0

    def start(self) -> None:
        self.started_s, self.started_wall_s = self.clock(), time.time()

    def end(self) -> None:
        self.ended_s = self.clock()

    @property
    def running(self) -> bool:
        return self.started_s is not None and self.ended_s is None

    @property
    def ended(self) -> bool:
        return self.ended_s is not None

    def elapsed_s(self) -> float:
        """Seconds since the start (until the end); 0 before it."""
        if self.started_s is None:
            return 0.0
        return (self.ended_s if self.ended_s is not None else self.clock()) - self.started_s


class StepCounter:
    """Counts the steps of every clock; the best clock seen so far is what a step is (optimizer steps,
    then backward passes, then batches, then forward calls; "time" before any ticked). Only the best
    clock's steps are sampled, on the `StepSamplingPolicy`'s schedule: a better clock replaces the
    current one with a dense start of its own, and the rows queued under the old one are dropped.

    The best clock's steps are counted on its `gate`: the hooks count a step with nothing due there
    themselves. Which loader's batches carry the steps (the training loader) is told by the hooks when it
    changes (`carried_by`); the steps made meanwhile are credited to it then, or when asked."""

    def __init__(self) -> None:
        self._counts: dict[Clock, int] = dict.fromkeys(STEP_CLOCKS, 0)  # the best clock's: on the gate
        self.clock: Clock = "time"
        self.gate = StepGate()
        self.generation = 0  # bumped when a better clock replaces the current one
        #: the clocks ranked below the current one, whose steps are only counted (where a hook still fires)
        self.lesser: frozenset[Clock] = frozenset()
        self._filed_generation = 0
        self._loader_credits: dict[tuple[Clock, int], int] = {}  # steps of each clock made on each loader's batches
        self._credits_lock = threading.Lock()  # the hooks and a reader on another thread both credit
        self._carrying_loader: int | None = None  # whose batches carry the steps now (None: no loader's)
        self._credited_to_step = 0  # the gate's steps credited so far
        self.sampling = StepSamplingPolicy()
        self._rows: deque[tuple[int, Row]] = deque(maxlen=100_000)  # (generation, row), filed every tick
        self.first_pass_batches: int | None = None  # batches of the first pass with workers (copy-on-access)
        self.samples_cpu_s = 0.0  # what the step samples cost on the training thread

    @property
    def steps(self) -> int:
        """Steps of the best clock so far (0 while the clock is time)."""
        return self.gate.step if self.clock != "time" else 0

    @property
    def counts(self) -> dict[Clock, int]:
        """Steps of each clock so far (a lesser clock's only while its hook was still in place)."""
        counts, clock = dict(self._counts), self.clock
        if clock != "time":
            counts[clock] = self.gate.step
        return counts

    def count(self, clock: GatedClock) -> int | None:
        """A step of `clock`: its step number when `clock` is the best seen so far, None when it is a
        lesser one (counted only)."""
        gate = self.gate
        if clock == gate.clock:
            gate.step += 1
            return gate.step
        self._counts[clock] += 1
        if self.clock != "time" and STEP_CLOCKS.index(clock) > STEP_CLOCKS.index(self.clock):
            return None
        self._choose(clock)
        return gate.step

    def _choose(self, clock: GatedClock) -> None:
        """`clock` replaces the current one: its steps so far (this one included) go on on the gate."""
        gate = self.gate
        with self._credits_lock:
            self._credit_steps()
            if self.clock != "time":
                self._counts[self.clock] = gate.step
            gate.step = self._counts[clock]
            self._credited_to_step = gate.step - 1  # this step, made on the loader of its batches
            gate.clock = self.clock = clock
        self.lesser = frozenset(STEP_CLOCKS[STEP_CLOCKS.index(clock) + 1 :])
        self.generation += 1
        self.sampling = StepSamplingPolicy()
        gate.due_step = 0

    def carried_by(self, loader: int | None) -> None:
        """The steps from now on are made on `loader`'s batches (the hooks tell when it changes)."""
        with self._credits_lock:
            self._credit_steps()
            self._carrying_loader = loader

    def _credit_steps(self) -> None:
        """Credit the best clock's steps made since the last credit to the loader that carried them."""
        step, loader = self.gate.step, self._carrying_loader
        if loader is not None and self.clock != "time" and step > self._credited_to_step:
            key = (self.clock, loader)
            self._loader_credits[key] = self._loader_credits.get(key, 0) + step - self._credited_to_step
        self._credited_to_step = step

    def queue(self, row: Row, step: int, started_s: float, cost_s: float) -> None:
        """Training thread: a step-aligned row, for the sampler thread to file."""
        self._rows.append((self.generation, row))
        self.samples_cpu_s += cost_s
        self.sampling.sampled(step, started_s, cost_s)

    def file_rows(self, timeline: Timeline, cpu_clock: Callable[[], float]) -> Row | None:
        """Sampler thread: file the queued rows (the last one filed is returned); what that costs counts
        against the step budget. Rows of a clock that a better one replaced are dropped, and so are the
        series' rows."""
        rows, count, last = self._rows, 0, None
        started = cpu_clock()
        while rows:
            generation, row = rows.popleft()
            if generation < self._filed_generation:
                continue
            if generation > self._filed_generation:
                self._filed_generation = generation
                timeline.restart_steps()
            timeline.by_step.append(row)
            count, last = count + 1, row
        self.sampling.filed(count, cpu_clock() - started)
        return last

    def pass_started(self, timeline: Timeline, t_s: float, loader: int, batches: int | None, workers: int) -> None:
        """A loader pass (an epoch when it is the training loader's) began."""
        counts = self.counts
        timeline.add_pass(t_s, loader, tuple(counts[c] for c in STEP_CLOCKS))
        if workers and batches and self.first_pass_batches is None:
            self.first_pass_batches = batches

    def training_loader(self, timeline: Timeline) -> int | None:
        """The loader whose batches carry the steps: its passes are the epochs (None: no loader)."""
        with self._credits_lock:
            self._credit_steps()
            credits = dict(self._loader_credits)
        return training_loader(self.clock, credits, timeline.passes)

    def final_row(self, timeline: Timeline, row: Row) -> None:
        """The last reading also as a step-aligned row, at the last step: when the stride skipped the
        last steps, a jump there must still be seen; when the last step was sampled too, this reading,
        taken after the loop, still sees what the end of the block released (a helper's list gone)."""
        if self.steps > self.sampling.last_sampled_step:
            self.sampling.mark_sampled(self.steps)
        elif self.steps < 1:
            return
        timeline.by_step.append(row)

    def evidence_fields(self, timeline: Timeline) -> dict[str, Any]:
        """The run's evidence that the steps tell (fields of RunEvidence)."""
        return {
            "steps": self.steps, "clock": self.clock, "optimizer_steps": self.counts["optimizer"],
            "training_loader": self.training_loader(timeline), "first_pass_batches": self.first_pass_batches,
        }
