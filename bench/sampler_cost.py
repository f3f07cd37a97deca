"""What the sampler thread costs a running loop: its own CPU, the training thread's wait for the GIL at
each of its readings, and the leak finder's scans' share of the run's CPU.

1. CPU shares. A default session (the leak finder and the flight recorder on) watches the tiny loop of the
   benchmarks (16-16-1 MLP, batch 8, SGD) for `seconds`: the sampler thread's CPU time, and the scans'
   (on the training thread), over the process's CPU time in that stretch. The namespace the scans walk is
   the loop's own: its step function, model, optimizer and batch.
2. The GIL. A Python loop on the training thread reads the clock as fast as it can; every gap longer than
   `STALL_S` is a stall (the thread did not run). With a session and without it, alternately, for the
   same time: the difference of the stalls' sum, over the session's readings, is what a reading makes the
   training thread wait. A reading keeps the GIL through its /proc reads on purpose (the training thread
   waits once a reading, not once per system call), so this is about the reading's own time.

Run: python bench/sampler_cost.py [seconds]   (default 10 s each part)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from torchmem_magic import MemwatchSession
from torchmem_magic.core.options import DEFAULT_INTERVAL_MS, SessionOptions
from torchmem_magic.finder.leak_finder import LeakSearch
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.flight.recorder import FlightRecorder

STALL_S = 20e-6  # a gap in the spinning loop longer than this: the thread did not run
ROUNDS = 3  # bare and watched spins, alternately


def _session(roots: list[Root], interval_ms: float) -> MemwatchSession:
    records = Path(tempfile.mkdtemp(prefix="torchmem-bench-sampler-"))
    return MemwatchSession(SessionOptions(interval_ms), search=LeakSearch(lambda: roots),
                           recorder=FlightRecorder("bench", directory=records))


def cpu_shares(seconds: float, interval_ms: float = DEFAULT_INTERVAL_MS) -> dict[str, float]:
    """The sampler thread's and the scans' CPU, in percent of a core and of the process's CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(8, 16)

    def step() -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    session = _session([Root("train_step", "user", "train_step", step)], interval_ms)
    wall_s, process_cpu_s = time.perf_counter(), time.process_time()
    with session:
        deadline_s = time.perf_counter() + seconds
        while time.perf_counter() < deadline_s:
            step()
    wall_s, process_cpu_s = time.perf_counter() - wall_s, time.process_time() - process_cpu_s
    sampler_s = session._sampler.cpu_s if session._sampler is not None else 0.0
    scans_s = session.finder.spent_s if session.finder is not None else 0.0
    return {
        "sampler_core_pct": 100 * sampler_s / wall_s,
        "scans_run_pct": 100 * scans_s / process_cpu_s,
        "readings": float(session.timeline.by_time.count),
        "steps": float(session.step_counter.steps),
    }


def _stalls(seconds: float) -> float:
    """Seconds of gaps longer than STALL_S in a loop that reads the clock for `seconds`."""
    clock = time.perf_counter
    stalled = 0.0
    last = start = clock()
    end = start + seconds
    while last < end:
        now = clock()
        if now - last > STALL_S:
            stalled += now - last
        last = now
    return stalled


def gil_wait(seconds: float, interval_ms: float = DEFAULT_INTERVAL_MS) -> dict[str, float]:
    """The training thread's wait per reading: stalls with a session minus stalls without, per reading."""
    bare, watched, readings = [], [], []
    for _ in range(ROUNDS):
        bare.append(_stalls(seconds / ROUNDS))
        session = _session([], interval_ms)
        with session:
            watched.append(_stalls(seconds / ROUNDS))
        readings.append(session.timeline.by_time.count)
    excess_s = sum(watched) - sum(bare)
    return {
        "wait_per_reading_us": 1e6 * max(0.0, excess_s) / max(1, sum(readings)),
        "stalled_bare_ms": 1e3 * statistics.fmean(bare),
        "stalled_watched_ms": 1e3 * statistics.fmean(watched),
        "readings": float(sum(readings)),
    }


def main(argv: list[str]) -> None:
    seconds = float(argv[1]) if len(argv) > 1 else 10.0
    torch.set_num_threads(1)
    shares: dict[str, Any] = cpu_shares(seconds)
    print(f"sampler thread: {shares['sampler_core_pct']:.3f} % of a core; leak finder scans: "
          f"{shares['scans_run_pct']:.3f} % of the run's CPU ({shares['readings']:.0f} readings, "
          f"{shares['steps']:.0f} steps in {seconds:g} s at {DEFAULT_INTERVAL_MS:g} ms)")
    waits = gil_wait(seconds)
    print(f"training thread's wait for the GIL: {waits['wait_per_reading_us']:.1f} µs a reading "
          f"(stalls {waits['stalled_bare_ms']:.2f} ms bare, {waits['stalled_watched_ms']:.2f} ms watched, "
          f"{waits['readings']:.0f} readings)")


if __name__ == "__main__":
    main(sys.argv)
