"""What the live figure costs once the timeline is full, and how often it redraws over a long run.

Two parts, both through the real session, live view, sampler loop and live figure:

1. The live verdict's recompute on a full timeline (every series at its 2,000 rows, every resource the
   verdict judges, hundreds of epochs), and a whole redraw of the figure: median and p95 of repeated runs.
2. A simulated run (24 h by default) on an injected clock: the session's sampler loop (`Sampler.run_once`)
   is driven by hand instead of by its thread, the training loop's steps go through `MemwatchSession.tick`,
   and synthetic readings (a slow leak with noise) stand in for the probes, so a day of readings takes
   minutes. Each redraw's CPU cost is real (this machine's), so the figure's cap on its CPU share spaces
   the redraws as it would in a real run; the period between redraws is read on the simulated clock.

Run: python bench/live_cost.py [hours] [interval_ms]   (defaults: 24 h at 1,000 ms, then 50 s at 10 ms; the
day takes ~10 minutes: ~64,000 real redraws)
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchmem_magic.session import live_view
from torchmem_magic.core import resources
from torchmem_magic.tracing.hooks import LoaderPass
from torchmem_magic.session.live_view import LiveView
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.report.live_status import LIVE_VERDICT_ROWS, short_verdict
from torchmem_magic.session.run import MemwatchSession
from torchmem_magic.widgets.live import LiveFigure

MIB = float(1 << 20)
LEAK_BYTES_PER_STEP = 2048.0
#: the resources a GPU run reads (a CPU-only machine reads fewer: the recompute judges what has data)
JUDGED_COLUMNS = tuple(r.column for r in resources.RESOURCES if r.judged)


class FakeClock:
    """Seconds that pass only when the simulation says so."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class SyntheticProbes:
    """The session's real probes, but for the readings: a heap leaking LEAK_BYTES_PER_STEP with noise,
    every column the verdict judges filled (as on a GPU machine with DataLoader workers and /dev/shm)."""

    def __init__(self, real: Any, steps: Any, seed: int = 1) -> None:
        self._real, self._steps = real, steps
        self._random = random.Random(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _reading(self) -> dict[str, float]:
        heap = 400 * MIB + LEAK_BYTES_PER_STEP * self._steps.steps + self._random.gauss(0.0, 256 * 1024)
        values = {column: 100 * MIB + self._random.gauss(0.0, 64 * 1024) for column in JUDGED_COLUMNS}
        values.update({resources.HEAP.column: heap, resources.RSS.column: heap + 200 * MIB,
                       resources.RAM.column: heap + 300 * MIB, resources.WORKER_COUNT.column: 2.0})
        return values

    def background_row(self, running: bool) -> dict[str, float]:
        return self._reading()

    def step_row(self) -> dict[str, float]:
        return self._reading()


class TimedFigure(LiveFigure):
    """The live figure, noting when (simulated seconds) each redraw happened and its CPU cost."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self._clock = clock
        self.redraws_s: list[float] = []
        self.costs_s: list[float] = []

    def on_tick(self, view: LiveView) -> None:
        started = time.thread_time()
        super().on_tick(view)
        self.costs_s.append(time.thread_time() - started)
        self.redraws_s.append(self._clock())


@dataclass
class Simulation:
    """A session on a fake clock, its sampler loop and steps driven by `run`."""

    interval_ms: float
    steps_per_s: float = 20.0
    epoch_steps: int = 500
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        self.figure = TimedFigure(self.clock)
        options = SessionOptions(self.interval_ms, watch_ranks=False, train_hooks=False)
        self.session = MemwatchSession(options, listener=self.figure, clock=self.clock)
        self.session.start()
        self.sampler = self.session._sampler
        assert self.sampler is not None
        self.sampler.stop()  # its thread ends: this simulation runs the same loop on the fake clock
        self.session.probes = SyntheticProbes(self.session.probes, self.session.step_counter)  # type: ignore[assignment]
        self.sampler.begin()

    def run(self, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        """Advance the run by `seconds` (or until `until()`): steps at `steps_per_s`, the sampler's loop
        whenever it is due."""
        assert self.sampler is not None
        end_s = self.clock.now_s + seconds
        step_gap_s = 1.0 / self.steps_per_s
        next_step_s = self.clock.now_s
        wake_s = self.clock.now_s
        while self.clock.now_s < end_s and not until():
            if next_step_s <= wake_s:
                self.clock.now_s = next_step_s
                self._step()
                next_step_s += step_gap_s
            else:
                self.clock.now_s = wake_s
                wake_s = self.clock.now_s + self.sampler.run_once()

    def _step(self) -> None:
        session = self.session
        if session.steps % self.epoch_steps == 0:
            session.pass_started(LoaderPass(loader=1, workers=[], batches=self.epoch_steps))
        session.tick("optimizer")

    def stop(self) -> None:
        self.session.stop()


def _quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)]


def _timed_s(fn: Any, repeats: int) -> list[float]:
    """CPU seconds of each of `repeats` calls (CPU time: other processes on the machine do not count)."""
    out = []
    for _ in range(repeats):
        started = time.thread_time()
        fn()
        out.append(time.thread_time() - started)
    return out


def full_timeline_costs(repeats: int = 41) -> dict[str, Any]:
    """The recompute and the redraw on a full timeline: a simulated hour at 1 s, 20 steps a second, then
    on until the step rows stand one short of the capacity (the next row halves them)."""
    sim = Simulation(1000.0)
    try:
        sim.run(3600.0)
        view = sim.session.view
        assert view is not None
        timeline = view.timeline
        sim.run(24 * 3600.0, until=lambda: len(timeline.by_step) >= timeline.capacity - 1)

        def recompute() -> None:
            view._live = None  # forget the last verdict: the next call recomputes it
            view.live_verdict()

        def redraw() -> None:
            recompute()
            sim.figure.on_tick(view)

        verdict_s = _timed_s(recompute, repeats)
        redraw_s = _timed_s(redraw, repeats)
        bounded = view.live_verdict()
        setattr(live_view, "LIVE_VERDICT_ROWS", None)  # the same recompute over every row
        try:
            every_row_s = _timed_s(recompute, max(5, repeats // 4))
            unbounded = view.live_verdict()
        finally:
            setattr(live_view, "LIVE_VERDICT_ROWS", LIVE_VERDICT_ROWS)
        return {
            "rows": (len(timeline.by_step), len(timeline.by_time)), "epochs": len(timeline.epochs),
            "verdicts": (short_verdict(bounded), short_verdict(unbounded)) if bounded and unbounded else None,
            "verdict_s": verdict_s, "redraw_s": redraw_s, "every_row_s": every_row_s,
        }
    finally:
        sim.stop()


def simulated_run(hours: float, interval_ms: float) -> dict[str, Any]:
    """Redraw periods over a simulated run of `hours` (simulated seconds between two redraws)."""
    sim = Simulation(interval_ms)
    started = time.perf_counter()
    try:
        sim.run(hours * 3600.0)
    finally:
        sim.stop()
    redraws = sim.figure.redraws_s
    gaps = [b - a for a, b in zip(redraws, redraws[1:])]
    last_hour = [b - a for a, b in zip(redraws, redraws[1:]) if b >= redraws[-1] - min(3600.0, hours * 1800.0)]
    return {
        "hours": hours, "interval_ms": interval_ms, "redraws": len(redraws), "gaps_s": gaps, "late_gaps_s": last_hour,
        "costs_s": sim.figure.costs_s, "took_s": time.perf_counter() - started,
        "verdict": sim.session.report.verdict if sim.session.report is not None else None,
    }


def _span(hours: float) -> str:
    return f"{hours:g} h" if hours >= 1 else f"{hours * 3600:g} s"


def render(full: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    step_rows, time_rows = full["rows"]
    lines = [
        f"A full timeline ({step_rows:,} step rows, {time_rows:,} time rows, {full['epochs']:,} epochs, "
        f"{len(JUDGED_COLUMNS)} resources judged); CPU time, median of {len(full['verdict_s'])} (p95):",
        "",
        "| on the sampler thread | cost |",
        "|---|---|",
    ]
    for name, key in (
        (f"live verdict, one recompute (at most {LIVE_VERDICT_ROWS} rows a series)", "verdict_s"),
        ("a redraw with a recompute (the figure's on_tick)", "redraw_s"),
        ("the same recompute over every row (unbounded)", "every_row_s"),
    ):
        values = full[key]
        lines.append(f"| {name} | {statistics.median(values) * 1e3:.2f} ms ({_quantile(values, 0.95) * 1e3:.2f}) |")
    if full["verdicts"] is not None:
        lines += ["", f"Live verdict: {full['verdicts'][0]}; over every row: {full['verdicts'][1]}."]
    lines += [
        "",
        "Simulated runs on an injected clock (20 steps a second, an epoch every 500 steps); simulated seconds "
        "between two redraws of the live figure:",
        "",
        "| run | redraws | median gap | p99 gap | longest gap | longest, last hour | redraw CPU (median, p95) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        gaps, late, costs = run["gaps_s"], run["late_gaps_s"], run["costs_s"]
        lines.append(
            f"| {_span(run['hours'])} at {run['interval_ms']:g} ms | {run['redraws']:,} | {statistics.median(gaps):.2f} s | "
            f"{_quantile(gaps, 0.99):.2f} s | {max(gaps):.2f} s | {max(late):.2f} s | "
            f"{statistics.median(costs) * 1e3:.2f} ms ({_quantile(costs, 0.95) * 1e3:.2f}) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    hours = float(sys.argv[1]) if len(sys.argv) > 1 else 24.0
    interval_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 1000.0
    runs = [simulated_run(hours, interval_ms)]
    if len(sys.argv) <= 2:
        runs.append(simulated_run(50 / 3600, 10.0))  # the short cell at 10 ms that showed the long gaps
    print(render(full_timeline_costs(), runs))
