"""What runs at a step of the user's loop, on the thread that made it: the step counted on its clock, the
requests and the leak finder's scans due between two steps, and a sampled step's reading with the guard's
check of it. Only the steps something is due at come here: the chosen clock's hook counts the others on
the step gate, which `tick` arms with the next due step."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core.step_requests import StepRequests
from ..core.timeline import Timeline
from ..finder.leak_finder import LeakFinder
from ..tracing.hooks import LoaderPass, StepClock, TrainingHooks
from ..tracing.steps import RunTime, StepCounter

if TYPE_CHECKING:
    from ..probes.bundle import ProbeBundle
    from ..tracing.guard import MemoryGuard
    from .live_view import LiveView


class StepPath:
    """The session's part on the training thread (see the module's docstring). The parts a run opens at its
    start (probes, guard, the live view, the hooks) are handed to it then."""

    def __init__(
        self, steps: StepCounter, requests: StepRequests, finder: LeakFinder | None, runtime: RunTime,
        timeline: Timeline, cpu_clock: Callable[[], float],
    ) -> None:
        self.steps, self.requests, self.finder, self.runtime = steps, requests, finder, runtime
        self.timeline, self._cpu_clock = timeline, cpu_clock
        self.probes: ProbeBundle | None = None
        self.guard: MemoryGuard | None = None
        self.view: LiveView | None = None
        self.hooks: TrainingHooks | None = None
        requests.wake = steps.gate.wake
        if finder is not None:
            finder.wake_steps = steps.gate.wake

    def attach(self, hooks: TrainingHooks) -> TrainingHooks:
        """The hooks whose steps come here: they count the steps nothing is due at on this run's gate."""
        hooks.use_gate(self.steps.gate)
        hooks.on_loader = self.steps.carried_by
        self.hooks = hooks
        return hooks

    def tick(self, clock: StepClock) -> None:
        """A step of any clock that reached the gate's due step, on the thread that made it (also one a
        rank made before it adopted the hooks). Requests (clicks, the guard's stop) and the leak finder's
        scans run here, between two steps; a sampled step reads only the ~1 µs counters and queues its row
        (with a guard, /dev/shm too, for its check). Then the gate waits for the next due step."""
        __tracebackhide__ = True
        steps = self.steps
        gate = steps.gate
        wakes = gate.wakes
        if clock == gate.clock:  # the chosen clock's step: counted here, no call
            gate.step += 1
            step = gate.step
        elif clock in steps.lesser:  # a lesser clock whose hook is still in place: counted, no more
            steps.count(clock)
            return
        else:
            generation = steps.generation
            counted = steps.count(clock)
            if counted is None:
                return
            step = counted
            if steps.generation != generation:
                self._clock_replaced(clock)
        if self.requests.pending:
            self.requests.run(step)
        finder = self.finder
        if finder is not None and finder.scan_due(step):
            finder.scan(step)
        if step >= steps.sampling.next_sampled_step:
            self._sample_step(step)
        self._arm_gate(wakes)

    def _arm_gate(self, wakes: int) -> None:
        """The gate waits for the next step something is due at: a sample, a scan's clock reading, a
        request (the next step). What another thread asks opens the gate once its state is in place: a
        wake since `wakes` was read may not be in what was read here, so it opens the gate again."""
        gate, finder = self.steps.gate, self.finder
        due = self.steps.sampling.next_sampled_step
        if finder is not None:
            check_at_step = finder.next_check_step
            if check_at_step < due:
                due = check_at_step
        gate.due_step = 0 if self.requests.pending else due
        if gate.wakes != wakes:
            gate.due_step = 0

    def _sample_step(self, step: int) -> None:
        """A sampled step: its step-aligned row, and the guard's check of it, which may raise its
        MemoryGuardError at this very step (a fill can pass the threshold within a sampling interval)
        and brings the next sampled step closer as a resource nears its threshold. The check's cost
        counts as the sample's, so away from the thresholds the stride keeps samples in their budget."""
        __tracebackhide__ = True
        steps, guard = self.steps, self.guard
        started_s, cpu_started_s = self.runtime.clock(), self._cpu_clock()
        assert self.probes is not None
        row = self.probes.step_row()
        row["t_s"], row["step"] = started_s - (self.runtime.started_s or 0.0), float(step)
        if guard is not None and self.view is not None:
            stop = guard.check_step(row, self.view, steps.sampling.stride)
            if stop is not None:
                self.requests.raise_at_step(stop)
        steps.queue(row, step, started_s, self._cpu_clock() - cpu_started_s)
        if guard is not None:
            steps.sampling.sample_within(guard.next_check_steps)
            if self.requests.pending:  # this check's error, or the sampler's that came since the step began
                self.requests.run(step)

    def _clock_replaced(self, clock: StepClock) -> None:
        """A better clock: the hooks of the lesser ones go; the holders' and the guard's steps so far meant
        something else."""
        if self.hooks is not None:
            self.hooks.settle(clock)
        if self.finder is not None:
            self.finder.restart()
        if self.guard is not None:
            self.guard.restart_steps()

    def pass_started(self, loader_pass: LoaderPass) -> None:
        """A DataLoader pass began (also one that began before this session's hooks were its own)."""
        workers = loader_pass.workers
        self.steps.pass_started(
            self.timeline, self.runtime.elapsed_s(), loader_pass.loader, loader_pass.batches, len(workers)
        )
        if workers and self.probes is not None:
            self.probes.announce_workers(workers)
