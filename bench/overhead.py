"""How much does %%memwatch slow a training loop? Interleaved runs, medians of per-round ratios.

Each round runs every configuration once (order rotated per round) on the same workload and
records the time per optimizer step; overhead = median over rounds of (config / baseline) - 1.
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


def time_per_step(step: Callable[[], None], steps: int, config: str) -> float:
    for _ in range(20):
        step()  # warm-up outside the timed region
    with _context(config):
        started = time.perf_counter()
        for _ in range(steps):
            step()
        elapsed = time.perf_counter() - started
    return elapsed / steps


CONFIGS = ("baseline", "memwatch 100 ms (default)", "memwatch 100 ms + live figure", "memwatch 10 ms")


def run(rounds: int = 9) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    results = []
    for workload in ("tiny MLP (Python-bound)", "MLP 256-1024-10, batch 128"):
        step, steps = make_workload(workload)
        samples: dict[str, list[float]] = {c: [] for c in CONFIGS}
        for r in range(rounds):
            order = CONFIGS[r % len(CONFIGS):] + CONFIGS[: r % len(CONFIGS)]
            for config in order:
                samples[config].append(time_per_step(step, steps, config))
        base = samples["baseline"]
        for config in CONFIGS:
            ratios = [s / b for s, b in zip(samples[config], base)]
            results.append(
                {
                    "workload": workload,
                    "config": config,
                    "ms_per_step": statistics.median(samples[config]) * 1e3,
                    "overhead_pct": (statistics.median(ratios) - 1) * 100,
                    "steps_per_s": 1 / statistics.median(samples[config]),
                }
            )
    return results


if __name__ == "__main__":
    for row in run():
        print(row)
