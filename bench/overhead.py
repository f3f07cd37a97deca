"""How much does %%memwatch slow a training loop? Interleaved runs, medians of per-round ratios.

Each round times baseline, configuration, baseline back to back on the same workload (A-B-A, so
drift of the machine cancels); overhead = median over rounds of config / mean(baselines) - 1, with the
quartiles of those ratios (how much the machine's noise allows one to say). Beside it, the CPU time
memwatch itself used (its sampler thread and the step samples), which noise does not blur.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from torchmem_magic import MemwatchSession


def make_workload(name: str) -> tuple[Callable[[], None], int]:
    """A training step and the number of steps per timed run."""
    torch.manual_seed(0)
    if name == "tiny MLP (Python-bound)":
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        batch, steps = torch.randn(16, 32), 1500
    else:  # "MLP 256-1024-10, batch 128"
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        batch, steps = torch.randn(128, 256), 300
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    return step, steps


def _context(config: str) -> Any:
    if config == "baseline":
        return nullcontext()
    interval_ms = 100.0 if config.startswith("memwatch 100 ms") else 10.0
    listener = None
    if config.endswith("+ live figure"):
        from torchmem_magic.render.live import LiveFigure

        listener = LiveFigure()
    return MemwatchSession(interval_ms, listener=listener)


def time_per_step(step: Callable[[], None], steps: int, config: str) -> tuple[float, float | None]:
    """(seconds per step, memwatch's own CPU time as a share of the run, or None for the baseline)."""
    for _ in range(20):
        step()  # warm-up outside the timed region
    context = _context(config)
    with context:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        elapsed = time.perf_counter() - started
    own_share = context.own_cpu_s / elapsed if isinstance(context, MemwatchSession) else None
    return elapsed / steps, own_share


CONFIGS = ("baseline", "memwatch 100 ms (default)", "memwatch 100 ms + live figure", "memwatch 10 ms")


def run(rounds: int = 9) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    results = []
    for workload in ("tiny MLP (Python-bound)", "MLP 256-1024-10, batch 128"):
        step, steps = make_workload(workload)
        baselines: list[float] = []
        for config in CONFIGS[1:]:
            ratios, timings, own_shares = [], [], []
            for _ in range(rounds):
                before, _ = time_per_step(step, steps, "baseline")
                timing, own_share = time_per_step(step, steps, config)
                after, _ = time_per_step(step, steps, "baseline")
                baselines += [before, after]
                timings.append(timing)
                own_shares.append(own_share or 0.0)
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
                }
            )
        results.insert(
            len(results) - len(CONFIGS) + 1,
            {"workload": workload, "config": "baseline", "ms_per_step": statistics.median(baselines) * 1e3,
             "overhead_pct": 0.0, "overhead_iqr_pct": (0.0, 0.0), "own_cpu_pct": 0.0},
        )
    return results


if __name__ == "__main__":
    for row in run():
        print(row)
