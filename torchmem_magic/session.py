"""One memwatch run: probes + sampler thread + torch hooks, started and stopped as a unit.

The cell magic and the script API (`with memwatch(): ...`) both drive `MemwatchSession`; the magic
only adds rendering. Stopping always removes hooks and joins the thread before anything else, so
nothing is left behind after an exception or KeyboardInterrupt.
"""

from __future__ import annotations

import functools
import gc
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .analysis import growth_per_step
from .detect import Series, Verdict, decide
from .forensics import explain_worker_death, parse_worker_death, shm_warning
from .model import (
    HeapSummary,
    RamSummary,
    Report,
    ShmSummary,
    Status,
    Suspect,
    VramSummary,
    WorkerSummary,
)
from .scan.results import Budget, Root
from .scan.scanner import scan_roots
from .suspects import baseline_of, suspects_from_scan
from .timeline import NAN, Timeline

DEFAULT_INTERVAL_MS = 100.0
STEP_BUDGET = 0.003  # the step-aligned sample may cost at most ~0.3% of a step (measured cost; cache effects double it)
MAX_STEP_STRIDE = 1024
DENSE_STEPS = 64  # the first steps are all sampled, so a verdict forms within a few dozen steps ...
DENSE_COST_S = 0.02  # ... as long as that one-off costs under 20 ms; past it, at most 5% of a step: glibc's
DENSE_BUDGET = 0.05  # mallinfo2 walks every free chunk: dearer the more a process has churned (bench/costs.py)
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 1.0, 10_000.0
LIVE_VERDICT_STEPS = 30
RATE_COLUMNS = {"ram": "ram_bytes", "heap": "heap_bytes", "vram": "vram_allocated_bytes", "shm": "shm_used_bytes"}
LIVE_VERDICT_PERIOD_S = 1.0
START_SCAN_BUDGET = Budget(time_s=0.3)  # before the cell: only per-name totals are needed
END_SCAN_BUDGET = Budget(time_s=1.0)


class StopTraining(KeyboardInterrupt):
    """Raised at an optimizer-step boundary when the user asked to stop (the Stop button).

    A KeyboardInterrupt, so `except Exception` in user code does not swallow it; %%memwatch ends
    the cell quietly after reporting.
    """


class Listener(Protocol):
    """Receives live updates. `on_tick` runs on the sampler thread only (one writer);
    `on_finish` runs on the caller's thread after the sampler has stopped."""

    tick_period_s: float

    def on_tick(self, session: MemwatchSession) -> None: ...

    def on_finish(self, session: MemwatchSession, report: Report) -> None: ...


@dataclass(frozen=True)
class LiveStatus:
    """What the one-line live status shows; sizes in bytes, NaN where absent."""

    elapsed_s: float
    steps: int
    epochs: int
    ram_bytes: float
    heap_bytes: float
    vram_allocated_bytes: float
    vram_reserved_bytes: float
    shm_used_bytes: float
    workers: int
    ram_per_step: float | None
    heap_per_step: float | None
    vram_per_step: float | None
    verdict: str | None = None  # the verdict as it forms (from LIVE_VERDICT_STEPS steps on)

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s > 0 else 0.0


class _Registry:
    """The one active session and the last report (what `last_report()` returns)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: MemwatchSession | None = None
        self.last: Report | None = None


_registry = _Registry()


def last_report() -> Report | None:
    """The Report of the most recent `%%memwatch` cell or `memwatch()` block, or None."""
    return _registry.last


def active_session() -> MemwatchSession | None:
    return _registry.active


def validate_interval_ms(interval_ms: float) -> float:
    if not isinstance(interval_ms, (int, float)) or math.isnan(interval_ms) or not (
        MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS
    ):
        raise ValueError(
            f"interval must be between {MIN_INTERVAL_MS:g} and {MAX_INTERVAL_MS:g} ms, got {interval_ms!r}"
        )
    return float(interval_ms)


def _int_or(value: float, default: int = 0) -> int:
    return default if math.isnan(value) else int(value)


def _status_of(exc: BaseException | None) -> Status:
    if exc is None:
        return "ok"
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"


class MemwatchSession:
    """Samples memory while a block of code runs.

    Args:
        interval_ms: background sampling period (1–10,000 ms).
        device: CUDA device to watch ('cuda:1', '1'); None watches every device in use.
        shm_path: the shared-memory filesystem to watch.
        listener: live renderer (see `Listener`).
        print_report: print the text report when the block ends (the script API's default).
        roots: where the leak finder looks (called at start and end; None: no scan).
        sources: code in which a suspect's fix line is looked for.
    """

    def __init__(
        self,
        interval_ms: float = DEFAULT_INTERVAL_MS,
        device: str | int | None = None,
        shm_path: str = "/dev/shm",
        listener: Listener | None = None,
        print_report: bool = False,
        roots: Callable[[], list[Root]] | None = None,
        sources: list[str] | None = None,
    ) -> None:
        from .probes import parse_device

        self.interval_s = validate_interval_ms(interval_ms) / 1000.0
        self.devices = None if device is None else [parse_device(str(device))]
        self.shm_path = shm_path
        self.listener = listener
        self.print_report = print_report
        self._roots = roots
        self._sources = list(sources or [])
        self._baseline: dict[str, int] | None = None
        self._live_verdict_cache: tuple[float, str, dict[str, float]] | None = None
        self._requests: deque[Callable[[], None]] = deque()  # actions to run at the next step boundary
        self._stop_requested = False
        self._first_pass_batches: int | None = None
        self.timeline = Timeline()
        self.steps = 0
        self.report: Report | None = None
        self._started_s: float | None = None
        self._ended_s: float | None = None
        self._sampler: Any = None
        self._hooks: Any = None
        self._tree: Any = None
        self._children_bytes = 0.0
        self._workers_bytes = 0.0
        self._workers = 0
        self._max_workers = 0
        self._shm_used_bytes = NAN
        self._step_rows: deque[tuple[float, ...]] = deque(maxlen=100_000)  # drained every tick
        self._steps_to_sample = 1
        self._step_stride = 1
        self._step_cost_s = self._drain_cost_s = 0.0
        self._step_samples_cpu_s = 0.0
        self._last_step_sample_s: float | None = None
        self._last_sampled_step = 0

    # ------------------------------------------------------------------ sampling
    def _elapsed_s(self) -> float:
        return time.perf_counter() - (self._started_s or 0.0)

    def _background_row(self) -> tuple[float, ...]:
        """Sampler thread: the full reading, incl. children discovery and PSS at their slow rates."""
        self._drain_step_rows()
        tree = self._tree.tick()
        shm = self._shm.read()
        self._children_bytes = float(tree.ram_bytes - tree.rss_bytes)
        self._workers_bytes = float(tree.workers_bytes)
        self._workers = tree.workers
        self._max_workers = max(self._max_workers, tree.workers)
        self._shm_used_bytes = NAN if shm is None else float(shm.used_bytes)
        allocated, reserved = self._accelerator.read()
        return (
            self._elapsed_s(), float(self.steps), float(tree.ram_bytes), float(tree.rss_bytes),
            self._heap.read(), self._workers_bytes, float(tree.workers), allocated, reserved,
            self._shm_used_bytes,
        )

    def _on_step(self) -> None:
        """Optimizer step hook, on the training thread: must stay cheap.

        Reads only the ~1 µs counters (kernel RSS, heap, VRAM); children and shm come from the last
        background tick. The row is queued for the sampler thread, which does the bookkeeping. When
        steps are so fast that this would cost more than STEP_BUDGET of the step time, only every
        `stride`-th step is sampled (the series stays step-aligned, just thinner). The first
        DENSE_STEPS are all sampled while that costs under DENSE_COST_S, then within DENSE_BUDGET.
        """
        self.steps += 1
        if self._requests or self._stop_requested:
            self._run_requests()
        self._steps_to_sample -= 1
        if self._steps_to_sample > 0:
            return
        started = time.perf_counter()
        cpu_started = time.thread_time()  # CPU time: a wait for the GIL is not this sample's cost
        rss = float(self._tree.kernel_rss_bytes())
        allocated, reserved = self._accelerator.read()
        self._step_rows.append((
            started - (self._started_s or 0.0), float(self.steps), rss + self._children_bytes, rss,
            self._heap.read(), self._workers_bytes, float(self._workers), allocated, reserved,
            self._shm_used_bytes,
        ))
        cost_s = time.thread_time() - cpu_started
        previous, self._last_step_sample_s = self._last_step_sample_s, started
        steps_between, self._last_sampled_step = self.steps - self._last_sampled_step, self.steps
        self._step_cost_s = _smoothed(self._step_cost_s, cost_s)
        self._step_samples_cpu_s += cost_s
        step_s = 0.0 if previous is None else (started - previous) / steps_between
        dense = self.steps < DENSE_STEPS
        if dense and self._step_samples_cpu_s < DENSE_COST_S:
            self._step_stride = 1
        elif step_s > 0:  # from the second sampled step on: the first has no step period yet
            budget = DENSE_BUDGET if dense else STEP_BUDGET
            cost_s = self._step_cost_s + self._drain_cost_s
            self._step_stride = max(1, min(MAX_STEP_STRIDE, math.ceil(cost_s / (budget * step_s))))
        self._steps_to_sample = self._step_stride

    def request(self, action: Callable[[], None]) -> None:
        """Run `action` at the next optimizer-step boundary, on the training thread (thread-safe).

        This is how a button clicked mid-run acts without racing the training loop."""
        self._requests.append(action)

    def request_stop(self) -> None:
        """End the block at the next optimizer-step boundary (StopTraining); the report still renders."""
        self._stop_requested = True

    def _run_requests(self) -> None:
        while self._requests:
            action = self._requests.popleft()
            try:
                action()
            except Exception as exc:  # an action must never break the user's loop
                self._hooks.absorb_error(exc)
        if self._stop_requested:
            self._stop_requested = False
            raise StopTraining(f"stopped with the Stop button after step {self.steps}")

    def _drain_step_rows(self) -> None:
        """Sampler thread: file the queued step rows; what that costs per row counts against the budget."""
        rows, count = self._step_rows, 0
        started = time.thread_time()
        while rows:
            self.timeline.by_step.append(rows.popleft())
            count += 1
        if count:
            self._drain_cost_s = _smoothed(self._drain_cost_s, (time.thread_time() - started) / count)

    def _on_epoch(self, worker_pids: list[int], batches: int | None) -> None:
        self.timeline.add_epoch(self._elapsed_s(), self.steps)
        if worker_pids and batches and self._first_pass_batches is None:
            self._first_pass_batches = batches  # for the copy-on-access projection
        if worker_pids:
            self._tree.announce_workers(worker_pids)
            self._max_workers = max(self._max_workers, len(worker_pids))  # exact, even for short epochs

    def _on_tick(self) -> None:
        if self.listener is not None:
            self.listener.on_tick(self)

    @property
    def own_cpu_s(self) -> float:
        """CPU time memwatch itself used: step samples on the training thread plus the sampler thread
        (known once the session has stopped). The benchmarks compare it with the run's wall time."""
        return self._step_samples_cpu_s + (self._sampler.cpu_s if self._sampler is not None else 0.0)

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        return self._started_s is not None and self._ended_s is None

    def start(self) -> MemwatchSession:
        """Install probes, hooks and the sampler thread. RuntimeError if another session is active."""
        from .hooks import TrainingHooks
        from .probes import (
            AcceleratorProbe,
            HeapProbe,
            ProcessTreeProbe,
            ShmProbe,
            memory_limit,
            sharing_strategy,
        )
        from .sampler import Sampler

        with _registry.lock:
            if _registry.active is not None:
                raise RuntimeError("only one memwatch session can be active at a time")
            if self._started_s is not None:
                raise RuntimeError("a MemwatchSession can only be started once")
            _registry.active = self
        try:
            self._tree = ProcessTreeProbe()
            self._heap = HeapProbe()
            self._shm = ShmProbe(self.shm_path)
            self._accelerator = AcceleratorProbe(self.devices)
            self._limit = memory_limit()
            self._strategy_start = sharing_strategy()
            self._devices_start = {d.name: d for d in self._accelerator.details()}
            # cyclic garbage of earlier cells would otherwise be freed whenever the collector next runs,
            # as a drop in the middle of this cell's curves (seen to hide a per-epoch staircase)
            gc.collect()
            if self._roots is not None:  # what each name held before the cell: `new_in_cell`
                self._baseline = baseline_of(scan_roots(self._roots(), START_SCAN_BUDGET))
            self._started_s = time.perf_counter()
            self.timeline.by_time.append(self._background_row())
            self._hooks = TrainingHooks(self._on_step, self._on_epoch)
            self._hooks.install()
            self._sampler = Sampler(
                self._background_row,
                self.timeline.by_time,
                self.interval_s,
                on_tick=self._on_tick if self.listener is not None else None,
                tick_period_s=getattr(self.listener, "tick_period_s", 0.5),
            )
            self._sampler.start()
        except BaseException:
            self._teardown()
            raise
        return self

    def _teardown(self) -> None:
        """Remove hooks and stop the thread; idempotent, and first thing done on every exit path."""
        if self._hooks is not None:
            self._hooks.remove()
        if self._sampler is not None:
            self._sampler.stop()
        with _registry.lock:
            if _registry.active is self:
                _registry.active = None

    def stop(self, exc: BaseException | None = None) -> Report:
        """End the session (idempotent) and return its Report; `exc` is what ended the block, if anything.

        A DataLoader worker's death that torch's SIGCHLD handler raises into this method (it raises
        into whatever runs at that moment) is explained in the report and raised once the report
        exists (chained to `exc`), never lost; when `exc` is that death already, repeats are dropped.
        A death is the better explanation than what the loop saw of it (a reset connection, say).
        """
        if self.report is not None:
            return self.report
        interruptions: list[BaseException] = []
        try:
            _despite_worker_deaths(self._teardown, interruptions)
        finally:
            self._ended_s = time.perf_counter()

        def worker_death() -> BaseException | None:
            """A death seen here that is not what the block already raised."""
            if not interruptions or (exc is not None and parse_worker_death(str(exc)) is not None):
                return None
            return interruptions[0]

        def make_report() -> None:
            self._final_readings()
            ended_by = worker_death() or exc
            self.report = self._build_report(_status_of(ended_by), ended_by, self._find_suspects())

        try:
            _despite_worker_deaths(make_report, interruptions)
        finally:
            self._roots = None  # the provider may reference the user's namespace
            if self._tree is not None:
                self._tree.close()
        assert self.report is not None
        _registry.last = self.report
        if self.listener is not None:
            _despite_worker_deaths(lambda: self.listener.on_finish(self, self.report), interruptions)
        if self.print_report:
            print(self.report)
        death = worker_death()
        if death is not None:
            raise death from exc
        return self.report

    def _final_readings(self) -> None:
        """One last background reading, and a step-aligned one at the final step count if the
        adaptive stride skipped the last steps (a jump there must still be seen)."""
        row = self._background_row()  # also drains queued step rows
        self.timeline.by_time.append(row)
        if self.steps > self._last_sampled_step:
            self._last_sampled_step = self.steps
            self.timeline.by_step.append(row)

    def __enter__(self) -> MemwatchSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.stop(exc)

    # ------------------------------------------------------------------ results
    def live_status(self) -> LiveStatus:
        """A snapshot for the live status line (cheap: slopes over at most 256 step samples, then
        the live verdict's own rates, so the status line and the final report quote one estimator)."""
        by_time = self.timeline.by_time
        verdict, rates = self._live_verdict()
        return LiveStatus(
            elapsed_s=self._elapsed_s() if self._ended_s is None else self._ended_s - (self._started_s or 0.0),
            steps=self.steps,
            epochs=self.timeline.epoch_count,
            ram_bytes=by_time.last_value("ram_bytes"),
            heap_bytes=by_time.last_value("heap_bytes"),
            vram_allocated_bytes=by_time.last_value("vram_allocated_bytes"),
            vram_reserved_bytes=by_time.last_value("vram_reserved_bytes"),
            shm_used_bytes=by_time.last_value("shm_used_bytes"),
            workers=self._workers,
            ram_per_step=self._per_step(rates, "ram", 256),
            heap_per_step=self._per_step(rates, "heap", 256),
            vram_per_step=self._per_step(rates, "vram", 256),
            verdict=verdict,
        )

    def _per_step(self, rates: dict[str, float], resource: str, max_points: int = 1024) -> float | None:
        """Bytes per step of a resource: the detector's rate where it had enough steps, else the
        split-half slope of the step-aligned series (a first figure, before any verdict)."""
        if resource in rates:
            return rates[resource]
        return growth_per_step(self.timeline.by_step, RATE_COLUMNS[resource], max_points)

    def _live_verdict(self) -> tuple[str | None, dict[str, float]]:
        """A short verdict and the per-resource rates behind it, recomputed at most once a second
        (sampler thread); none before LIVE_VERDICT_STEPS."""
        if self.steps < LIVE_VERDICT_STEPS:
            return None, {}
        now = time.perf_counter()
        if self._live_verdict_cache is None or now - self._live_verdict_cache[0] >= LIVE_VERDICT_PERIOD_S:
            v = self.verdict(max_points=64)
            text = v.verdict if v.leak_kind is None else f"{v.verdict}: {v.leak_kind} in {v.resource}"
            self._live_verdict_cache = (now, text, _rates(v))
        return self._live_verdict_cache[1], self._live_verdict_cache[2]

    def verdict(
        self,
        vram_limit_bytes: float | None = None,
        shm_limit_bytes: float | None = None,
        graph_holders: list[str] | None = None,
        max_points: int = 200,
    ) -> Verdict:
        """The leak detector on this session's step-aligned series (see detect.py)."""
        columns = self.timeline.by_step.columns(
            "step", "heap_bytes", "ram_bytes", "rss_bytes", "workers_bytes", "vram_allocated_bytes",
            "vram_reserved_bytes", "shm_used_bytes",
        )
        steps = columns["step"]
        ram_limit = float(self._limit.limit_bytes)
        heap, ram = columns["heap_bytes"], columns["ram_bytes"]
        # the OOM killer counts resident memory: heap growth exhausts the headroom RSS has left
        rss_above_heap = ram[-1] - heap[-1] if len(heap) and heap[-1] == heap[-1] else 0.0
        series = [
            Series("heap", steps, heap, ram_limit - rss_above_heap),
            Series("ram", steps, ram, ram_limit),
            Series("rss", steps, columns["rss_bytes"], ram_limit),
        ]
        first_worker = next((i for i, v in enumerate(columns["workers_bytes"]) if v > 0), None)
        if first_worker is not None:  # from the first reading on: workers appearing is not growth
            series.append(Series("workers", steps[first_worker:], columns["workers_bytes"][first_worker:], ram_limit))
        if any(v == v for v in columns["vram_allocated_bytes"]):
            series.append(Series("vram", steps, columns["vram_allocated_bytes"], vram_limit_bytes))
            series.append(Series("vram_reserved", steps, columns["vram_reserved_bytes"], vram_limit_bytes))
        if any(v == v for v in columns["shm_used_bytes"]):
            series.append(Series("shm", steps, columns["shm_used_bytes"], shm_limit_bytes))
        elapsed = self._elapsed_s() if self._ended_s is None else self._ended_s - (self._started_s or 0.0)
        return decide(
            [s for s in series if any(v == v for v in s.values)],
            epoch_steps=[m.step + 1 for m in self.timeline.epochs],
            steps_per_s=self.steps / elapsed if elapsed > 0 else None,
            graph_suspects=graph_holders or (),
            max_points=max_points,
            first_pass_steps=self._first_pass_steps(),
        )

    def _first_pass_steps(self) -> tuple[int, int] | None:
        """(first step, last step) of the first pass of a multi-worker DataLoader, if known."""
        epochs = self.timeline.epochs
        if self._first_pass_batches is None or not epochs:
            return None
        start = next((m.step for m in epochs), 0)
        return start + 1, start + self._first_pass_batches

    def _worker_death_advice(self, exc: BaseException | None, ram: RamSummary, shm: ShmSummary | None) -> list[str]:
        """If the block died because a DataLoader worker was killed: the likely cause, from the curves."""
        death = None if exc is None else parse_worker_death(str(exc))
        if death is None:
            return []
        by_time = self.timeline.by_time
        before_end = [v for v in by_time.column("ram_bytes")[-5:] if v == v]  # the last readings before it
        shm_used = [v for v in by_time.column("shm_used_bytes")[-5:] if v == v]
        return explain_worker_death(
            death,
            ram_bytes=max(before_end, default=float(ram.end_bytes)),
            ram_limit_bytes=float(ram.limit_bytes),
            shm_used_bytes=max(shm_used) if shm_used else None,
            shm_total_bytes=None if shm is None else float(shm.limit_bytes),
            limit_source=ram.limit_source,
        )

    def _peak(self, column: str) -> float:
        values = [self.timeline.by_time.max(column), self.timeline.by_step.max(column)]
        finite = [v for v in values if not math.isnan(v)]
        return max(finite) if finite else NAN

    def _vram_summary(self) -> VramSummary | None:
        by_time = self.timeline.by_time
        devices_end = self._accelerator.details()
        allocated_peak = self._peak("vram_allocated_bytes")
        if math.isnan(allocated_peak) and not devices_end:
            return None
        # the allocator's own peak counters catch peaks between samples, when they rose in this run
        peak_from_counters = sum(
            d.allocated_peak_bytes
            for d in devices_end
            if d.name not in self._devices_start or d.allocated_peak_bytes > self._devices_start[d.name].allocated_peak_bytes
        )
        retries_start = sum(d.num_alloc_retries or 0 for d in self._devices_start.values())
        totals = [d.total_bytes for d in devices_end]
        return VramSummary(
            allocated_start_bytes=_int_or(by_time.first_value("vram_allocated_bytes")),
            allocated_end_bytes=_int_or(by_time.last_value("vram_allocated_bytes")),
            allocated_peak_bytes=max(_int_or(allocated_peak), peak_from_counters),
            reserved_end_bytes=_int_or(by_time.last_value("vram_reserved_bytes")),
            reserved_peak_bytes=_int_or(self._peak("vram_reserved_bytes")),
            per_step_bytes=None,  # filled from the verdict below
            limit_bytes=sum(t for t in totals if t) if totals and all(totals) else None,
            devices=tuple(d.name for d in devices_end),
            num_alloc_retries=sum(d.num_alloc_retries or 0 for d in devices_end) - retries_start if devices_end else None,
            per_device=tuple(devices_end),
        )

    def _find_suspects(self) -> tuple[Suspect, ...]:
        if self._roots is None:
            return ()
        return tuple(suspects_from_scan(scan_roots(self._roots(), END_SCAN_BUDGET), self._sources, self._baseline))

    def _build_report(self, status: Status, exc: BaseException | None, suspects: tuple[Suspect, ...]) -> Report:
        from .probes import sharing_strategy

        by_time = self.timeline.by_time
        ram = RamSummary(
            start_bytes=_int_or(by_time.first_value("ram_bytes")),
            end_bytes=_int_or(by_time.last_value("ram_bytes")),
            peak_bytes=_int_or(self._peak("ram_bytes")),
            per_step_bytes=None,  # filled from the verdict below
            limit_bytes=self._limit.limit_bytes,
            limit_source=self._limit.source,
        )
        heap = None
        if self._heap.available:
            heap = HeapSummary(
                start_bytes=_int_or(by_time.first_value("heap_bytes")),
                end_bytes=_int_or(by_time.last_value("heap_bytes")),
                peak_bytes=_int_or(self._peak("heap_bytes")),
                per_step_bytes=None,  # filled from the verdict below
            )
        shm = None
        shm_reading = self._shm.read()
        if shm_reading is not None:
            shm = ShmSummary(
                start_bytes=_int_or(by_time.first_value("shm_used_bytes")),
                end_bytes=_int_or(by_time.last_value("shm_used_bytes")),
                peak_bytes=_int_or(self._peak("shm_used_bytes")),
                limit_bytes=shm_reading.total_bytes,
                strategy=sharing_strategy(),
                per_step_bytes=None,  # filled from the verdict below
                path=self.shm_path,
                torch_segments=self._shm.torch_segments(self._tree.pids()),
            )
        workers = None
        if self._tree.worker_pids_seen:
            workers = WorkerSummary(
                max_count=self._max_workers,
                peak_bytes=_int_or(by_time.max("workers_bytes")),
                pids_seen=len(self._tree.worker_pids_seen),
                per_worker=tuple(
                    {"pid": pid, "pss_peak": pss, "uss_peak": uss}
                    for pid, (pss, uss) in sorted(self._tree.worker_peaks.items())
                ),
            )
        assert self._started_s is not None and self._ended_s is not None
        wall_s = self._ended_s - self._started_s
        vram = self._vram_summary()
        graph_holders = [s.name for s in suspects if s.kind == "autograd-graph" and s.new_in_cell]
        vram_limit = None
        if vram is not None:  # headroom: what the driver says is free, plus what the cache holds unused
            free = [d.free_bytes for d in vram.per_device]
            vram_limit = vram.reserved_end_bytes + sum(free) if free and None not in free else vram.limit_bytes
        death_advice = self._worker_death_advice(exc, ram, shm)
        if shm is not None:
            warning = shm_warning(shm.peak_bytes, shm.limit_bytes, shm.path)
            death_advice += [warning] if warning and not death_advice else []
        verdict = self.verdict(
            vram_limit_bytes=vram_limit,
            shm_limit_bytes=None if shm is None else shm.limit_bytes,
            graph_holders=graph_holders,
        )
        # one estimator for the table and the verdict: the detector's slope after warm-up, where it had enough steps
        rates = _rates(verdict)

        def with_rate(summary: Any, resource: str) -> Any:
            return None if summary is None else replace(summary, per_step_bytes=self._per_step(rates, resource))

        ram, heap, vram, shm = with_rate(ram, "ram"), with_rate(heap, "heap"), with_rate(vram, "vram"), with_rate(shm, "shm")
        return Report(
            status=status,
            wall_s=wall_s,
            samples=by_time.count,
            interval_s=self.interval_s,
            steps=self.steps,
            epochs=self.timeline.epoch_count,
            ram=ram,
            heap=heap,
            vram=vram,
            shm=shm,
            workers=workers,
            verdict=verdict.verdict,  # type: ignore[arg-type]
            leak_kind=verdict.leak_kind,
            resource=verdict.resource,
            steps_to_exhaustion=verdict.steps_to_exhaustion,
            suspects=suspects,
            advice=(*death_advice, *verdict.advice),
            seconds_to_exhaustion=verdict.seconds_to_exhaustion,
            per_step_error_bytes=verdict.per_step_error_bytes,
            sporadic_steps=verdict.sporadic_steps,
            error=None if exc is None else f"{type(exc).__name__}: {exc}".rstrip(": "),
            timeline=self.timeline,
        )


def _module_roots(namespace: dict[str, Any]) -> list[Root]:
    """A script's global names (not `_private` ones)."""
    return [Root(k, "user", k, v) for k, v in list(namespace.items()) if not k.startswith("_")]


def _smoothed(previous_s: float, value_s: float) -> float:
    """An exponential average of a measured cost, started at the first measurement (not at 0)."""
    return 0.8 * previous_s + 0.2 * value_s if previous_s else value_s


def _rates(verdict: Verdict) -> dict[str, float]:
    """Bytes per step of each resource the detector could measure."""
    return {f.resource: f.per_step_bytes for f in verdict.findings if f.per_step_bytes is not None}


def _despite_worker_deaths(action: Callable[[], None], interruptions: list[BaseException]) -> None:
    """Run `action` (safe to repeat), again when torch's SIGCHLD handler interrupts it with a
    "DataLoader worker ... killed" error; the interruptions are collected for the caller."""
    for attempt in range(4):
        try:
            action()
            return
        except Exception as interruption:
            if attempt == 3 or parse_worker_death(str(interruption)) is None:
                raise
            interruptions.append(interruption)


def memwatch(
    interval_ms: float = DEFAULT_INTERVAL_MS,
    *,
    device: str | int | None = None,
    quiet: bool = False,
    shm_path: str = "/dev/shm",
    scan: bool = True,
) -> MemwatchSession:
    """Script API: `with memwatch() as w: train()` then `w.report` (also `last_report()`).

    Prints the text report when the block ends unless `quiet`. The block's exception, if any,
    propagates after the report is made. With `scan`, the leak finder looks at the calling
    module's global names (at start and end) and fills `report.suspects`.
    """
    roots: Callable[[], list[Root]] | None = None
    sources: list[str] = []
    if scan:
        namespace = sys._getframe(1).f_globals
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is not None and namespace is shell.user_ns:  # in a notebook: the same roots as %%memwatch
            from .notebook import notebook_roots, recent_sources

            sources = recent_sources(shell)
            roots = functools.partial(notebook_roots, shell)
        else:
            roots = functools.partial(_module_roots, namespace)

    return MemwatchSession(
        interval_ms, device=device, shm_path=shm_path, print_report=not quiet, roots=roots, sources=sources
    )
