"""What memwatch runs on the training thread, a step: its Python calls and lines, counted (not timed).

Counted with `sys.settrace` on the training thread over `COUNTED_STEPS` steps, once the step clock has
settled (`SETTLE_STEPS` steps after the session began, the dense start and the first scans among them):
a call is a frame of the package's own code, a line a line event in one. Two parts are told apart:

* the step path: the hooks, and what runs at the steps something is due at (a sampled step, a scan's clock
  reading, a request), amortised over all the steps;
* the leak finder's scans, which run between two steps on the same thread: their count depends on time
  (each waits a quarter of the run so far, within 1 % of it), so they weigh more early in a run than later.

Counts, not times: a busy machine gives nearly the same figures (only when a scan comes depends on time), so
`make bench-check` can hold them tightly. The sampler thread's own work is not on the training thread and
not counted here.

Two loops, as the docs' benchmarks run them: a plain loop (16-16-1 MLP, batch 8, SGD) and a DataLoader
loop over the same model (2 worker processes, a Python-bound dataset). The session is the default one:
the leak finder and the flight recorder on; the finder's roots hold the loop's step function (its model,
optimizer and batches).

Run: python bench/step_counts.py [--long]   (--long: also a window 20,000 steps into the run)
"""

from __future__ import annotations

import gc
import sys
import tempfile
from collections.abc import Callable, Generator
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import torchmem_magic
from torchmem_magic import MemwatchSession
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.finder.holder_tracking import HolderTracker
from torchmem_magic.finder.leak_finder import LeakSearch
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.flight.recorder import FlightRecorder

PACKAGE_DIR = str(Path(torchmem_magic.__file__).resolve().parent)
SETTLE_STEPS = 1000
COUNTED_STEPS = 2000
LONG_SETTLE_STEPS = LONG_COUNTED_STEPS = 20_000
LOOPS = ("plain loop", "DataLoader loop")
PARTS = ("step path", "scans")
_SCAN = HolderTracker.scan.__code__


class _Numbers(Dataset[torch.Tensor]):
    """A Python-bound dataset: each item built from a list of floats."""

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float((index * 7 + k) % 13) for k in range(16)])


class _Counter:
    """Calls and lines of the package's own frames on the thread it is set on, by part (see the docstring)."""

    def __init__(self) -> None:
        self.calls = dict.fromkeys(PARTS, 0)
        self.lines = dict.fromkeys(PARTS, 0)
        self.scan_depth = 0
        self.ours: dict[Any, bool] = {}  # code object -> whether it is the package's
        self.by_function: dict[str, list[int]] = {}  # "module.function" -> [calls, lines], the step path's

    def _is_ours(self, frame: FrameType) -> bool:
        code = frame.f_code
        known = self.ours.get(code)
        if known is None:
            known = self.ours[code] = code.co_filename.startswith(PACKAGE_DIR)
        return known

    def trace(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event != "call" or not self._is_ours(frame):
            return None  # no local tracing of the user's or torch's frames
        if frame.f_code is _SCAN:
            self.scan_depth += 1
        if self.scan_depth:
            self.calls["scans"] += 1
            return self._local_in_scan
        self.calls["step path"] += 1
        self._of(frame)[0] += 1
        return self._local

    def _of(self, frame: FrameType) -> list[int]:
        code = frame.f_code
        name = f"{Path(code.co_filename).stem}.{getattr(code, 'co_qualname', code.co_name)}"  # co_qualname: 3.11+
        return self.by_function.setdefault(name, [0, 0])

    def _local(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event == "line":
            self.lines["step path"] += 1
            self._of(frame)[1] += 1
        return self._local

    def _local_in_scan(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event == "line":
            self.lines["scans"] += 1
        elif event == "return" and frame.f_code is _SCAN:
            self.scan_depth -= 1
        return self._local_in_scan


def _batches(loop: str) -> Generator[torch.Tensor, None, None]:
    if loop == "plain loop":
        batch = torch.randn(8, 16)
        while True:
            yield batch
    loader = DataLoader(_Numbers(), batch_size=8, num_workers=2, persistent_workers=True)
    while True:
        yield from loader


def counts(loop: str, settle_steps: int = SETTLE_STEPS, counted_steps: int = COUNTED_STEPS) -> dict[str, Any]:
    """Calls and lines of memwatch a step on `loop`, averaged over `counted_steps` settled steps: of the
    step path ("calls", "lines"), of the scans ("scan calls", "scan lines"), and where the step path's lines
    are (the functions with the most, lines a step each)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = _batches(loop)

    def step() -> None:
        batch = next(batches)
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    counter = _Counter()
    records = tempfile.mkdtemp(prefix="torchmem-bench-counts-")
    search = LeakSearch(lambda: [Root("train_step", "user", "train_step", step)])
    with MemwatchSession(SessionOptions(), search=search, recorder=FlightRecorder("bench", directory=Path(records))):
        for _ in range(settle_steps):
            step()
        sys.settrace(counter.trace)
        try:
            for _ in range(counted_steps):
                step()
        finally:
            sys.settrace(None)
    batches.close()  # the DataLoader's workers end here: later benchmarks in this process read no children
    gc.collect()
    top = sorted(counter.by_function.items(), key=lambda item: -item[1][1])[:8]
    where = ", ".join(f"{name} {lines / counted_steps:.1f}" for name, (_, lines) in top)
    return {
        "calls": counter.calls["step path"] / counted_steps, "lines": counter.lines["step path"] / counted_steps,
        "scan calls": counter.calls["scans"] / counted_steps, "scan lines": counter.lines["scans"] / counted_steps,
        "where": where,
    }


def main() -> None:
    torch.set_num_threads(1)
    windows = [(SETTLE_STEPS, COUNTED_STEPS)] + ([(LONG_SETTLE_STEPS, LONG_COUNTED_STEPS)] if "--long" in sys.argv else [])
    print("| loop | steps counted | step path: calls a step | lines a step | scans: calls a step | lines a step "
          "| where the step path's lines are (lines a step) |")
    print("|---|---|---|---|---|---|---|")
    for settle, counted in windows:
        for loop in LOOPS:
            f = counts(loop, settle, counted)
            print(f"| {loop} | {settle + 1:,}–{settle + counted:,} | {f['calls']:.2f} | {f['lines']:.1f} "
                  f"| {f['scan calls']:.2f} | {f['scan lines']:.1f} | {f['where']} |")


if __name__ == "__main__":
    main()
