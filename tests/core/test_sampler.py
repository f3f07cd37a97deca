"""The sampler thread: its rate, and a live listener's rate adapting to what the listener costs."""

from __future__ import annotations

import time

from torchmem_magic.sampler import Sampler
from torchmem_magic.timeline import DecimatingSeries


def _run_for(seconds: float, on_tick_cpu_s: float, share: float | None = 0.004) -> tuple[int, int]:
    calls = []

    def on_tick() -> None:
        calls.append(time.monotonic())
        end = time.thread_time() + on_tick_cpu_s
        while time.thread_time() < end:  # a redraw that costs CPU
            pass

    sampler = Sampler(lambda: {"t_s": time.monotonic()}, DecimatingSeries(1000), 0.01, on_tick=on_tick, tick_period_s=0.02,
                      on_tick_share=share)
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    return len(calls), sampler.samples


def test_a_cheap_listener_runs_at_its_period_and_a_costly_one_is_spaced_to_its_share() -> None:
    cheap_calls, samples = _run_for(1.0, 0.0)
    assert cheap_calls >= 20 and samples >= 50  # every 20 ms (a loaded machine skips some)
    costly_calls, samples = _run_for(1.0, 0.004)  # 4 ms a call: at most ~0.4% of the time, so a second apart
    assert costly_calls <= 2 and samples >= 50  # the readings themselves keep their rate
    fixed_calls, _ = _run_for(1.0, 0.004, share=None)  # a rank's stream keeps its period whatever it costs
    assert fixed_calls >= 20
