"""Micro-costs of the hot paths."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from torchmem_magic import MemwatchSession
from torchmem_magic.tracing.hooks import TrainingHooks
from torchmem_magic.probes.heap import HeapProbe
from torchmem_magic.core.options import SessionOptions


def _median_us(fn: Any, n: int = 2000) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def hot_path_costs() -> dict[str, float]:
    session = MemwatchSession(SessionOptions(10_000.0))  # a long interval: the background thread stays out of the way
    with session:
        skipped_us = unsampled_step_us(session)

        def sampled_step() -> None:
            session.step_counter.sampling.sample_next()  # force a sample on this step
            session.tick("optimizer")

        sampled_us = _median_us(sampled_step)
        filing_us = _median_us(lambda: session.step_counter.file_rows(session.timeline, time.thread_time), n=1) / 2000  # files the 2,000 queued rows
        assert session.background is not None
        tick_us = _median_us(session.background.row, n=500)
    guarded_us = _guarded_sampled_step_us()
    module, x = torch.nn.Identity(), torch.zeros(1)
    bare_call_us = _median_us(lambda: module(x))
    forward_clock = TrainingHooks(lambda clock: None, lambda loader_pass: None)
    with forward_clock:
        hooked_call_us = _median_us(lambda: module(x))
    return {
        "a module call (nn.Identity), bare": bare_call_us,
        "a module call with the forward clock's hooks (loops without backward)": hooked_call_us,
        "step hook, step not sampled": skipped_us,
        "step hook, step sampled (training thread)": sampled_us,
        "step hook, step sampled, with the guard's check (training thread)": guarded_us,
        "filing one step row (sampler thread)": filing_us,
        "background tick (sampler thread)": tick_us,
        "heap read (mallinfo2), fresh process": _fresh_heap_read_us(),
        "heap read (mallinfo2), this process after the overhead runs": _median_us(HeapProbe().read),
    }


def unsampled_step_us(session: MemwatchSession, n: int = 2000) -> float:
    """The step hook's path on a step that is not sampled: what nearly every step of a long run pays."""
    return _median_us(lambda: session.tick("optimizer"), n)


def reference_us(n: int = 2000) -> float:
    """A fixed piece of Python (`sum(range(50))`) timed the same way as the hot paths: the machine's speed
    at that moment, to divide a hot path's time by."""
    return _median_us(lambda: sum(range(50)), n)


def unsampled_step_vs_reference(rounds: int = 7, n: int = 2000) -> tuple[float, float, float]:
    """(µs of the unsampled step path, µs of `reference_us`, median of their per-round ratios), the two
    timed in alternation, so that the machine's load at each moment weighs on both."""
    hook_us, ref_us, ratios = [], [], []
    with MemwatchSession(SessionOptions(10_000.0)) as session:
        for _ in range(rounds):
            hook_us.append(unsampled_step_us(session, n))
            ref_us.append(reference_us(n))
            ratios.append(hook_us[-1] / ref_us[-1])
    return statistics.median(hook_us), statistics.median(ref_us), statistics.median(ratios)


def _guarded_sampled_step_us() -> float:
    """A sampled step of a run with a guard, far from its thresholds: the step row, /dev/shm read now,
    and the guard's check of them."""
    with MemwatchSession(SessionOptions(10_000.0, guard=0.9)) as session:
        def sampled_step() -> None:
            session.step_counter.sampling.sample_next()
            session.tick("optimizer")

        return _median_us(sampled_step)


def _fresh_heap_read_us() -> float:
    """mallinfo2 walks every free chunk, so its cost depends on the heap's history: a new process."""
    code = (
        "import statistics, time; from torchmem_magic.probes.heap import HeapProbe; h = HeapProbe(); t = []\n"
        "for _ in range(2000):\n    s = time.perf_counter(); h.heap_bytes(); t.append(time.perf_counter() - s)\n"
        "print(statistics.median(t) * 1e6)"
    )
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(hot_path_costs())
