"""`MemwatchCallback` for Lightning 2.x (`lightning` and `pytorch_lightning` alike): one line in the Trainer's
callbacks, nothing else to change.

    trainer = L.Trainer(callbacks=[MemwatchCallback()])

The session spans `fit` (or `validate`, `test`, `predict` called alone); its steps are the trainer's optimizer
steps (gradient accumulation and manual optimisation count what really stepped), and each validation pass is a
phase of its own: a leak that grows while validating is called so. At every logging step
(`log_every_n_steps`) the curves and the leak rate go to the trainer's loggers as `memwatch/...` metrics, at
the step the trainer logs its own metrics at. At the end the report is printed (shown, in a notebook) by rank
0; `callback.report` is the same Report `last_report()` returns. Inside a `%%memwatch` cell no second session
starts: the cell's session gives the metrics and the report. Needs Lightning:
`pip install 'torchmem_magic[lightning]'`."""

from __future__ import annotations

import importlib
from typing import Any

from ..core.option_args import takes_options
from ..core.options import MemwatchOptions
from .rank_gather import other_ranks_pids
from .trainer_watch import TrainerWatch

EXTRA_HINT = "pip install 'torchmem_magic[lightning]'"
#: the packages a Trainer may come from; the callback is a Callback of each one installed
LIGHTNING_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def _callback_bases() -> tuple[type, ...]:
    bases = []
    for name in LIGHTNING_PACKAGES:
        try:
            bases.append(importlib.import_module(name).Callback)
        except ImportError:  # that package is not installed (or blocked): a Trainer of the other one is fine
            continue
    if not bases:
        raise ImportError(f"torchmem_magic.integrations.lightning needs Lightning: {EXTRA_HINT}")
    return tuple(bases)


def _logging_step(trainer: Any) -> int:
    """The step the trainer logs its own metrics at (optimizer steps, accumulation counted)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    return int(getattr(loop, "_batches_that_stepped", trainer.global_step))


def _should_log(trainer: Any) -> bool:
    """Whether the trainer logs at this step (`log_every_n_steps`), as its own metrics do."""
    connector = getattr(trainer, "_logger_connector", None)
    if connector is not None and hasattr(type(connector), "should_update_logs"):
        return bool(connector.should_update_logs)
    every = trainer.log_every_n_steps
    return bool(every) and (_logging_step(trainer) + 1) % every == 0


class MemwatchCallback(*_callback_bases()):  # type: ignore[misc]  # a Callback of each Lightning installed
    """Watch the memory of a Lightning run (see the module's docstring).

    Args:
        interval_ms, device, quiet, shm_path, scan, guard: as `torchmem_magic.memwatch()`.
        fail_on_leak: a leak raises LeakError once the report is out (for CI); a run that failed keeps
            its own exception.
    """

    @takes_options
    def __init__(self, options: MemwatchOptions, *, fail_on_leak: bool = False) -> None:
        super().__init__()
        self._watch = TrainerWatch(options, fail_on_leak)

    @property
    def report(self) -> Any:
        """The last run's Report (None before one ended, and for a run inside a `%%memwatch` cell); after a
        notebook-launched DDP run (`ddp_notebook`, `ddp_spawn`), rank 0's, with every rank in it."""
        return self._watch.latest_report()

    # ---------------------------------------------------------------- the run's span
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._watch.begin(leave_out=other_ranks_pids())  # every rank starts here together

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._end(trainer, None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._end(trainer, exception)

    # validate, test or predict called on their own (not inside fit) are a run of their own
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin_alone(trainer)
        if trainer.state.fn == "fit":  # a pass inside fit is a phase of its own (the sanity check's too)
            self._watch.mark_phase("validation", began=True)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin_alone(trainer)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin_alone(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.state.fn == "fit":
            self._watch.mark_phase("validation", began=False)
        self._end_alone(trainer)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._end_alone(trainer)

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._end_alone(trainer)

    def _begin_alone(self, trainer: Any) -> None:
        if trainer.state.fn != "fit":
            self._watch.begin(leave_out=other_ranks_pids())

    def _end_alone(self, trainer: Any) -> None:
        if trainer.state.fn != "fit":
            self._end(trainer, None)

    # ---------------------------------------------------------------- the metrics
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.loggers and _should_log(trainer):
            self._log(trainer, self._watch.scalars())

    def _log(self, trainer: Any, scalars: dict[str, float]) -> None:
        if scalars:
            step = _logging_step(trainer)
            for logger in trainer.loggers:
                logger.log_metrics(scalars, step=step)

    def _end(self, trainer: Any, exception: BaseException | None) -> None:
        """The report (rank 0 shows it, with every rank's under DDP), the last figures logged, then LeakError
        for a leak where asked."""
        report = self._watch.end_of_run(exception, shows=bool(trainer.is_global_zero))
        if report is None:
            return  # not this callback's session (a %%memwatch cell's), or ended already
        if trainer.loggers and exception is None:
            self._log(trainer, self._watch.final_scalars)
        self._watch.raise_if_leak(report, exception)
