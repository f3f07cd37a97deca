"""`MemwatchCallback` for the Hugging Face transformers Trainer: one line in its callbacks, nothing else to
change.

    trainer = Trainer(model, args, train_dataset=..., callbacks=[MemwatchCallback()])

The session spans `train()`; its steps are the Trainer's optimizer steps (gradient accumulation counts what
really stepped), and each evaluation is a phase of its own: a leak that grows while evaluating is called so. At each of the Trainer's logging steps (`logging_steps`) the curves and the leak rate join
its logs as `memwatch/...` keys before it records them, so `state.log_history` and every `report_to`
integration (TensorBoard, W&B, MLflow...) get them. At the end the report is printed (shown, in a notebook)
by the main process; `callback.report` is the same Report `last_report()` returns. The Trainer calls no hook
when a run fails, so a run that raises ends its session at the end of the cell (in a script: as the
uncaught exception is printed), with the report. Inside a `%%memwatch` cell no second session starts.
Needs transformers: `pip install 'torchmem_magic[transformers]'`."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from ..core.option_args import takes_options
from ..core.options import MemwatchOptions
from .rank_gather import other_ranks_pids
from .trainer_watch import TrainerWatch

EXTRA_HINT = "pip install 'torchmem_magic[transformers]'"

try:
    from transformers import Trainer, TrainerCallback
except ImportError:
    raise ImportError(f"torchmem_magic.integrations.transformers needs transformers: {EXTRA_HINT}") from None


def _running_trainer() -> Any:
    """The Trainer whose `train()` called the hook now running: the nearest frame of one of its methods."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None


class MemwatchCallback(TrainerCallback):
    """Watch the memory of a transformers Trainer's run (see the module's docstring).

    Args:
        interval_ms, device, quiet, shm_path, scan, guard: as `torchmem_magic.memwatch()`.
        fail_on_leak: a leak raises LeakError once the report is out (for CI).
    """

    @takes_options
    def __init__(self, options: MemwatchOptions, *, fail_on_leak: bool = False) -> None:
        self._watch = TrainerWatch(options, fail_on_leak)
        self._trainer: Any = None  # the Trainer whose `log` carries the keys, while its run goes on
        self._evaluating = False  # between an evaluation's first prediction step and its `on_evaluate`

    @property
    def report(self) -> Any:
        """The last run's Report (None before one ended, and for a run inside a `%%memwatch` cell); under
        DDP, rank 0's with every rank in it."""
        return self._watch.latest_report()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._watch.begin(end_unseen=True, leave_out=other_ranks_pids())  # every rank starts here together
        self._evaluating = False
        trainer = _running_trainer()
        if trainer is not None and self._watch.session is not None:
            self._with_our_keys(trainer)

    # an evaluation is a phase of its own: it begins at its first prediction step, ends at `on_evaluate`
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._evaluating:
            self._evaluating = True
            self._watch.mark_phase("evaluation", began=True)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._evaluating:
            self._evaluating = False
            self._watch.mark_phase("evaluation", began=False)

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self._evaluating = False  # `predict()`'s prediction steps were no evaluation: its end is not one either

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        report = self._watch.end_of_run(None, shows=bool(state.is_world_process_zero))
        if report is not None:
            self._watch.raise_if_leak(report, None)

    def _with_our_keys(self, trainer: Any) -> None:
        """The Trainer's `log` adds the keys to each log of a new step before it records it: the Trainer keeps
        its history, then calls the reporting integrations before any user callback's `on_log`."""
        original, watch, logged = trainer.log, self._watch, [-1]

        def log(logs: dict[str, float], *args: Any, **kwargs: Any) -> Any:
            step = trainer.state.global_step
            if step != logged[0] and watch.session is not None:
                logs.update(watch.scalars())
                logged[0] = step
            return original(logs, *args, **kwargs)

        trainer.log = log
        self._trainer = trainer
        watch.at_finish.append(self._let_go_of_log)  # also where the run failed and the cell's end ended it

    def _let_go_of_log(self) -> None:
        trainer, self._trainer = self._trainer, None
        if trainer is not None and "log" in vars(trainer):
            del trainer.log
