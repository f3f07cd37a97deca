"""How much does %%memwatch slow a training loop? Interleaved runs, medians of per-round ratios.

Each round times baseline, configuration, baseline back to back on the same workload in one process (A-B-A,
so drift of the machine cancels): the process's CPU time per step (all its threads, the sampler's
included; what a busy machine blurs least) and its wall time per step. Overhead = median over rounds of
config / mean(baselines) - 1, with the quartiles of those ratios (how much the machine's noise allows one
to say). Beside it, the CPU time memwatch itself used (its sampler thread, the step samples and the scans).

Workloads: the tiny Python-bound MLP of the goals (16-16-1, batch 8, SGD), a compute-bound MLP, and the
tiny MLP fed by a DataLoader (2 worker processes, a Python-bound dataset, passes of 1,000 batches).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Generator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from torchmem_magic import MemwatchSession
from torchmem_magic.flight.recorder import FlightRecorder
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.finder.leak_finder import LeakSearch

TINY, BIG, LOADER = "tiny MLP (Python-bound)", "MLP 256-1024-10, batch 128", "DataLoader loop (2 workers)"
WORKLOADS = (TINY, BIG, LOADER)
LOADER_PASS_BATCHES = 1000


class _Numbers(Dataset[torch.Tensor]):
    """A Python-bound dataset: each item built from a list of floats."""

    def __len__(self) -> int:
        return 8 * LOADER_PASS_BATCHES

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float((index * 7 + k) % 13) for k in range(16)])


def _passes(loader: DataLoader[torch.Tensor]) -> Generator[torch.Tensor, None, None]:
    while True:
        yield from loader


@dataclass
class Workload:
    step: Callable[[], None]  # one training step
    steps: int  # steps per timed run
    close: Callable[[], None] = lambda: None  # its DataLoader's workers end here


def make_workload(name: str) -> Workload:
    torch.manual_seed(0)
    big = name == BIG
    width = 256 if big else 16
    model = (torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)) if big
             else torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(128 if big else 8, width)
    batches = _passes(DataLoader(_Numbers(), batch_size=8, num_workers=2, persistent_workers=True)) if name == LOADER else None

    def step() -> None:
        optimizer.zero_grad()
        model(next(batches) if batches is not None else batch).square().mean().backward()
        optimizer.step()

    return Workload(step, 800 if big else 8000, batches.close if batches is not None else lambda: None)


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


@dataclass(frozen=True)
class Timed:
    """One timed run: seconds per step, wall and process CPU; memwatch's own CPU as a share of the wall
    time and the CPU seconds of its start (None for the baseline)."""

    wall_s: float
    cpu_s: float
    own_share: float | None = None
    start_cpu_s: float | None = None


def time_per_step(step: Callable[[], None], steps: int, config: str) -> Timed:
    """One run in the steady state. Both configurations run the same untimed first steps inside the block,
    so the timed region is a long training run's steady state; the start's one-off cost is measured apart."""
    for _ in range(20):
        step()  # warm-up outside the block
    context = _context(config, step)
    with context:
        for _ in range(int(steps * START_SHARE)):
            step()
        start_cpu_s = context.own_cpu_s if isinstance(context, MemwatchSession) else 0.0
        wall_s, cpu_s = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        wall_s, cpu_s = time.perf_counter() - wall_s, time.process_time() - cpu_s
    if not isinstance(context, MemwatchSession):
        return Timed(wall_s / steps, cpu_s / steps)
    # the sampler thread's CPU is known only in total: all of it is charged to the timed region
    return Timed(wall_s / steps, cpu_s / steps, (context.own_cpu_s - start_cpu_s) / wall_s, start_cpu_s)


CONFIGS = ("baseline", "memwatch 100 ms (default)", "memwatch 100 ms + live figure", "memwatch 10 ms")


def _pct(ratios: list[float]) -> tuple[float, tuple[float, float]]:
    """The median ratio and its quartiles, as percent over 1."""
    quartiles = statistics.quantiles(ratios, n=4)
    return (statistics.median(ratios) - 1) * 100, ((quartiles[0] - 1) * 100, (quartiles[2] - 1) * 100)


def _rounds(workload: Workload, config: str, rounds: int, baselines: list[Timed]) -> dict[str, Any]:
    """`rounds` A-B-A rounds of `config` against the baseline; the baselines' runs are added to `baselines`."""
    runs, wall_ratios, cpu_ratios = [], [], []
    for _ in range(rounds):
        before = time_per_step(workload.step, workload.steps, "baseline")
        run = time_per_step(workload.step, workload.steps, config)
        after = time_per_step(workload.step, workload.steps, "baseline")
        baselines += [before, after]
        runs.append(run)
        wall_ratios.append(run.wall_s / ((before.wall_s + after.wall_s) / 2))
        cpu_ratios.append(run.cpu_s / ((before.cpu_s + after.cpu_s) / 2))
    (overhead, iqr), (cpu_overhead, cpu_iqr) = _pct(wall_ratios), _pct(cpu_ratios)
    return {
        "config": config, "ms_per_step": statistics.median(r.wall_s for r in runs) * 1e3,
        "overhead_pct": overhead, "overhead_iqr_pct": iqr, "cpu_overhead_pct": cpu_overhead, "cpu_overhead_iqr_pct": cpu_iqr,
        "own_cpu_pct": statistics.median(r.own_share or 0.0 for r in runs) * 100,
        "dense_start_ms": statistics.median(r.start_cpu_s or 0.0 for r in runs) * 1e3,
    }


def run(rounds: int = 5, workloads: tuple[str, ...] = WORKLOADS, configs: tuple[str, ...] = CONFIGS[1:]) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    results = []
    for name in workloads:
        workload = make_workload(name)
        baselines: list[Timed] = []
        try:
            rows = [{"workload": name, **_rounds(workload, config, rounds, baselines)} for config in configs]
        finally:
            workload.close()
        results.append({
            "workload": name, "config": "baseline", "ms_per_step": statistics.median(b.wall_s for b in baselines) * 1e3,
            "overhead_pct": 0.0, "overhead_iqr_pct": (0.0, 0.0), "cpu_overhead_pct": 0.0, "cpu_overhead_iqr_pct": (0.0, 0.0),
            "own_cpu_pct": 0.0, "dense_start_ms": 0.0,
        })
        results += rows
    return results


if __name__ == "__main__":
    import sys

    chosen = tuple(w for w in WORKLOADS if any(arg in w for arg in sys.argv[1:])) or WORKLOADS
    for row in run(workloads=chosen):
        print(row)
