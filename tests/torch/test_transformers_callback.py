"""`MemwatchCallback` in a real transformers Trainer (5.x, with accelerate, on CPU): the verdict and the holder of
a leaking Trainer, a clean one never called a leak, the keys in `state.log_history` and in the TensorBoard event
file its `report_to` integration wrote (read back with tensorboard's own reader), gradient accumulation counted in
optimizer steps, `fail_on_leak`, and a run that raises in a script."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import torchmem_magic

transformers = pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from torchmem_magic.integrations.transformers import MemwatchCallback  # noqa: E402
from torchmem_magic.session.run import active_session  # noqa: E402

HEAP, GROWTH = "memwatch/heap_bytes", "memwatch/growth_bytes_per_step"


#: the step the runs wait at until the sampler thread has worked out a live verdict (it does once a second at
#: most): the logging steps after it carry the leak rate, however fast the machine runs the steps before it
VERDICT_BY_STEP = 100


def _wait_for_a_live_verdict() -> None:
    """Until the sampler thread has worked out a live verdict after this step: one from step 30 (too early to
    see the leak) would otherwise stand for the rest of a run this fast."""
    session = active_session()
    view = None if session is None else session.view
    if view is None:
        return
    asked_s = view.elapsed_s
    deadline = time.monotonic() + 60  # a guard against a hang, not a timing assumption
    while (live := view.last_live_verdict()) is None or live[0] <= asked_s:
        assert time.monotonic() < deadline, "no live verdict in a minute"
        time.sleep(0.01)


class KeepingTrainer(transformers.Trainer):
    """Keeps every step's logits (a perplexity at the end, say), never cleared: 8 x 32 x 100 floats, 100 KiB."""

    def __init__(self, *args: Any, keep: bool = False, keep_eval: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keep, self.keep_eval, self.kept_logits = keep, keep_eval, []

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any) -> Any:
        if self.state.global_step == VERDICT_BY_STEP and model.training:
            _wait_for_a_live_verdict()
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, **kwargs)
        if self.keep if model.training else self.keep_eval:
            self.kept_logits.append(outputs.logits.detach())
        return (loss, outputs) if return_outputs else loss


def _train(tmp_path: Path, callback: MemwatchCallback, keep: bool, batches: int = 80, accumulation: int = 1,
           epochs: int = 2, keep_eval: bool = False, eval_batches: int = 0) -> KeepingTrainer:
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    data = [{"input_ids": torch.randint(0, 100, (32,)), "labels": torch.randint(0, 100, (32,))}
            for _ in range(8 * batches)]
    args = transformers.TrainingArguments(
        str(tmp_path / "out"), per_device_train_batch_size=8, num_train_epochs=epochs, logging_steps=10,
        report_to=["tensorboard"], save_strategy="no", use_cpu=True,
        gradient_accumulation_steps=accumulation, disable_tqdm=True, per_device_eval_batch_size=8,
        **({"eval_strategy": "steps", "eval_steps": 40} if eval_batches else {}),
    )
    trainer = KeepingTrainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
                             eval_dataset=data[: 8 * eval_batches] if eval_batches else None,
                             callbacks=[callback], keep=keep, keep_eval=keep_eval)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return trainer


def _history(trainer: KeepingTrainer, key: str) -> list[tuple[int, float]]:
    return [(entry["step"], entry[key]) for entry in trainer.state.log_history if key in entry]


def test_a_leak_is_named_and_its_keys_are_in_the_history_and_in_tensorboard(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    trainer = _train(tmp_path, callback, keep=True)
    report = callback.report
    assert report is torchmem_magic.last_report() and report.verdict == "leak" and report.steps == 160
    assert report.suspects, str(report)
    top = report.suspects[0]
    assert top.name == "trainer" and top.path.startswith("trainer.kept_logits"), report.suspects
    heap = _history(trainer, HEAP)
    assert [step for step, _ in heap][:3] == [10, 20, 30] and heap[-1][0] == 160, heap  # each logging step
    assert heap[-1][1] - heap[0][1] >= 0.5 * 102400 * (heap[-1][0] - heap[0][0]), heap
    assert _history(trainer, GROWTH)[-1][1] == pytest.approx(102400, rel=0.3)
    accumulator = EventAccumulator(str(next((tmp_path / "out").rglob("events.out.tfevents.*")).parent))
    accumulator.Reload()
    written = {e.step: e.value for e in accumulator.Scalars(f"train/{HEAP}")}  # its integration's "train/" prefix
    assert written and all(written[step] == pytest.approx(value, rel=1e-6) for step, value in heap), (written, heap)
    assert "log" not in vars(trainer)  # the Trainer's own `log` again once the run ended


def test_a_clean_run_is_never_a_leak(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    trainer = _train(tmp_path, callback, keep=False)
    assert callback.report.verdict == "clean"
    assert _history(trainer, GROWTH)[-1][1] == 0.0


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    _train(tmp_path, callback, keep=True, batches=80, accumulation=4, epochs=1)
    assert (callback.report.steps, callback.report.clock) == (20, "optimizer")


def test_fail_on_leak_raises_leak_error_after_the_report(tmp_path: Path, capsys: Any) -> None:
    callback = MemwatchCallback(fail_on_leak=True)
    with pytest.raises(torchmem_magic.LeakError):
        _train(tmp_path, callback, keep=True)
    assert "verdict: leak" in capsys.readouterr().out and active_session() is None


SCRIPT = """\
import torch, transformers, warnings
from torchmem_magic.integrations.transformers import MemwatchCallback
transformers.logging.set_verbosity_error(); warnings.simplefilter("ignore")
class Failing(transformers.Trainer):
    def compute_loss(self, model, inputs, **kwargs):
        if self.state.global_step == 30:
            raise RuntimeError("a bad batch")
        return super().compute_loss(model, inputs, **kwargs)
config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
data = [{"input_ids": torch.randint(0, 100, (32,)), "labels": torch.randint(0, 100, (32,))} for _ in range(400)]
args = transformers.TrainingArguments(OUT, per_device_train_batch_size=8, report_to=[], save_strategy="no",
                                      use_cpu=True, disable_tqdm=True)
Failing(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
        callbacks=[MemwatchCallback()]).train()
"""


def test_a_script_whose_run_raises_prints_the_report_then_the_traceback(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT.replace("OUT", repr(str(tmp_path / "out")))],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "memwatch: failed · 30 steps" in result.stdout and "stopped by RuntimeError: a bad batch" in result.stdout
    assert "RuntimeError: a bad batch" in result.stderr


def test_without_transformers_the_import_is_one_line() -> None:
    code = "import sys; sys.modules['transformers'] = None\nimport torchmem_magic.integrations.transformers"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: torchmem_magic.integrations.transformers needs transformers: "
        "pip install 'torchmem_magic[transformers]'"
    )


def test_inside_a_running_session_no_second_one_starts(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    with torchmem_magic.memwatch(quiet=True) as outer:
        trainer = _train(tmp_path, callback, keep=True, epochs=1)
    assert callback.report is None and outer.report.steps == 80 and outer.report.verdict == "leak"
    assert _history(trainer, HEAP) and "log" not in vars(trainer)  # the running session's figures, then let go


def test_a_leak_that_grows_only_while_evaluating_is_called_so(tmp_path: Path) -> None:
    """Training keeps nothing; each evaluation (every 40 steps of 160) keeps its 40 batches' logits. The curves
    step up between two optimizer steps; the evaluations the callback marked say where."""
    callback = MemwatchCallback(quiet=True)
    _train(tmp_path, callback, keep=False, keep_eval=True, eval_batches=40)
    report = callback.report
    said = [line for line in report.advice if line.startswith("it grows while evaluating: ")]
    assert report.verdict == "leak" and said and "a pass over 4 passes" in said[0], report.advice
