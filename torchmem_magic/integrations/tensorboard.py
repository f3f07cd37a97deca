"""`memwatch(log_to=writer)`: the memory curves and the leak rate as TensorBoard scalars, written from the
sampler thread (the training thread does nothing more), with the step as the global step.

The writer is any object with `add_scalar(tag, value, global_step)` and `flush()`, such as
`torch.utils.tensorboard.SummaryWriter` (which needs the `tensorboard` package: `pip install
torchmem_magic[tensorboard]`); this module imports neither."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..core.resources import by_key
from ..report.rates import leak_rate
from ..report.scalars import memory_scalars

if TYPE_CHECKING:
    from ..render.results import Report
    from ..session.live_view import LiveView

#: how often the scalars are written while the run goes on (they are a log, not the live figure)
LOG_PERIOD_S = 1.0
EXTRA_HINT = "pip install 'torchmem_magic[tensorboard]'"


class ScalarWriter(Protocol):
    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> Any: ...

    def flush(self) -> Any: ...


def checked_writer(writer: object) -> ScalarWriter:
    """`writer` as a ScalarWriter; TypeError in one line for anything else (the run has not started)."""
    if not callable(getattr(writer, "add_scalar", None)) or not callable(getattr(writer, "flush", None)):
        raise TypeError(
            f"log_to: expected a torch.utils.tensorboard.SummaryWriter (an object with add_scalar and flush),"
            f" got {type(writer).__name__}"
        )
    return writer  # type: ignore[return-value]  # checked above


class ScalarLog:
    """A session's listener (see `Listener`): every LOG_PERIOD_S, the last reading of each curve and the leak
    rate so far, at the run's step (a run without a step clock: its whole seconds); at the end, the
    report's figures, then a flush. One write a step at most. The writer is let go when the run ends."""

    tick_cpu_share: float | None = None

    def __init__(self, writer: ScalarWriter, period_s: float = LOG_PERIOD_S) -> None:
        self.tick_period_s = period_s
        self._writer: ScalarWriter | None = writer
        self._logged_step = -1
        self.writes = 0  # scalars written (the tests and the benchmarks count them)

    def on_tick(self, view: LiveView) -> None:
        step = _global_step(view)
        if step == self._logged_step:
            return  # no step since the last write: the same point again says nothing
        diagnosis = view.live_verdict()
        verdict = None if diagnosis is None else diagnosis.verdict
        self._write(view, step, verdict, None if diagnosis is None else diagnosis.per_step_bytes)

    def on_finish(self, view: LiveView, report: Report) -> None:
        """The report's figures at the last step, unless the last write was at that step already (a step
        logged twice would draw a spike)."""
        try:
            step = _global_step(view)
            if step != self._logged_step:
                self._write(view, step, report.verdict, leak_rate(report, report.resource))
            if self._writer is not None:
                self._writer.flush()
        finally:
            self._writer = None

    def _write(self, view: LiveView, step: int, verdict: str | None, per_step_bytes: float | None) -> None:
        writer, reading = self._writer, view.last_reading
        if writer is None or reading is None:
            return
        for tag, value in memory_scalars(reading, verdict, per_step_bytes).items():
            writer.add_scalar(tag, value, global_step=step)
            self.writes += 1
        self._logged_step = step


def _global_step(view: LiveView) -> int:
    return int(view.elapsed_s) if view.clock == "time" else view.steps


class LoggerUnavailable(Exception):
    """TensorBoard's writer cannot be made here (no tensorboard package): one line."""


def summary_writer_class() -> Callable[[str], ScalarWriter]:
    """torch's SummaryWriter; LoggerUnavailable where the tensorboard package is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise LoggerUnavailable(f"--tensorboard needs the tensorboard package: {EXTRA_HINT}") from None
    return SummaryWriter


class RankScalarLog:
    """The watcher's listener for `watch --tensorboard DIR`: each rank's curves and leak rate, as the live
    status judges them, in a run of its own (`DIR/rank<N>`, so TensorBoard draws the ranks over each other),
    at that rank's steps, once a step at most, flushed at every write."""

    tick_cpu_share: float | None = None

    def __init__(self, directory: Path, writer_class: Callable[[str], ScalarWriter] | None = None,
                 period_s: float = LOG_PERIOD_S) -> None:
        """LoggerUnavailable without `writer_class` where tensorboard is not installed (before any run)."""
        self.tick_period_s = period_s
        self.directory = directory
        self._writer_class = summary_writer_class() if writer_class is None else writer_class
        self._writers: dict[int, ScalarWriter] = {}
        self._logged_steps: dict[int, int] = {}

    def on_tick(self, view: LiveView) -> None:
        for rank in view.live_ranks():
            if not rank.readings or self._logged_steps.get(rank.rank) == rank.steps:
                continue
            writer = self._writers.get(rank.rank)
            if writer is None:
                writer = self._writers[rank.rank] = self._writer_class(str(self.directory / f"rank{rank.rank}"))
            readings = {by_key(key).column: value for key, value in rank.readings}
            for tag, value in memory_scalars(readings, rank.verdict, rank.per_step_bytes).items():
                writer.add_scalar(tag, value, global_step=rank.steps)
            writer.flush()  # a second's points on disk: TensorBoard shows the run as it goes
            self._logged_steps[rank.rank] = rank.steps

    def on_finish(self, view: LiveView, report: Report) -> None:
        try:
            self.on_tick(view)  # the ranks as the report judged them
        finally:
            for writer in self._writers.values():
                writer.flush()
                close = getattr(writer, "close", None)
                if callable(close):
                    close()
            self._writers.clear()
