"""How much does %%memwatch slow a training loop? Interleaved runs, medians of per-round ratios.

Each round times baseline, configuration, baseline back to back on the same workload (A-B-A, so
drift of the machine cancels); overhead = median over rounds of config / mean(baselines) - 1, with the
quartiles of those ratios (how much the machine's noise allows one to say). Beside it, the CPU time
memwatch itself used (its sampler thread and the step samples), which noise does not blur.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from torchmem_magic import MemwatchSession
from torchmem_magic.flight.recorder import FlightRecorder
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.finder.leak_finder import LeakSearch


def make_workload(name: str) -> tuple[Callable[[], None], int]:
    """A training step and the number of steps per timed run."""
    torch.manual_seed(0)
    if name == "tiny MLP (Python-bound)":
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        batch, steps = torch.randn(16, 32), 8000
    else:  # "MLP 256-1024-10, batch 128"
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        batch, steps = torch.randn(128, 256), 800
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    return step, steps


RECORDS = Path(tempfile.mkdtemp(prefix="torchmem-bench-records-"))


def _context(config: str, step: Callable[[], None]) -> Any:
    if config == "baseline":
        return nullcontext()
    interval_ms = 100.0 if config.startswith("memwatch 100 ms") else 10.0
    listener = None
    if config.endswith("+ live figure"):
        from torchmem_magic.widgets.live import LiveFigure

        listener = LiveFigure()
    # the leak finder and the flight recorder on, as in %%memwatch: the roots are what the step function
    # holds (model, optimizer, batch); the record goes to a directory of the benchmark's own
    recorder = FlightRecorder("bench", directory=RECORDS)
    return MemwatchSession(SessionOptions(interval_ms), search=LeakSearch(lambda: [Root("train_step", "user", "train_step", step)]), listener=listener, recorder=recorder)


#: untimed steps inside the block, half a timed run's: memwatch's one-offs (the dense samples of the first
#: 64 steps, the leak finder's first scans, front-loaded by design) fall there and are reported on their own
START_SHARE = 0.5


def time_per_step(step: Callable[[], None], steps: int, config: str) -> tuple[float, float | None, float | None]:
    """(seconds per step in the steady state, memwatch's own CPU time as a share of it, and the CPU
    seconds of its dense start); the shares are None for the baseline.

    Both configurations run the same untimed first steps inside the block, so the timed region is a
    long training run's steady state; the dense start's one-off cost is measured separately.
    """
    for _ in range(20):
        step()  # warm-up outside the block
    context = _context(config, step)
    with context:
        for _ in range(int(steps * START_SHARE)):
            step()
        dense_cpu_s = context.own_cpu_s if isinstance(context, MemwatchSession) else 0.0
        started = time.perf_counter()
        for _ in range(steps):
            step()
        elapsed = time.perf_counter() - started
    if not isinstance(context, MemwatchSession):
        return elapsed / steps, None, None
    # the sampler thread's CPU is known only in total: all of it is charged to the timed region
    return elapsed / steps, (context.own_cpu_s - dense_cpu_s) / elapsed, dense_cpu_s


CONFIGS = ("baseline", "memwatch 100 ms (default)", "memwatch 100 ms + live figure", "memwatch 10 ms")


WORKLOADS = ("tiny MLP (Python-bound)", "MLP 256-1024-10, batch 128")


def run(rounds: int = 5, workloads: tuple[str, ...] = WORKLOADS, configs: tuple[str, ...] = CONFIGS[1:]) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    results = []
    for workload in workloads:
        step, steps = make_workload(workload)
        baselines: list[float] = []
        for config in configs:
            ratios, timings, own_shares, dense_costs = [], [], [], []
            for _ in range(rounds):
                before, _, _ = time_per_step(step, steps, "baseline")
                timing, own_share, dense_cpu_s = time_per_step(step, steps, config)
                after, _, _ = time_per_step(step, steps, "baseline")
                baselines += [before, after]
                timings.append(timing)
                own_shares.append(own_share or 0.0)
                dense_costs.append(dense_cpu_s or 0.0)
                ratios.append(timing / ((before + after) / 2))
            quartiles = statistics.quantiles(ratios, n=4)
            results.append(
                {
                    "workload": workload,
                    "config": config,
                    "ms_per_step": statistics.median(timings) * 1e3,
                    "overhead_pct": (statistics.median(ratios) - 1) * 100,
                    "overhead_iqr_pct": ((quartiles[0] - 1) * 100, (quartiles[2] - 1) * 100),
                    "own_cpu_pct": statistics.median(own_shares) * 100,
                    "dense_start_ms": statistics.median(dense_costs) * 1e3,
                }
            )
        results.insert(
            len(results) - len(configs),
            {"workload": workload, "config": "baseline", "ms_per_step": statistics.median(baselines) * 1e3,
             "overhead_pct": 0.0, "overhead_iqr_pct": (0.0, 0.0), "own_cpu_pct": 0.0, "dense_start_ms": 0.0},
        )
    return results


if __name__ == "__main__":
    for row in run():
        print(row)
