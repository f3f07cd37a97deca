"""One memwatch run: probes + sampler thread + torch hooks + leak finder, started and stopped as a unit.

The session gathers; the report's assembly decides. Every front end (the cell magic, the script API, the
command line, a rank's agent) builds its `SessionOptions` once and drives a `MemwatchSession`, which owns
its parts: the step clock (`StepCounter`), the leak finder, the probes, what runs at each step (`StepPath`)
and at each reading (`BackgroundReadings`); who watches the run go gets a read-only `LiveView`. Stopping
removes hooks and joins the thread first, so nothing is left behind after an exception or Ctrl-C.
"""
from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..tracing.grad_mode import grad_enabled, restore_after_cut_step
from ..tracing.frames import RunningFrame
from ..tracing.guard import MemoryGuard
from ..analysis.holders import HolderSearch, needs_holder_search
from ..tracing.hooks import StepClock, TrainingHooks
from ..finder.leak_finder import LeakFinder, LeakSearch
from .lifecycle import (
    Ending, Registry, collect_young_garbage, cuts_in_anywhere, despite_interrupts, despite_worker_deaths,
)
from .background import BackgroundReadings
from .search_judge import SearchJudge
from .live_view import Listener, LiveView
from .step_path import StepPath
from ..core.ended import ended_by
from ..core.model import Clock, SourceErrors, Suspect
from ..core.options import SessionOptions
from ..probes.accelerator import parse_device
from ..probes.base import merged_errors
from ..probes.bundle import ProbeBundle
from ..stream.relay import RelayTimeline
from ..ranks.settings import ForkedProcessHandler, RankSettings
from ..report.assemble import assemble_report
from ..report.evidence import RunEvidence
from ..render.results import Report
from ..tracing.sampler import Sampler
from ..core.step_requests import StepRequests
from ..tracing.steps import RunTime, StepCounter
from ..core.timeline import Timeline
from .phases import PhaseLog

#: what a failure of the search at the end is counted as, among the sources that failed (the report stands)
SEARCH_SOURCE = "end-of-run search"
from .tracebacks import clear_own_frames, give_lines

if TYPE_CHECKING:
    from ..flight.recorder import FlightRecorder
    from ..ranks.feed import RankFeeds
    from ..ranks.launch_env import ExportedToChildren
    from ..stream.transport import Outbox

_registry: Registry[MemwatchSession, Report] = Registry()


def last_report() -> Report | None:
    """The Report of the most recent `%%memwatch` cell or `memwatch()` block, or None."""
    return _registry.last


def keep_as_last(report: Report) -> None:
    """What `last_report()` returns from now on: a report that says more of the same run (every rank's)."""
    _registry.last = report


def active_session() -> MemwatchSession | None:
    return _registry.active


def forget_inherited_sessions() -> None:
    """In a forked process: the watcher's session (copied with the memory) is not this process's."""
    _registry.forget_inherited()


def _said_if_failing(what: str, action: Callable[[], None]) -> None:
    """Run a renderer of the finished report; its failure (ours) is one line on stderr, never the user's error."""
    try:
        action()
    except Exception as exc:
        print(f"torchmem_magic: the report's {what} could not be shown ({type(exc).__name__}: {exc}); "
              "last_report() has the report", file=sys.stderr)


class MemwatchSession:
    """Samples memory while a block of code runs.

    Args:
        options: what to watch and how (see `SessionOptions`).
        search: where the leak finder looks (None: no scan).
        listener: live renderer (see `Listener`).
        recorder: writes the run's flight record as it goes; removed when the run ends.
        relay_to: where the timeline's rows are also queued (a rank's stream to its watcher).
        rank_agent: how a process forked from this one that trains is watched as a rank (None: it is not).
        adopt_hooks: hooks a forked process inherited, counted for this session instead of new ones.
        clock: wall clock in seconds; cpu_clock: this thread's CPU time (what a step sample costs, a GIL
            wait excluded). Both injectable for tests.
    """

    def __init__(
        self,
        options: SessionOptions | None = None,
        *,
        search: LeakSearch | None = None,
        listener: Listener | None = None,
        recorder: FlightRecorder | None = None,
        relay_to: Outbox | None = None,
        rank_agent: ForkedProcessHandler | None = None,
        adopt_hooks: TrainingHooks | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.options = options = options if options is not None else SessionOptions()
        self._devices = None if options.device is None else [parse_device(str(options.device))]
        self.listener, self.recorder = listener, recorder
        self._rank_agent, self._adopt_hooks = rank_agent, adopt_hooks
        self._cpu_clock = cpu_clock
        outbox = relay_to if relay_to is not None else (recorder.outbox if recorder is not None else None)
        rows = options.timeline_rows
        self.timeline = Timeline(rows) if outbox is None else RelayTimeline(outbox, rows)
        self.runtime = RunTime(clock)
        self.step_counter = StepCounter()
        self.finder = None if search is None else LeakFinder(search, _registry.scan_memo, options.keep_scanned_holders)
        self.requests = StepRequests(on_error=self._absorb_callback_error)
        self.step_path = StepPath(self.step_counter, self.requests, self.finder, self.runtime, self.timeline, cpu_clock)
        # a step of any clock, and a DataLoader pass begun: on the training thread (the hooks call them)
        self.tick, self.pass_started = self.step_path.tick, self.step_path.pass_started
        self.probes: ProbeBundle | None = None
        self.tree_leaves_out: frozenset[int] = frozenset()  # child processes not this run's (other ranks), set before start
        self._phases: PhaseLog | None = None  # made at start, once the probes are open
        self.ranks: RankFeeds | None = None
        self._children_env: ExportedToChildren | None = None
        self.guard: MemoryGuard | None = None  # made at start, once the limits are known
        self.view: LiveView | None = None
        self.background: BackgroundReadings | None = None  # made at start, once the probes are open
        self.evidence: RunEvidence | None = None  # what the report was assembled from
        self.report: Report | None = None
        self._hooks: TrainingHooks | None = None
        self._sampler: Sampler | None = None
        self._grad_enabled_at_start = True

    @property
    def running(self) -> bool:
        return self.runtime.running

    @property
    def clock(self) -> Clock:
        """What a step is: the best step clock seen so far ("time" while none ticked)."""
        return self.step_counter.clock

    @property
    def steps(self) -> int:
        return self.step_counter.steps

    @property
    def own_cpu_s(self) -> float:
        """CPU time memwatch itself used: the step samples, the sampler thread (known once stopped) and
        the leak finder's scans during the run (the benchmarks compare it with the wall time)."""
        scans_s = self.finder.spent_s if self.finder is not None else 0.0
        return self.step_counter.samples_cpu_s + scans_s + (self._sampler.cpu_s if self._sampler is not None else 0.0)

    def _absorb_callback_error(self, exc: Exception) -> None:
        assert self._hooks is not None
        self._hooks.absorb_error(exc)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> MemwatchSession:
        """Install probes, hooks and the sampler thread. RuntimeError if another session is active."""
        with _registry.lock:
            if _registry.active is not None:
                raise RuntimeError("only one memwatch session can be active at a time")
            if self.runtime.started_s is not None or self.probes is not None:
                raise RuntimeError("a MemwatchSession can only be started once")
            _registry.active = self
        options = self.options
        try:
            self._grad_enabled_at_start = grad_enabled()
            probes = self.probes = ProbeBundle(options.shm_path, self._devices, self.tree_leaves_out)
            self._phases = PhaseLog(probes.step_row, lambda: self.step_counter.steps)
            if options.watch_ranks:
                self._watch_ranks()
            if options.guard_share is not None:
                shm = probes.shm_usage()
                self.guard = MemoryGuard(
                    options.guard_share, probes.limit, shm.total_bytes if shm else None, probes.accelerator,
                    options.interval_s, shm=probes.shm,
                )
                self.requests.on_raise = self.guard.note_raised
            if self.finder is None or not self.finder.inherits_scan:  # a forked rank's watcher collected just before
                collect_young_garbage()
            if self.finder is not None:  # what each name held before the cell: `new_in_cell`
                self.finder.start()
            view = self.view = LiveView(
                options, self.runtime, self.step_counter, self.timeline, probes, self.finder, self.ranks, self.guard
            )
            self.step_path.probes, self.step_path.guard, self.step_path.view = probes, self.guard, view
            self.background = BackgroundReadings(
                self.step_counter, self.timeline, self.runtime, probes, self.requests, view, self._cpu_clock,
                self.ranks, self.recorder, self.guard, self.listener, self.finder,
                search=SearchJudge(view, self.finder, self.runtime.clock) if self.finder is not None else None,
            )
            self.runtime.start()
            if self.ranks is not None:
                self.ranks.start(self.runtime.started_s or 0.0)
            self.timeline.by_time.append(self.background.row())
            if self.recorder is not None:
                self.recorder.start(self.view)
            self._install_hooks()
            listener = self.listener
            self._sampler = Sampler(
                self.background.row, self.timeline.by_time, options.interval_s,
                on_tick=self.background.on_tick if listener is not None else None,
                tick_period_s=getattr(listener, "tick_period_s", 0.5),
                on_tick_share=getattr(listener, "tick_cpu_share", None),
                tick_max_period_s=getattr(listener, "tick_max_period_s", None),
                clock=self.runtime.clock, cpu_clock=self._cpu_clock,
            )
            self._sampler.start()
            self.requests.start()
        except BaseException:  # a KeyboardInterrupt during the scan before the run, too
            self._teardown()
            despite_interrupts(self._close_sources, [])  # an interrupt during the start: no socket directory left
            raise
        return self

    def _install_hooks(self) -> None:
        """The step clocks' hooks: adopted from the session that forked this one, else installed."""
        on_forked = self._forked_process_handler()
        if self._adopt_hooks is not None:
            self._hooks = self.step_path.attach(self._adopt_hooks)
            self._hooks.adopt(self.tick, self.pass_started, on_forked)
        elif self.options.train_hooks:
            self._hooks = self.step_path.attach(TrainingHooks(self.tick, self.pass_started, on_forked))
            self._hooks.install()

    def _watch_ranks(self) -> None:
        """Ranks forked from this process, and those a launcher started in the block (torchrun, a spawned
        launcher: they inherit where to stream), stream here."""
        from ..ranks.feed import RankFeeds
        from ..ranks.launch_env import ExportedToChildren

        options = self.options
        self.ranks = RankFeeds(self.runtime.clock, own_process=not options.train_hooks)  # `watch` trains nothing
        self._children_env = ExportedToChildren()
        self._children_env.export(self.ranks.address, options.forwarded(scan=self.finder is not None))

    def _forked_process_handler(self) -> Callable[[TrainingHooks, StepClock | None], None] | None:
        """How a process forked from this one is watched: as a rank streaming to this session."""
        if self.ranks is None or self._rank_agent is None:
            return None
        search = {} if self.finder is None else self.finder.forked_search()
        # each rank watches the devices it uses itself
        settings = RankSettings(self.ranks.address, self.options.interval_ms, shm_path=self.options.shm_path, **search)
        return functools.partial(self._rank_agent, settings)

    def _teardown(self) -> None:
        """Remove hooks and stop the thread; idempotent, and first thing done on every exit path."""
        self.requests.close()
        try:
            if self._hooks is not None:
                self._hooks.remove()
            if self._sampler is not None:
                self._sampler.stop()
        finally:  # an interrupt while the sampler is joined must not leave this session active for good
            with _registry.lock:
                if _registry.active is self:
                    _registry.active = None

    def _let_go(self) -> None:
        """Let go of the roots provider (it may reference the user's namespace) and close the sources
        (safe to repeat: an rmtree cut short leaves the directory)."""
        if self.finder is not None:
            self.finder.close()
        self._close_sources()

    def _close_sources(self) -> None:
        """Close the /proc readers, the ranks' socket (and its temp directory), and remove the flight
        record: the run ended with this process alive. The probes close once the sampler thread has
        ended: a reading stuck past its join would otherwise read from closed files."""
        probes = self.probes
        if probes is not None:
            if self._sampler is not None:
                self._sampler.when_ended(probes.close)
            else:
                probes.close()
        if self._children_env is not None:
            self._children_env.restore()
        if self.ranks is not None:
            self.ranks.close()
        if self.recorder is not None:
            self.recorder.close()

    def stop(self, exc: BaseException | None = None) -> Report:
        """End the session (idempotent) and return its Report; `exc` is what ended the block, if anything.

        A DataLoader worker's death that torch's SIGCHLD handler raises into this method (it raises
        into whatever runs at that moment) is raised once the report exists (chained to `exc`), never
        lost; when `exc` is that death already, repeats are dropped. Which worker died and how is
        read from the workers' exit statuses, whatever exception the loop happened to see. A
        KeyboardInterrupt while the session stops (the end scan takes up to a second) finishes the
        teardown and makes the report without the leak finder, then the interrupt is raised.
        """
        if self.report is not None:
            return self.report
        if exc is not None:
            clear_own_frames(exc)
        ending = Ending(exc)
        try:
            ending.run(self._teardown)
        finally:
            ending.run(self.runtime.end)
        if restore_after_cut_step(exc, self._grad_enabled_at_start):
            print("torchmem_magic: the interrupt cut into the optimizer's step as it put autograd's grad mode back; "
                  f"grad mode is {'on' if self._grad_enabled_at_start else 'off'} again, as before the run", file=sys.stderr)

        def make_report(scan: bool) -> None:
            if self.background is not None:
                self.background.final()
            finder, steps = self.finder, self.step_counter.steps
            suspects = finder.finish(scan, steps) if finder is not None else ()
            self.evidence = self._evidence(ending.ended_by(), suspects)
            self.report = assemble_report(self.evidence)
            report = self.report
            if not scan or finder is None:
                return
            try:
                searched = self._searched(report, finder, steps)
            except Exception as exc:  # the report stands without it, and says that it failed
                failed = SourceErrors(SEARCH_SOURCE, 1, f"{type(exc).__name__}: {exc}")
                self.evidence = replace(self.evidence, source_errors=(*self.evidence.source_errors, failed))
                self.report = assemble_report(self.evidence)
                return
            if searched is not None:
                self.evidence = replace(self.evidence, holder_search=searched)
                self.report = assemble_report(self.evidence)

        try:
            ending.run_or_fall_back(lambda: make_report(True), lambda: make_report(False))
        finally:
            ending.run(self._let_go)  # a death or a Ctrl-C here must not lose the report: it is not stored yet
        assert self.report is not None
        report = _registry.last = self.report
        self._show(report, ending.deaths)
        ending.raise_kept()
        return report

    def _show(self, report: Report, deaths: list[BaseException]) -> None:
        """The finished report to the live view's listener (the figure, a stream) and to stdout. A renderer
        that fails says so in one line and the run's end stands: the report is kept (`last_report()`), the
        block's own exception is still the one raised; a Ctrl-C meanwhile is the user's."""
        listener, view = self.listener, self.view
        if view is not None:
            view._finished(report)
            if listener is not None:
                _said_if_failing("its live view", lambda: despite_worker_deaths(lambda: listener.on_finish(view, report), deaths))
        if self.options.print_report:
            _said_if_failing("its text", lambda: print(report))

    @staticmethod
    def _searched(report: Report, finder: LeakFinder, steps: int) -> HolderSearch | None:
        """Where the memory is, for a report with no holder yet (see `LeakFinder.search_unheld`), or what
        the searches mid-run found that no trend of its own says."""
        if not needs_holder_search(report.verdict, report.suspects):
            return finder.found_mid_run(report.suspects)
        summary = getattr(report, report.resource or "", None)
        per_step = getattr(summary, "per_step_bytes", None) or 0.0
        grown = per_step * (report.wall_s if report.clock == "time" else steps)
        return finder.search_unheld(steps, grown)

    def end_when_returned(self, frame: FrameType, ended: Callable[[], None]) -> None:
        """Run `ended()` once, on the sampler thread, when `frame` no longer runs on the thread that calls
        this: the end of a run whose failure calls no hook of ours (a transformers Trainer's). The frame is
        not kept (see `RunningFrame`)."""
        if self.background is None or not self.runtime.running:
            raise RuntimeError("the session is not running")
        self.background.returned.append((RunningFrame(frame), ended))

    def mark_phase(self, name: str, began: bool) -> None:
        """A pass of a phase of its own ("validation") begins or ends, as a trainer's callback sees it (on the
        training thread): the report says where a leak grows when it is in such passes."""
        if self._phases is not None and self.runtime.running:
            self._phases.mark(name, began)

    def _evidence(self, exc: BaseException | None, suspects: tuple[Suspect, ...]) -> RunEvidence:
        """What this run gathered, as plain data for `assemble_report`: what ended it as an `Ended`, never
        the exception, whose traceback holds the user's frames for as long as the evidence lives."""
        ended = ended_by(exc)
        assert self.probes is not None
        counter, finder = self.step_counter, self.finder
        parts = (self._hooks, self._sampler, self.recorder)
        errors = [*self.probes.error_counts(), *(part.errors for part in parts if part is not None)]
        return RunEvidence(
            timeline=self.timeline,
            wall_s=self.runtime.elapsed_s(),
            interval_s=self.options.interval_s,
            **self.probes.evidence_fields(),
            **counter.evidence_fields(self.timeline),
            suspects=suspects,
            ended=ended,
            source_errors=merged_errors(errors),
            **({} if finder is None else finder.evidence_fields()),
            ranks=None if self.ranks is None else self.ranks.summaries(ended),
            guard_advice=() if self.guard is None else self.guard.advice(ended, counter.clock, counter.steps),
            phase_passes=() if self._phases is None else tuple(self._phases.passes),
        )

    def __enter__(self) -> MemwatchSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:  # a Ctrl-C's traceback, too, must be one IPython can show
            give_lines(exc)
        try:
            self.stop(exc)
        except BaseException as cut:  # a Ctrl-C or a worker's death at stop()'s first line, before its `try`
            if self.report is not None or not cuts_in_anywhere(cut):
                raise
            self.stop(exc)
            if exc is None:  # it ends the block, as it would have in the body
                raise
