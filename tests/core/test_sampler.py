"""The sampler thread: its rate, and a live listener's rate adapting to what the listener costs."""

from __future__ import annotations

import time

import pytest

from torchmem_magic.tracing.sampler import Sampler
from torchmem_magic.core.timeline import DecimatingSeries


def _run_until(samples_wanted: int, on_tick_cpu_s: float, share: float | None = 0.004) -> tuple[int, int, float]:
    """(listener calls, readings, seconds) of a sampler at 10 ms with a listener due every 20 ms, run for at
    least a second and until it has taken `samples_wanted` readings: a loaded machine takes longer, and what
    is compared is the listener's calls against the readings and the seconds, never against a guessed count."""
    calls = []

    def on_tick() -> None:
        calls.append(time.monotonic())
        end = time.thread_time() + on_tick_cpu_s
        while time.thread_time() < end:  # a redraw that costs CPU
            pass

    sampler = Sampler(lambda: {"t_s": time.monotonic()}, DecimatingSeries(1000), 0.01, on_tick=on_tick, tick_period_s=0.02,
                      on_tick_share=share)
    started_s = time.monotonic()
    sampler.start()
    while time.monotonic() - started_s < 1.0 or sampler.samples < samples_wanted:
        time.sleep(0.01)
    sampler.stop()
    return len(calls), sampler.samples, time.monotonic() - started_s


def test_a_cheap_listener_runs_at_its_period_and_a_costly_one_is_spaced_to_its_share() -> None:
    cheap_calls, samples, _ = _run_until(50, 0.0)
    assert cheap_calls >= samples // 4  # every 20 ms against readings every 10 ms (a loaded machine skips some)
    costly_calls, samples, seconds = _run_until(50, 0.004)  # 4 ms a call: at most ~0.4% of the time, a second apart
    assert costly_calls <= 1 + seconds and samples >= 10 * costly_calls  # the readings themselves keep their rate
    fixed_calls, samples, _ = _run_until(50, 0.004, share=None)  # a rank's stream keeps its period whatever it costs
    assert fixed_calls >= samples // 4


def test_a_costly_listener_at_a_long_interval_still_ticks_every_max_period() -> None:
    # fake clocks, the loop driven by hand: a 10 s interval, a tick that costs 50 ms of CPU (its 0.4% share
    # alone would space the ticks 12.5 s apart) and a ceiling of 2 s between two ticks
    now, cpu = [0.0], [0.0]
    ticks: list[float] = []

    def on_tick() -> None:
        ticks.append(now[0])
        cpu[0] += 0.05

    sampler = Sampler(lambda: {"t_s": now[0]}, DecimatingSeries(1000), 10.0, on_tick=on_tick, tick_period_s=0.25,
                      on_tick_share=0.004, clock=lambda: now[0], tick_max_period_s=2.0, cpu_clock=lambda: cpu[0])
    sampler.begin()
    while now[0] < 60.0:
        now[0] += sampler.run_once()
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert sampler.samples == 6  # at 0, 10, ..., 50 s: the readings keep their interval
    assert len(ticks) >= 29 and max(gaps) <= 2.0 + 1e-9, gaps
    assert sampler.tick_period_s(0.05) == 2.0 and sampler.tick_period_s(0.0) == 0.25


def test_what_a_tick_hands_to_another_thread_counts_against_its_share() -> None:
    # fake clocks: each tick costs the sampler thread nothing but reports 4 ms spent on the training thread
    # (the redraw it asked for there at the tick before: the first reports none); at a 0.4% share that spaces
    # the ticks a second apart from the second on, as 4 ms of its own do
    now = [0.0]
    ticks: list[float] = []

    def on_tick() -> float:
        ticks.append(now[0])
        return 0.004 if len(ticks) > 1 else 0.0

    sampler = Sampler(lambda: {"t_s": now[0]}, DecimatingSeries(1000), 0.1, on_tick=on_tick, tick_period_s=0.25,
                      on_tick_share=0.004, clock=lambda: now[0], tick_max_period_s=2.0, cpu_clock=lambda: 0.0)
    sampler.begin()
    while now[0] < 30.0:
        now[0] += sampler.run_once()
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert gaps[0] == pytest.approx(0.25) and gaps[1:] == pytest.approx([1.0] * len(gaps[1:])), gaps
