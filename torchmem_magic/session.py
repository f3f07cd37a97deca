"""One memwatch run: probes + sampler thread + torch hooks, started and stopped as a unit.

The session gathers; `report.py` decides and assembles. The cell magic and the script API
(`with memwatch(): ...`) both drive `MemwatchSession`; the magic only adds rendering. Stopping
always removes hooks and joins the thread before anything else, so nothing is left behind after
an exception or KeyboardInterrupt.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from . import resources
from .forensics import parse_worker_death
from .guard import MemoryGuard, parse_guard
from .holder_tracking import CHEAP_OBJECTS, HolderTracker
from .holders import first_named_step, holder_trend, live_holder_line, with_trends
from .hooks import LoaderPass, StepClock, TrainingHooks
from .model import STEP_CLOCKS, Clock, DeviceMemory, LiveStatus, SourceErrors, Suspect
from .probes.accelerator import AcceleratorProbe, parse_device
from .probes.base import ProbeReader, Reading
from .probes.heap import HeapProbe
from .probes.limits import MemoryLimit, memory_limit, sharing_strategy
from .probes.process import ProcessTreeProbe
from .probes.shm import ShmProbe, ShmReading
from .ranks.settings import ForkedProcessHandler, RankSettings, StartScan
from .results import Report
from .report import (
    LIVE_VERDICT_STEPS,
    RunEvidence,
    ShmEvidence,
    WorkerEvidence,
    assemble_report,
    diagnose,
    live_status,
    short_verdict,
    training_loader,
)
from .sampler import Sampler
from .scan.results import Budget, Root
from .scan.memo import ScanMemo, scan_reusing
from .scan.scanner import scan_roots
from .step_requests import StepRequests
from .step_sampling import StepSamplingPolicy
from .suspects import baseline_of, suspects_from_scan, suspects_from_stats
from .timeline import NAN, Timeline
from .verdict import Diagnosis

if TYPE_CHECKING:
    from .flight.recorder import FlightRecorder
    from .ranks.feed import RankFeeds
    from .ranks.live import LiveRanks, RankLive

DEFAULT_INTERVAL_MS = 100.0
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 1.0, 10_000.0
LIVE_VERDICT_PERIOD_S = 1.0
START_SCAN_BUDGET = Budget(time_s=0.3)  # before the cell: only per-name totals are needed
END_SCAN_BUDGET = Budget(time_s=1.0)
#: the end-of-cell scan reuses the last scan of a name unchanged since only when scanning it again would
#: meet this many objects or more (a few milliseconds); smaller ones are scanned again in any case
REUSE_MIN_OBJECTS = 2_000
#: columns a step sample copies from the last background reading (too slow to read at every step)
SLOW_COLUMNS = tuple(r.column for r in resources.RESOURCES if r.slow)


class Listener(Protocol):
    """Receives live updates. `on_tick` runs on the sampler thread only (one writer);
    `on_finish` runs on the caller's thread after the sampler has stopped."""

    tick_period_s: float
    tick_cpu_share: float | None  # None: every tick_period_s; else as rarely as keeps on_tick under this share

    def on_tick(self, session: MemwatchSession) -> None: ...

    def on_finish(self, session: MemwatchSession, report: Report) -> None: ...


class _Registry:
    """The one active session and the last report (what `last_report()` returns)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: MemwatchSession | None = None
        self.last: Report | None = None
        # names' scan results from one session to the next: an unchanged name is not scanned again
        self.scan_memo = ScanMemo()


_registry = _Registry()


def last_report() -> Report | None:
    """The Report of the most recent `%%memwatch` cell or `memwatch()` block, or None."""
    return _registry.last


def active_session() -> MemwatchSession | None:
    return _registry.active


def forget_inherited_sessions() -> None:
    """In a forked process: the watcher's session (copied with the memory) is not this process's."""
    _registry.lock = threading.Lock()  # the parent may have held it while forking
    inherited = _registry.active
    if inherited is not None and inherited.ranks is not None:
        inherited.ranks.close()  # only the socket's copy here: its directory stays the watcher's
    _registry.active = None
    _registry.last = None


def validate_interval_ms(interval_ms: float) -> float:
    if not isinstance(interval_ms, (int, float)) or math.isnan(interval_ms) or not (
        MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS
    ):
        raise ValueError(
            f"interval must be between {MIN_INTERVAL_MS:g} and {MAX_INTERVAL_MS:g} ms, got {interval_ms!r}"
        )
    return float(interval_ms)


def _autograd_sequence_nr() -> int:
    """The number autograd gives the next node made on this thread (nodes are numbered as created)."""
    import torch

    with torch.enable_grad():
        node = (torch.zeros(1, requires_grad=True) * 1).grad_fn
    try:
        return int(node._sequence_nr()) if node is not None else 0
    except Exception:
        return 0


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


def _despite_interrupts(action: Callable[[], None], interrupted: list[KeyboardInterrupt]) -> None:
    """Run `action` (safe to repeat) to its end even when a KeyboardInterrupt (a second Ctrl-C) cuts it
    short; the interrupt, without its frames, is kept for the caller to raise."""
    try:
        action()
    except KeyboardInterrupt as interrupt:
        interrupted.append(interrupt.with_traceback(None))
        action()


class MemwatchSession:
    """Samples memory while a block of code runs.

    Args:
        interval_ms: background sampling period (1–10,000 ms).
        device: CUDA device to watch ('cuda:1', '1'); None watches every device in use.
        shm_path: the shared-memory filesystem to watch.
        listener: live renderer (see `Listener`).
        print_report: print the text report when the block ends (the script API's default).
        roots: where the leak finder looks (called at start and end; None: no scan).
        sources: code in which a suspect's fix line is looked for (the list itself is kept, so a roots
            provider can add the source of functions it finds running during the run).
        clock: wall clock in seconds (injectable for tests).
        cpu_clock: this thread's CPU time in seconds: what a step sample costs, a GIL wait excluded.
        watch_ranks: listen for ranks (processes forked from this one, or a watched command's) and
            report each of them.
        train_hooks: install the step clocks (a watcher of another command's processes does not train).
        timeline: where the rows go (a rank's streams them too).
        adopt_hooks: hooks a forked process inherited, counted for this session instead of new ones.
        keep_scanned_holders: report the holders the last mid-run scan saw even when the end-of-run
            scan cannot reach them any more (a rank's training function has returned by then).
        rank_agent: how a process forked from this one that trains is watched as a rank (None: it
            is not watched).
        inherited_scan: the scan before the run of the watcher this process was forked from (a rank
            then neither collects garbage nor scans before its run).
        recorder: writes the run's flight record as it goes (its outbox must be what `timeline`
            relays to); removed when the run ends.
        guard: stop the loop with MemoryGuardError at a step boundary once a watched resource reaches
            this share of its limit, or would before the next chance to stop ('90%', 90 or 0.9; None: never).
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
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
        watch_ranks: bool = True,
        train_hooks: bool = True,
        timeline: Timeline | None = None,
        adopt_hooks: TrainingHooks | None = None,
        keep_scanned_holders: bool = False,
        rank_agent: ForkedProcessHandler | None = None,
        inherited_scan: StartScan | None = None,
        recorder: FlightRecorder | None = None,
        guard: float | str | None = None,
    ) -> None:
        self.interval_s = validate_interval_ms(interval_ms) / 1000.0
        self.guard_share = None if guard is None else parse_guard(guard)
        self.guard: MemoryGuard | None = None  # made at start, once the limits are known
        self.devices = None if device is None else [parse_device(str(device))]
        self.shm_path = shm_path
        self.listener = listener
        self.print_report = print_report
        self._roots = roots
        self._sources = sources if sources is not None else []  # shared: a roots provider may add to it
        self._clock, self._cpu_clock = clock, cpu_clock
        self.timeline = Timeline() if timeline is None else timeline
        self._watch_ranks, self._train_hooks = watch_ranks, train_hooks
        self._adopt_hooks, self._keep_scanned_holders = adopt_hooks, keep_scanned_holders
        self._rank_agent = rank_agent
        self._inherited_scan = inherited_scan
        self.recorder = recorder
        self.start_scan: StartScan | None = None
        self.ranks: RankFeeds | None = None
        self.evidence: RunEvidence | None = None  # what the report was assembled from
        self.started_wall_s = 0.0
        self.clock_counts: dict[Clock, int] = dict.fromkeys(STEP_CLOCKS, 0)
        self.clock: Clock = "time"  # the best clock seen so far: what a step is
        self._clock_generation = 0  # bumped when a better clock replaces the current one
        self._filed_generation = 0
        self._loader_credits: dict[tuple[Clock, int], int] = {}  # steps of each clock made on each loader's batches
        self.report: Report | None = None
        self.sampling = StepSamplingPolicy()
        self._baseline: dict[str, int] | None = None
        self._live: tuple[float, Diagnosis] | None = None  # (when, the live verdict): recomputed once a second
        self._first_pass_batches: int | None = None
        self._max_workers = 0
        self._last_slow: Reading = dict.fromkeys(SLOW_COLUMNS, NAN)
        self._step_rows: deque[tuple[int, Reading]] = deque(maxlen=100_000)  # (clock generation, row), filed every tick
        self._started_s: float | None = None
        self._ended_s: float | None = None
        self._tree: ProcessTreeProbe | None = None
        self._hooks: TrainingHooks | None = None
        self._sampler: Sampler | None = None
        self._requests = StepRequests(on_error=self._absorb_callback_error)
        self._tracker: HolderTracker | None = None
        self._step_samples_cpu_s = 0.0  # what the step samples cost on the training thread, every clock
        self._live_suspects_at_step: int | None = None
        self.holder_scans = 0  # leak-finder scans during the run, and their wall time (training thread)
        self.holder_scan_s = 0.0
        self._live_holder: tuple[int, str | None] = (-1, None)  # (scans it was computed at, the holder line)
        self._live_ranks: LiveRanks | None = None  # each rank's verdict as it forms (sampler thread)

    # ------------------------------------------------------------------ sampling
    def _elapsed_s(self) -> float:
        if self._started_s is None:
            return 0.0
        return (self._ended_s if self._ended_s is not None else self._clock()) - self._started_s

    @property
    def elapsed_s(self) -> float:
        """Seconds since the session started (until it stopped)."""
        return self._elapsed_s()

    def _background_row(self) -> Reading:
        """Sampler thread: the full reading, incl. children discovery and PSS at their slow rates."""
        self._file_step_rows()
        if self.ranks is not None:
            self.ranks.poll()
        self._shm.idle = not (self._tree is not None and self._tree.workers) and self._ended_s is None
        row = self._background.read()
        row["t_s"], row["step"] = self._elapsed_s(), float(self.steps)
        self._last_slow = {name: row[name] for name in SLOW_COLUMNS}
        if not math.isnan(row["workers"]):
            self._max_workers = max(self._max_workers, int(row["workers"]))
        if self.recorder is not None and self._ended_s is None:
            # the row itself is recorded when the sampler appends it: at the next flush
            self.recorder.on_sample(self, row["t_s"])
        if self.guard is not None and self._ended_s is None:
            self.guard.check(row, self)
        return row

    @property
    def steps(self) -> int:
        """Steps of the best clock seen so far (0 when none ticked: then the clock is time)."""
        return self.clock_counts[self.clock] if self.clock != "time" else 0

    def tick(self, clock: StepClock) -> None:
        """Count a step made before this session's hooks were its own (a rank adopting them mid-step)."""
        self._on_tick(clock)

    def pass_started(self, loader_pass: LoaderPass) -> None:
        """Count a loader pass that began before this session's hooks were its own (its first epoch)."""
        self._on_pass(loader_pass)

    def _on_tick(self, clock: Clock) -> None:
        """A step of any clock, on the thread that made it: must stay cheap.

        Only the best clock seen so far samples (a better one replaces it: optimizer steps, then
        backward passes, then batches, then forward calls). A sample reads only the ~1 µs counters
        (kernel RSS, heap, VRAM); children and shm come from the last background reading. The row
        is queued for the sampler thread, which files it. Which steps are sampled is the
        `StepSamplingPolicy`'s decision. Requests (button clicks) run here, between two steps.
        """
        __tracebackhide__ = True
        counts = self.clock_counts
        counts[clock] += 1
        if clock != self.clock:
            if self.clock != "time" and STEP_CLOCKS.index(clock) > STEP_CLOCKS.index(self.clock):
                return  # a lesser clock: counted only
            self.clock = clock
            self._clock_generation += 1
            self.sampling = StepSamplingPolicy()  # a dense start for the new clock
            if self._tracker is not None:
                self._tracker.restart()
        loader = self._hooks.current_loader if self._hooks is not None else None
        if loader is not None:  # the steps made on each loader's batches tell the training loader
            key = (clock, loader)
            self._loader_credits[key] = self._loader_credits.get(key, 0) + 1
        step = counts[clock]
        if self._requests.pending:
            self._requests.run(step)
        tracker = self._tracker
        if tracker is not None and tracker.due(step):
            tracker.scan(step)
        if not self.sampling.due():
            return
        started_s, cpu_started_s = self._clock(), self._cpu_clock()
        row = self._per_step.read()
        assert self._tree is not None
        row["ram_bytes"] = row["rss_bytes"] + self._tree.children_bytes
        row.update(self._last_slow)
        row["t_s"], row["step"] = started_s - (self._started_s or 0.0), float(step)
        self._step_rows.append((self._clock_generation, row))
        cost_s = self._cpu_clock() - cpu_started_s
        self._step_samples_cpu_s += cost_s
        self.sampling.sampled(step, started_s, cost_s)

    def _file_step_rows(self) -> None:
        """Sampler thread: file the queued step rows; what that costs counts against the step budget.
        Rows of a clock that a better one replaced are dropped, and so are the series' rows."""
        rows, count = self._step_rows, 0
        started = self._cpu_clock()
        while rows:
            generation, row = rows.popleft()
            if generation < self._filed_generation:
                continue
            if generation > self._filed_generation:
                self._filed_generation = generation
                self.timeline.restart_steps()
            self.timeline.by_step.append(row)
            count += 1
        self.sampling.filed(count, self._cpu_clock() - started)

    def _on_pass(self, loader_pass: LoaderPass) -> None:
        counts = self.clock_counts
        self.timeline.add_pass(self._elapsed_s(), loader_pass.loader, tuple(counts[c] for c in STEP_CLOCKS))
        workers, batches = loader_pass.workers, loader_pass.batches
        if workers and batches and self._first_pass_batches is None:
            self._first_pass_batches = batches  # for the copy-on-access projection
        if workers:
            assert self._tree is not None
            self._tree.announce_workers(workers)
            self._max_workers = max(self._max_workers, len(workers))  # exact, even for short epochs

    def training_loader(self) -> int | None:
        """The loader whose batches carry the steps: its passes are the epochs (None: no loader)."""
        return training_loader(self.clock, self._loader_credits, self.timeline.passes)

    def _absorb_callback_error(self, exc: Exception) -> None:
        assert self._hooks is not None
        self._hooks.absorb_error(exc)

    def _on_sampler_tick(self) -> None:
        if self.listener is not None:
            self.listener.on_tick(self)

    def request(self, action: Callable[[], None]) -> None:
        """Run `action` at the next step boundary, on the training thread (thread-safe).

        This is how a button clicked mid-run acts without racing the training loop."""
        self._requests.request(action)

    def request_stop(self) -> None:
        """End the block at the next step boundary (StopTraining); the report still renders."""
        self._requests.request_stop()

    def raise_at_step(self, exc: BaseException) -> None:
        """Raise `exc` in the training loop at the next step boundary (the memory guard; thread-safe)."""
        self._requests.raise_at_step(exc)

    @property
    def own_cpu_s(self) -> float:
        """CPU time memwatch itself used: step samples on the training thread plus the sampler thread
        (known once the session has stopped) plus the leak finder's scans during the run. The benchmarks
        compare it with the run's wall time."""
        scans_s = self._tracker.spent_s if self._tracker is not None else self.holder_scan_s
        return self._step_samples_cpu_s + scans_s + (self._sampler.cpu_s if self._sampler is not None else 0.0)

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        return self._started_s is not None and self._ended_s is None

    def start(self) -> MemwatchSession:
        """Install probes, hooks and the sampler thread. RuntimeError if another session is active."""
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
            self._background = ProbeReader([self._tree, self._heap, self._accelerator, self._shm])
            self._per_step = ProbeReader([self._tree.kernel, self._heap, self._accelerator])
            self._limit: MemoryLimit = memory_limit()
            if self._watch_ranks:
                from .ranks.feed import RankFeeds

                self.ranks = RankFeeds(self._clock)
            self._devices_start: tuple[DeviceMemory, ...] = tuple(self._accelerator.details())
            if self.guard_share is not None:
                shm = self._shm.usage()
                self.guard = MemoryGuard(
                    self.guard_share, self._limit, shm.total_bytes if shm else None, self._accelerator, self.interval_s
                )
            if self._inherited_scan is None:
                # cyclic garbage the previous cells left young would otherwise be freed whenever the
                # collector next runs, as a drop in the middle of this cell's curves (seen to hide a
                # per-epoch staircase). Only the young generations: a full collection walks every
                # object of the process (0.1 s with torch imported and a large namespace), and garbage
                # already in the old generation is freed only when a full collection comes due, rarely
                # within one cell. A forked rank's watcher collected just before.
                gc.collect(1)
            if self._roots is not None:  # what each name held before the cell: `new_in_cell`
                self.start_scan = self._scan_before(self._inherited_scan)
                self._baseline = dict(self.start_scan.baseline)
                self._tracker = HolderTracker(
                    self._roots, self._baseline, set(self.start_scan.cheap), self.start_scan.cost_s,
                    sequence_floor=_autograd_sequence_nr(),
                )
            self._started_s = self._clock()
            self.started_wall_s = time.time()
            if self.ranks is not None:
                self.ranks.start(self._started_s)
            self.timeline.by_time.append(self._background_row())
            if self.recorder is not None:
                self.recorder.start(self)
            on_forked = self._forked_process_handler()
            if self._adopt_hooks is not None:
                self._hooks = self._adopt_hooks
                self._hooks.adopt(self._on_tick, self._on_pass, on_forked)
            elif self._train_hooks:
                self._hooks = TrainingHooks(self._on_tick, self._on_pass, on_forked)
                self._hooks.install()
            self._sampler = Sampler(
                self._background_row,
                self.timeline.by_time,
                self.interval_s,
                on_tick=self._on_sampler_tick if self.listener is not None else None,
                tick_period_s=getattr(self.listener, "tick_period_s", 0.5),
                on_tick_share=getattr(self.listener, "tick_cpu_share", None),
            )
            self._sampler.start()
        except BaseException:  # a KeyboardInterrupt during the scan before the run, too
            self._teardown()
            # an interrupt during the start's collection or scan: no socket directory left
            _despite_interrupts(self._close_sources, [])
            raise
        return self

    def _scan_before(self, inherited: StartScan | None) -> StartScan:
        """What each name holds before the run; with the scan of the watcher this process was forked
        from, only the names that scan did not see (a rank's training function's locals)."""
        assert self._roots is not None
        roots = self._roots()
        if inherited is not None:
            roots = [r for r in roots if r.name not in inherited.baseline]
        if inherited is None:
            memo = _registry.scan_memo
            before = scan_reusing(memo, roots, START_SCAN_BUDGET)
            cost_s = max(before.elapsed_s, memo.full_scan_cost_s)
        else:
            before = scan_roots(roots, START_SCAN_BUDGET)
        del roots
        cheap = frozenset(
            s.name for s in before.roots if s.objects + s.plain_objects < CHEAP_OBJECTS and not s.truncated
        )
        if inherited is None:
            return StartScan(baseline_of(before), cheap, cost_s)
        return StartScan({**inherited.baseline, **baseline_of(before)}, inherited.cheap | cheap, inherited.cost_s)

    def _forked_process_handler(self) -> Callable[[TrainingHooks, StepClock | None], None] | None:
        """How a process forked from this one is watched: as a rank streaming to this session."""
        if self.ranks is None or self._rank_agent is None:
            return None
        settings = RankSettings(  # each rank watches the devices it uses itself
            self.ranks.address, self.interval_s * 1000.0, shm_path=self.shm_path,
            roots=self._roots, sources=tuple(self._sources), inherited_scan=self.start_scan,
        )
        return functools.partial(self._rank_agent, settings)

    def _teardown(self) -> None:
        """Remove hooks and stop the thread; idempotent, and first thing done on every exit path."""
        try:
            if self._hooks is not None:
                self._hooks.remove()
            if self._sampler is not None:
                self._sampler.stop()
        finally:  # an interrupt while the sampler is joined must not leave this session active for good
            with _registry.lock:
                if _registry.active is self:
                    _registry.active = None

    def _close_sources(self) -> None:
        """Close the process probe's /proc readers, the ranks' socket (and its temp directory), and
        remove the flight record: the run ended with this process alive."""
        if self._tree is not None:
            self._tree.close()
        if self.ranks is not None:
            self.ranks.close()
        if self.recorder is not None:
            self.recorder.close()

    def stop(self, exc: BaseException | None = None) -> Report:
        """End the session (idempotent) and return its Report; `exc` is what ended the block, if anything.

        A DataLoader worker's death that torch's SIGCHLD handler raises into this method (it raises
        into whatever runs at that moment) is raised once the report exists (chained to `exc`), never
        lost; when `exc` is that death already, repeats are dropped. Which worker died and how is
        read from the workers' exit statuses, whatever exception the loop happened to see.
        """
        if self.report is not None:
            return self.report
        interruptions: list[BaseException] = []
        # a KeyboardInterrupt while the session stops (the end-of-run scan takes up to a second): the
        # teardown is finished and the report made without the leak finder, then the interrupt is raised
        interrupted: list[KeyboardInterrupt] = []
        try:
            _despite_interrupts(lambda: _despite_worker_deaths(self._teardown, interruptions), interrupted)
        finally:
            self._ended_s = self._clock()

        def worker_death() -> BaseException | None:
            """A death raised into stop() that is not what the block already raised."""
            if not interruptions or (exc is not None and parse_worker_death(str(exc)) is not None):
                return None
            return interruptions[0]

        def make_report() -> None:
            self._final_readings()
            if self._tracker is not None:
                self._live_suspects_at_step = first_named_step(self._tracker.snapshot())
            ended_by = worker_death() or exc or (interrupted[0] if interrupted else None)
            self.evidence = self._evidence(ended_by, self._find_suspects())
            self.report = assemble_report(self.evidence)

        try:
            try:
                _despite_worker_deaths(make_report, interruptions)
            except KeyboardInterrupt as interrupt:
                interrupted.append(interrupt.with_traceback(None))
                self._roots = None  # no scan this time: the report without suspects
                _despite_worker_deaths(make_report, interruptions)
        finally:
            if self._tracker is not None:
                self.holder_scans, self.holder_scan_s = self._tracker.scans, self._tracker.spent_s
            self._roots = self._tracker = None  # the provider may reference the user's namespace
            _despite_interrupts(self._close_sources, interrupted)  # an rmtree cut short leaves the directory
        assert self.report is not None
        report = self.report
        _registry.last = report
        listener = self.listener
        if listener is not None:
            _despite_worker_deaths(lambda: listener.on_finish(self, report), interruptions)
        if self.print_report:
            print(report)
        death = worker_death()
        if death is not None:
            raise death from exc
        if interrupted and exc is None:  # the block had ended by itself: the interrupt is the block's end
            raise interrupted[0]
        return report

    def _final_readings(self) -> None:
        """One last background reading, and a step-aligned one at the final step count if the
        stride skipped the last steps (a jump there must still be seen)."""
        if self.ranks is not None:
            self.ranks.poll(force=True)  # what the ranks sent since the sampler's last read
        row = self._background_row()  # also files queued step rows
        self.timeline.by_time.append(row)
        if self.steps > self.sampling.last_sampled_step:
            self.sampling.mark_sampled(self.steps)
            self.timeline.by_step.append(row)

    def _find_suspects(self) -> tuple[Suspect, ...]:
        if self._roots is None:
            return ()
        tracked = self._tracker.tracked() if self._tracker is not None else set()
        # the names cheap to scan are scanned again, whatever their fingerprint says
        scan = scan_reusing(
            _registry.scan_memo, self._roots(), END_SCAN_BUDGET, rescan=tracked, min_objects=REUSE_MIN_OBJECTS
        )
        found = suspects_from_scan(scan, self._sources, self._baseline)
        if self._keep_scanned_holders and self._tracker is not None:
            names = {s.name for s in found}
            gone = [stats for stats in self._tracker.measured() if stats.name not in names]
            found = sorted([*found, *suspects_from_stats(gone, self._sources, self._baseline)], key=lambda s: -s.retained_bytes)
        return tuple(found)

    @property
    def devices_at_start(self) -> tuple[DeviceMemory, ...]:
        return self._devices_start

    def shm_usage(self) -> ShmReading | None:
        return self._shm.usage()

    def last_live_verdict(self) -> tuple[float, str] | None:
        """(seconds into the run, the verdict line) of the last live verdict, if one was computed."""
        live = self._live
        if live is None or self._started_s is None:
            return None
        return live[0] - self._started_s, short_verdict(live[1])

    @property
    def holder_scans_so_far(self) -> int:
        return self._tracker.scans if self._tracker is not None else self.holder_scans

    def holders_so_far(self) -> tuple[dict[str, list[tuple[int, int]]], tuple[Suspect, ...]]:
        """The holders' series and, as suspects, what the last mid-run scan saw of each (sampler thread)."""
        tracker = self._tracker
        if tracker is None:
            return {}, ()
        series, stats = tracker.snapshot(), tracker.measured()
        return series, with_trends(tuple(suspects_from_stats(stats, self._sources, self._baseline)), series)

    def device_uuids(self) -> list[str]:
        """The CUDA devices this process's allocator uses (a rank's own devices)."""
        return self._accelerator.device_uuids()

    @property
    def ram_limit(self) -> MemoryLimit:
        return self._limit

    @property
    def heap_available(self) -> bool:
        return self._heap.available

    def _source_errors(self) -> tuple[SourceErrors, ...]:
        counts = [*self._background.errors.values(), *self._per_step.errors.values()]
        if self._hooks is not None:
            counts.append(self._hooks.errors)
        if self._sampler is not None:
            counts.append(self._sampler.errors)
        merged: dict[str, SourceErrors] = {}
        for count in counts:
            summary = count.summary()
            if summary is None:
                continue
            seen = merged.get(summary.source)
            merged[summary.source] = summary if seen is None else SourceErrors(
                summary.source, seen.count + summary.count, summary.last or seen.last
            )
        return tuple(merged.values())

    def _evidence(self, ended_by: BaseException | None, suspects: tuple[Suspect, ...]) -> RunEvidence:
        """What this run gathered, as plain data for `assemble_report`."""
        assert self._tree is not None
        tree = self._tree
        exits = tuple(tree.check_worker_exits())
        usage = self._shm.usage()
        shm = None
        if usage is not None:
            shm = ShmEvidence(self.shm_path, usage.total_bytes, sharing_strategy(), self._shm.torch_segments(tree.pids()))
        workers = None
        if tree.worker_pids_seen:
            workers = WorkerEvidence(
                self._max_workers,
                len(tree.worker_pids_seen),
                tuple((pid, pss, uss) for pid, (pss, uss) in sorted(tree.worker_peaks.items())),
            )
        return RunEvidence(
            timeline=self.timeline,
            steps=self.steps,
            wall_s=self._elapsed_s(),
            interval_s=self.interval_s,
            ram_limit_bytes=self._limit.limit_bytes,
            ram_limit_source=self._limit.source,
            heap_available=self._heap.available,
            shm=shm,
            workers=workers,
            worker_exits=exits,
            devices_start=self._devices_start,
            devices_end=tuple(self._accelerator.details()),
            first_pass_batches=self._first_pass_batches,
            suspects=suspects,
            exception=ended_by,
            source_errors=self._source_errors(),
            clock=self.clock,
            optimizer_steps=self.clock_counts["optimizer"],
            training_loader=self.training_loader(),
            holder_series={} if self._tracker is None else self._tracker.snapshot(),
            live_suspects_at_step=self._live_suspects_at_step,
            ranks=None if self.ranks is None else self.ranks.summaries(ended_by),
            guard_advice=() if self.guard is None else self.guard.advice(ended_by, self),
        )



    def __enter__(self) -> MemwatchSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.stop(exc)

    # ------------------------------------------------------------------ live figures
    def live_verdict(self, loader: int | None = None) -> Diagnosis | None:
        """The verdict over the run so far, recomputed at most once a second (sampler thread);
        None before LIVE_VERDICT_STEPS steps (or samples, for a loop without a step clock).
        `loader`: the training loader, when the caller knows it already."""
        enough = self.timeline.by_time.count if self.clock == "time" else self.steps
        if enough < LIVE_VERDICT_STEPS or self._started_s is None:
            return None
        now = self._clock()
        if self._live is None or now - self._live[0] >= LIVE_VERDICT_PERIOD_S:
            diagnosis = diagnose(
                self.timeline, self.steps, self._elapsed_s(), float(self._limit.limit_bytes),
                first_pass_batches=self._first_pass_batches, max_points=64,
                clock=self.clock, loader=self.training_loader() if loader is None else loader,
            )
            self._live = (now, diagnosis)
        return self._live[1]

    def live_holder(self) -> str | None:
        """The fastest-growing holder so far ('val_outputs +2.9 MiB/step, autograd graphs'), from the
        scans during the run; recomputed only after a new scan."""
        tracker = self._tracker
        if tracker is None:
            return self._live_holder[1]
        if tracker.scans != self._live_holder[0]:
            series = tracker.snapshot()
            trends = [holder_trend(name, points) for name, points in series.items()]
            self._live_holder = (tracker.scans, live_holder_line(trends, tracker.kinds, self.clock))
        return self._live_holder[1]

    def live_ranks(self) -> tuple[RankLive, ...]:
        """Each rank's verdict so far (each recomputed at most once a second), by rank number; once
        the run ended, as the report judged them."""
        if self.report is not None and self.report.ranks:
            from .ranks.live import from_summary

            return tuple(from_summary(r) for r in self.report.ranks)
        if self.ranks is None:
            return ()
        feeds = self.ranks.snapshot()
        if not feeds:
            return ()
        if self._live_ranks is None:
            from .ranks.live import LiveRanks

            self._live_ranks = LiveRanks(self._clock)
        return self._live_ranks.judge(feeds)

    def live_status(self) -> LiveStatus:
        """A snapshot for the live status line."""
        tree_workers = self._tree.workers if self._tree is not None else 0
        loader = self.training_loader()
        status = live_status(
            self.timeline, self.steps, self._elapsed_s(), tree_workers, self.live_verdict(loader),
            clock=self.clock, loader=loader, holder=self.live_holder(),
        )
        if self.guard is not None:
            status = dataclasses.replace(status, guard=self.guard.status_text(self.clock))
        ranks = self.live_ranks()
        if not ranks:
            return status
        from .ranks.live import worst_line

        stepping = [r for r in ranks if r.clock != "time"]
        rank_clock = stepping[0].clock if stepping else "optimizer"
        steps = [r.steps for r in stepping if r.clock == rank_clock]
        return dataclasses.replace(
            status,
            # without steps of its own, this process's verdict is over its seconds: the ranks' says more
            verdict=status.verdict if self.clock != "time" else None,
            ranks=len(ranks), rank_steps=(min(steps), max(steps)) if steps else None, rank_clock=rank_clock,
            worst_rank=worst_line(ranks),
        )

    def epoch_markers(self) -> list[tuple[float, float]]:
        """(seconds, step) at which each epoch so far began: the training loader's passes."""
        clock = self.clock
        return [(m.t_s, float(m.step_of(clock))) for m in self.timeline.epochs_of(self.training_loader())]
