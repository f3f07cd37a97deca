"""The leak finder's scan schedule reads the clock only now and then: most steps only compare their number,
and the scans still come where a reading at every step would put them (on a fake clock, step by step)."""

from __future__ import annotations

import random

import pytest

import torchmem_magic.finder.holder_tracking as tracking
import torchmem_magic.finder.scan_schedule as schedule
from torchmem_magic.finder.holder_tracking import HolderTracker

Scans = list[tuple[int, float]]  # (step, time on the fake clock) of each scan


class CountingClock:
    """A fake clock that counts its readings."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return self.now_s


def run_loop(
    step_times_s: list[float], monkeypatch: pytest.MonkeyPatch, *, read_every_step: bool, scan_s: float = 0.001,
    restart_at: int | None = None, start_allowance_s: float = 0.03, sampler_interval_s: float | None = None,
) -> tuple[Scans, int]:
    """A loop whose i-th step takes `step_times_s[i]` and whose scans take `scan_s`: (step, time) of its
    scans, and how often `due_at` read the clock. `read_every_step`: the schedule that reads the clock at
    every step (what the countdown must agree with). `restart_at`: a better step clock replaces the
    current one before that step (the steps count from 1 again). `sampler_interval_s`: the sampler thread
    asks `due_by_time` at its readings, this far apart (its readings during a step are seen by the next)."""
    clock = CountingClock()

    def roots() -> list[tracking.Root]:
        clock.now_s += scan_s
        return []

    scans: Scans = []
    with monkeypatch.context() as patch:
        if read_every_step:
            patch.setattr(schedule, "MAX_UNCHECKED_STEPS", 1)
        # the scans' CPU time runs with the fake time, uncounted: the readings counted are the schedule's
        tracker = HolderTracker(roots, clock=clock, cpu_clock=lambda: clock.now_s, start_allowance_s=start_allowance_s)
        step, sampler_reads_s = 0, sampler_interval_s
        for index, step_s in enumerate(step_times_s):
            if index == restart_at:
                tracker.restart()
                step = 0
            step += 1
            clock.now_s += step_s
            while sampler_reads_s is not None and sampler_interval_s and sampler_reads_s <= clock.now_s:
                tracker.schedule.due_by_time()
                sampler_reads_s += sampler_interval_s
            if tracker.due_at(step):
                scans.append((step, clock.now_s))
                tracker.scan(step)
    return scans, clock.readings - 2 * tracker.scans  # each scan reads it at its start and its end


def jittered(steps: int, step_s: float, seed: int = 0) -> list[float]:
    """Steps of `step_s` ± 30 %."""
    rng = random.Random(seed)
    return [step_s * (0.7 + 0.6 * rng.random()) for _ in range(steps)]


def test_most_steps_do_not_read_the_clock_and_the_scans_come_at_the_same_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    times = jittered(300_000, 0.0002)  # a minute of 0.2 ms steps
    scans, readings = run_loop(times, monkeypatch, read_every_step=False)
    every_step, readings_every_step = run_loop(times, monkeypatch, read_every_step=True)
    assert readings_every_step == len(times)
    assert [s for s, _ in scans] == [s for s, _ in every_step]
    assert len(scans) > 20
    assert readings < 0.05 * len(times), f"{readings} readings in {len(times)} steps"


@pytest.mark.parametrize("jump_at", [0.0, 0.5, 0.97, 0.99])
def test_a_scan_after_the_steps_turn_100x_slower_is_late_by_at_most_a_sampler_interval(
    monkeypatch: pytest.MonkeyPatch, jump_at: float
) -> None:
    """Steps of 0.1 ms, then 10 ms from a point in a wait about 4 s into the run (right after its first
    reading, halfway, near its end): the countdown to the next reading was made for the fast steps, but the
    sampler thread's reading sees the scan's time come, so the scan that ends the wait is at most one of its
    intervals (and a step) later than with a reading at every step. Without it, far later."""
    fast_s, slow_s, interval_s = 0.0001, 0.01, 0.1
    steady, _ = run_loop([fast_s] * 100_000, monkeypatch, read_every_step=True)
    before = next(i for i, (_, t) in enumerate(steady) if t >= 4.0)
    (last_step, last_s), (next_step, _) = steady[before], steady[before + 1]
    jump_step = last_step + 2 + int(jump_at * (next_step - last_step - 2))  # step 1 of the wait reads the clock
    times = [fast_s] * (jump_step - 1) + [slow_s] * 1000
    scans, _ = run_loop(times, monkeypatch, read_every_step=False, sampler_interval_s=interval_s)
    unwatched, _ = run_loop(times, monkeypatch, read_every_step=False)
    every_step, _ = run_loop(times, monkeypatch, read_every_step=True)
    assert scans[: before + 1] == every_step[: before + 1]
    (_, due_s), (_, came_s) = every_step[before + 1], scans[before + 1]
    assert due_s - last_s > 0.5  # a wait long enough for the countdown to matter
    assert came_s - due_s <= interval_s + slow_s, (came_s - due_s, due_s - last_s)
    if jump_at < 0.9:  # early in the wait, the countdown alone overshoots by far more than an interval
        assert len(unwatched) <= before + 1 or unwatched[before + 1][1] - due_s > 2 * interval_s


@pytest.mark.parametrize("scan_s", [0.0005, 0.003])
def test_step_paced_scans_come_at_the_same_steps_also_after_a_new_step_clock(
    monkeypatch: pytest.MonkeyPatch, scan_s: float
) -> None:
    """Cheap scans: at steps 1, 2, 4, ...; dearer ones (no start allowance): each waits for the budget.
    Then a better step clock restarts the steps and the step-paced scans start over; its steps are 4x
    longer (four forward calls to an optimizer step), which the first reading of the new clock measures."""
    times = jittered(20_000, 0.0001, seed=1) + jittered(20_000, 0.0004, seed=2)
    scans, readings = run_loop(times, monkeypatch, read_every_step=False, scan_s=scan_s, restart_at=20_000,
                               start_allowance_s=0.03 if scan_s < 0.001 else 0.0)
    every_step, _ = run_loop(times, monkeypatch, read_every_step=True, scan_s=scan_s, restart_at=20_000,
                             start_allowance_s=0.03 if scan_s < 0.001 else 0.0)
    steps = [s for s, _ in scans]
    assert steps == [s for s, _ in every_step]
    if scan_s < 0.001:
        assert steps[:6] == [1, 2, 4, 8, 16, 32] and steps.count(1) == 2  # the new clock's step 1 too
    else:
        assert steps[1] > 100  # the second waited for the budget
    assert readings < 0.5 * len(times)
