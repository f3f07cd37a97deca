"""What the trainers' callbacks share: a session over the trainer's run, started where the run starts (none
when one already runs, such as a `%%memwatch` cell around `fit`), the figures for the trainer's loggers, read
on the training thread at its logging steps at the cost of a few lookups, and the report at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..core.options import MemwatchOptions
from ..report.rates import leak_rate
from ..report.scalars import memory_scalars
from ..session.run import MemwatchSession, active_session, keep_as_last
from ..tracing.frames import outermost_frame_of
from .rank_gather import gathered_report

if TYPE_CHECKING:
    from ..render.results import Report
    from ..session.live_view import LiveView

#: how often the sampler thread asks for the live verdict (it is worked out again once a second at most): the
#: first comes this soon after the steps are enough to judge
VERDICT_PERIOD_S = 0.25


class VerdictTicker:
    """A session's listener where no live figure works out the verdict: the sampler thread does, so that the
    training thread only reads it (the logged growth)."""

    tick_period_s = VERDICT_PERIOD_S
    tick_cpu_share: float | None = None

    def on_tick(self, view: LiveView) -> None:
        view.live_verdict()

    def on_finish(self, view: LiveView, report: Report) -> None:
        pass


class TrainerWatch:
    """One trainer's run watched (see the module's docstring). The options are `memwatch()`'s, checked
    when the callback is made (MemwatchOptions): a bad one fails before any training.

    Args:
        options: `quiet`: no report printed (or shown) at the end; `report` has it all the same.
        fail_on_leak: `raise_if_leak` raises LeakError for a leak (for CI).
    """

    def __init__(self, options: MemwatchOptions, fail_on_leak: bool = False) -> None:
        self._options = options
        self.quiet, self.fail_on_leak = options.quiet, fail_on_leak
        self.report: Report | None = None
        # a rank launched from this process (forked or spawned) hands its report back through a file
        self._home_pid = os.getpid()
        self._handback_path = os.path.join(tempfile.gettempdir(), f"torchmem_magic-report-{os.getpid()}-{id(self):x}.json")
        weakref.finalize(self, _remove, self._handback_path)
        self.final_scalars: dict[str, float] = {}  # the figures at the run's end, as the report judged it
        self._session: MemwatchSession | None = None
        self._finishing = threading.Lock()  # the end seen by the sampler thread and the end hook race
        self._undo_end_unseen: Callable[[], None] = _nothing
        self.at_finish: list[Callable[[], None]] = []  # what the callback undoes when the run ends, however

    @property
    def session(self) -> MemwatchSession | None:
        """The session the figures come from: this run's own, or the one running around it."""
        return self._session if self._session is not None else active_session()

    def begin(self, end_unseen: bool = False, leave_out: frozenset[int] = frozenset()) -> None:
        """The trainer's run starts (on its thread): a session of its own unless one runs already, its RAM
        without the child processes in `leave_out` (other ranks). With `end_unseen` (a trainer that calls no
        hook when its run fails), the end of the cell, or the uncaught exception of a script, ends the session
        with that failure (see `_end_unseen`)."""
        if self._session is not None:
            return
        if active_session() is None:
            self._session = self._started_session(leave_out)
        if end_unseen and self._undo_end_unseen is _nothing:  # also inside a session: `at_finish` must run
            self._undo_end_unseen = _end_unseen(self)

    def _started_session(self, leave_out: frozenset[int]) -> MemwatchSession:
        from ..api import watch_from

        namespace, frame = _user_namespace()
        session = watch_from(namespace, frame, dataclasses.replace(self._options, quiet=True))
        session.tree_leaves_out = leave_out
        figure_shown = _show_live_figure(session) if not (self.quiet or self.away) else False
        if not figure_shown:
            session.listener = VerdictTicker()
        session.start()
        return session

    def mark_phase(self, name: str, began: bool) -> None:
        """A pass of a phase of its own (validation, evaluation) begins or ends, in the session the figures
        come from (a `%%memwatch` cell's too): the report says where a leak grows when it is there."""
        session = self.session
        if session is not None:
            session.mark_phase(name, began)

    def scalars(self) -> dict[str, float]:
        """The curves' last readings and the leak rate so far (`memwatch/...`); empty before a reading."""
        session = self.session
        view = None if session is None else session.view
        reading = None if view is None else view.last_reading
        if view is None or reading is None:
            return {}
        verdict = view.latest_verdict
        return memory_scalars(reading, None if verdict is None else verdict.verdict,
                              None if verdict is None else verdict.per_step_bytes)

    def finish(self, exc: BaseException | None, show: bool = True) -> Report | None:
        """The run ended (`exc`: what ended it): its report, shown where `show` (a trainer's rank 0 shows
        it, its other ranks do not), and `final_scalars`; None where no session of this run's own ran."""
        with self._finishing:
            session, self._session = self._session, None
            undo, self._undo_end_unseen = self._undo_end_unseen, _nothing
        undo()
        while self.at_finish:  # also where the figures came from a session around the run
            self.at_finish.pop()()
        if session is None:
            return None
        report = self.report = session.stop(exc)
        reading = None if session.view is None else session.view.last_reading
        self.final_scalars = {} if reading is None else memory_scalars(
            reading, report.verdict, leak_rate(report, report.resource)
        )
        if show:
            self.show(report)
        return report

    @property
    def away(self) -> bool:
        """Whether this is a rank the callback's own process launched (a fork or a spawn of it): no widget
        of its own, its report handed back (see `latest_report`)."""
        return os.getpid() != self._home_pid

    def end_of_run(self, exc: BaseException | None, shows: bool) -> Report | None:
        """`finish`, then, where the run ended well, every rank's report at rank 0 (every rank of a DDP job
        ends here together: see `rank_gather`); the rank that `shows` shows it, and hands it back to the
        process that launched it. None where no session of this run's own ran on any rank."""
        report = self.finish(exc, show=False)
        if exc is None:
            gathered = gathered_report(report)
            if gathered is not report and gathered is not None:
                self.report = report = gathered
                keep_as_last(gathered)
        if report is not None and shows:
            self.show(report)
            if self.away:
                _write_quietly(self._handback_path, json.dumps(report.to_dict()))
        return report

    def latest_report(self) -> Report | None:
        """The last run's report: this process's own, else the one a rank it launched handed back (then also
        what `last_report()` returns here)."""
        if self.report is None and not self.away and os.path.exists(self._handback_path):
            from ..report.saved import load_report

            try:
                self.report = load_report(self._handback_path)
            except (OSError, ValueError):
                return None
            finally:
                _remove(self._handback_path)
            keep_as_last(self.report)
        return self.report

    def show(self, report: Report) -> None:
        """The report as `%%memwatch` shows it (the figure and the text, in a notebook), unless quiet; its
        text alone in a rank launched from the notebook (whose printed lines the kernel forwards)."""
        if self.quiet:
            return
        if self.away:
            print(report)
        else:
            _show_report(report)

    def raise_if_leak(self, report: Report, exc: BaseException | None) -> None:
        """LeakError for a leak under `fail_on_leak`; not when the run failed (its own exception goes on)."""
        if self.fail_on_leak and exc is None and report.verdict == "leak":
            from ..frontends.gate import LeakError

            raise LeakError(report)


#: what ended a run whose trainer called no hook of ours as it failed, where its exception was caught
FAILED_UNSEEN = "the trainer's run ended without its end hook: an exception left it (caught by the caller)"


class TrainerRunFailed(Exception):
    """A trainer's run ended by an exception that no hook of ours saw (its text: FAILED_UNSEEN)."""


def _nothing() -> None:
    pass


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def _write_quietly(path: str, text: str) -> None:
    """A report handed back: written whole or not at all (the reader must not see half a file)."""
    with contextlib.suppress(OSError):
        with open(f"{path}.part", "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(f"{path}.part", path)


def _end_unseen(watch: TrainerWatch) -> Callable[[], None]:
    """Where a failed run calls no hook, what ends its session with that failure: in IPython, the end of the
    cell (with the cell's error; a cell that ended well while the run did not, with none); in a script, the
    uncaught exception, before the interpreter's own hook prints it, or, where the script catches it, the
    sampler thread's next reading after the trainer's entry frame (`Trainer.train`) stopped running.
    Returns what undoes it."""
    shell = _shell()
    if shell is not None:
        def after_cell(result: Any) -> None:
            shell.events.unregister("post_run_cell", after_cell)
            watch._undo_end_unseen = _nothing
            watch.finish(result.error_in_exec)

        shell.events.register("post_run_cell", after_cell)
        return lambda: shell.events.unregister("post_run_cell", after_cell)
    previous = sys.excepthook
    entry, session = outermost_frame_of("transformers", sys._getframe(1)), watch._session
    if entry is not None and session is not None:
        def returned() -> None:
            watch.finish(TrainerRunFailed(FAILED_UNSEEN))

        session.end_when_returned(entry, returned)

    def uncaught(kind: type[BaseException], exc: BaseException, traceback: Any) -> None:
        sys.excepthook = previous
        watch._undo_end_unseen = _nothing
        try:
            watch.finish(exc)
        finally:
            previous(kind, exc, traceback)

    sys.excepthook = uncaught

    def undo() -> None:
        if sys.excepthook is uncaught:
            sys.excepthook = previous

    return undo


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def _user_namespace() -> tuple[dict[str, Any], FrameType | None]:
    """Where the user's names are: the notebook's, in IPython; else the running script's module."""
    shell = _shell()
    if shell is not None:
        return shell.user_ns, None
    main = sys.modules.get("__main__")
    return (vars(main) if main is not None else {}), sys._getframe(2)


def _show_live_figure(session: MemwatchSession) -> bool:
    """The live figure under the running cell, as `%%memwatch` shows it, where this is a kernel with widgets."""
    shell = _shell()
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    from ..frontends.magics import attach_live_figure, widgets_available

    if not widgets_available(shell):
        return False
    attach_live_figure(shell, session)
    return True


def _show_report(report: Report) -> None:
    """As `%%memwatch` shows it in a notebook (the figure and the text), else the text."""
    shell = _shell()
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from IPython.display import display

        display(report)
    else:
        print(report)
