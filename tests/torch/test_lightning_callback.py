"""`MemwatchCallback` in real Lightning Trainers (CPU): the verdict and the holder of a leaking LightningModule,
a clean one never called a leak, the metrics read back from the CSV logger's `metrics.csv`, gradient
accumulation counted in optimizer steps, a run that fails mid-fit, `fail_on_leak`, and a Trainer inside a
session already running."""

from __future__ import annotations

import csv
import logging
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchmem_magic

L = pytest.importorskip("lightning")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from torchmem_magic.integrations.lightning import MemwatchCallback  # noqa: E402

GROWTH = "memwatch/growth_bytes_per_step"


class Regressor(L.LightningModule):
    """A small regressor; `keep` keeps each step's hidden activations (32 KiB) on the module, never cleared;
    `fail_at` raises in that batch."""

    def __init__(self, keep: bool = False, fail_at: int = -1, keep_val: bool = False) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        self.keep, self.fail_at, self.keep_val = keep, fail_at, keep_val
        self.train_outputs: list[torch.Tensor] = []
        self.val_outputs: list[torch.Tensor] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        hidden = self.net[:2](x)
        if self.keep_val:  # 128 KiB a batch, never cleared (the missing `val_outputs.clear()`)
            self.val_outputs.append(hidden.repeat(4, 1))
        self.log("val_loss", self.net(x).square().mean())

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.fail_at:
            raise RuntimeError("a bad batch")
        (x,) = batch
        if self.keep:
            self.train_outputs.append(self.net[:2](x).detach())
        loss = self.net(x).square().mean()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _fit(tmp_path: Path, model: Regressor, callback: MemwatchCallback, batches: int = 100, epochs: int = 3,
         val_batches: int = 0, **options: Any) -> list[dict[str, str]]:
    """Fit `model` on `batches` batches a epoch with a CSV logger; the rows of its metrics.csv."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, logger=CSVLogger(tmp_path), callbacks=[callback],
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            log_every_n_steps=10, **options)
        try:
            val = DataLoader(TensorDataset(torch.randn(32 * val_batches, 64)), batch_size=32) if val_batches else None
            trainer.fit(model, DataLoader(TensorDataset(torch.randn(32 * batches, 64)), batch_size=32), val)
        finally:
            path = next(tmp_path.rglob("metrics.csv"), None)
    if path is None:
        return []
    with path.open() as file:
        return list(csv.DictReader(file))


def _ours(rows: list[dict[str, str]], tag: str) -> list[tuple[int, float]]:
    return [(int(row["step"]), float(row[tag])) for row in rows if row.get(tag)]


def test_a_leak_on_the_module_is_named_at_its_attribute_and_logged_as_it_grows(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    model = Regressor(keep=True)
    rows = _fit(tmp_path, model, callback)
    report = callback.report
    assert report is torchmem_magic.last_report() and report.verdict == "leak" and report.steps == 300
    assert report.clock == "optimizer"
    top = report.suspects[0]
    assert top.name == "model" and top.path.startswith("model.train_outputs"), report.suspects
    heap = _ours(rows, "memwatch/heap_bytes")
    # at the trainer's logging steps (every 10th), where its own metrics are, and the report's end
    assert {step for step, _ in heap} >= {19, 99, 199} and heap[-1][0] == 300, heap
    assert heap[-1][1] - heap[0][1] >= 0.5 * 32768 * (heap[-1][0] - heap[0][0]), heap
    assert _ours(rows, GROWTH)[-1][1] == pytest.approx(32768, rel=0.3)
    assert any(row.get("train_loss") for row in rows)  # the user's own metrics are still there


def test_a_clean_module_is_never_a_leak_and_logs_no_growth(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    rows = _fit(tmp_path, Regressor(), callback)
    assert callback.report.verdict == "clean"
    growth = _ours(rows, GROWTH)
    assert growth and growth[-1] == (300, 0.0), growth


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    _fit(tmp_path, Regressor(keep=True), callback, batches=120, epochs=1, accumulate_grad_batches=4)
    report = callback.report
    assert report.steps == 30 and report.clock == "optimizer", (report.steps, report.clock)


def test_a_run_that_fails_mid_fit_has_its_report_and_its_own_exception(tmp_path: Path, capsys: Any) -> None:
    callback = MemwatchCallback(fail_on_leak=True)
    with pytest.raises(RuntimeError, match="a bad batch"):  # not LeakError: the run's own failure goes on
        _fit(tmp_path, Regressor(keep=True, fail_at=60), callback, epochs=1)
    report = callback.report
    assert report is not None and report.steps == 60 and report.status == "error", report.status
    assert report.error == "RuntimeError: a bad batch"
    assert "memwatch:" in capsys.readouterr().out  # rank 0 printed it


def test_fail_on_leak_raises_leak_error_after_the_report(tmp_path: Path, capsys: Any) -> None:
    callback = MemwatchCallback(fail_on_leak=True)
    with pytest.raises(torchmem_magic.LeakError) as raised:
        _fit(tmp_path, Regressor(keep=True), callback, epochs=2)
    assert raised.value.report is callback.report and callback.report.verdict == "leak"
    assert "verdict: leak" in capsys.readouterr().out


def test_inside_a_running_session_no_second_one_starts(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    with torchmem_magic.memwatch(quiet=True) as outer:
        rows = _fit(tmp_path, Regressor(keep=True), callback, epochs=2)
    assert callback.report is None and outer.report.steps == 200 and outer.report.verdict == "leak"
    assert _ours(rows, "memwatch/heap_bytes"), rows[:3]  # the metrics come from the running session


def test_a_bad_option_fails_when_the_callback_is_made() -> None:
    with pytest.raises(ValueError, match="interval"):
        MemwatchCallback(interval_ms=0)


def test_without_lightning_the_import_is_one_line() -> None:
    code = ("import sys; sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None\n"
            "import torchmem_magic.integrations.lightning")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: torchmem_magic.integrations.lightning needs Lightning: pip install 'torchmem_magic[lightning]'"
    )


def test_validate_called_alone_is_a_run_of_its_own(tmp_path: Path) -> None:
    class Validated(Regressor):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            (x,) = batch
            self.log("val_loss", self.net(x).square().mean())

    callback = MemwatchCallback(quiet=True)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[callback], enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.validate(Validated(), DataLoader(TensorDataset(torch.randn(32 * 40, 64)), batch_size=32))
    report = callback.report
    assert report is not None and report.steps == 40 and report.clock == "batch", (report.steps, report.clock)


def test_a_pytorch_lightning_trainer_takes_the_same_callback(tmp_path: Path) -> None:
    pl = pytest.importorskip("pytorch_lightning")

    class Classic(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(64, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    callback = MemwatchCallback(quiet=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, callbacks=[callback],
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Classic(), DataLoader(TensorDataset(torch.randn(32 * 20, 64)), batch_size=32))
    assert callback.report is not None and callback.report.steps == 20


def test_a_leak_that_grows_only_while_validating_is_called_so(tmp_path: Path) -> None:
    """Training keeps nothing; each validation pass keeps 40 batches' activations on the module. The curves
    step up between two optimizer steps, and the passes the callback marked say where: while validating."""
    callback = MemwatchCallback(quiet=True)
    _fit(tmp_path, Regressor(keep_val=True), callback, val_batches=40)
    report = callback.report
    assert report.verdict == "leak", report.advice
    said = [line for line in report.advice if line.startswith("it grows while validating: ")]
    assert said and "a pass over 4 passes" in said[0], report.advice  # the sanity check's, then 3 epochs'
    assert report.advice.index(said[0]) == 1, report.advice  # right after the verdict's headline
    top = report.suspects[0]
    assert top.path.startswith("model.val_outputs"), report.suspects


def test_a_leak_in_training_is_not_blamed_on_validation(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    _fit(tmp_path, Regressor(keep=True), callback, val_batches=40)
    report = callback.report
    assert report.verdict == "leak" and not any("while validating" in line for line in report.advice), report.advice


class ManualRegressor(Regressor):
    """Manual optimisation that steps every second batch (its own accumulation)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        self.manual_backward(self.net(x).square().mean() / 2)
        if batch_idx % 2 == 1:
            opt = self.optimizers()
            opt.step()
            opt.zero_grad()


def test_manual_optimisation_counts_the_steps_the_module_takes(tmp_path: Path) -> None:
    callback = MemwatchCallback(quiet=True)
    _fit(tmp_path, ManualRegressor(), callback, batches=100, epochs=2)
    report = callback.report
    assert (report.steps, report.clock) == (100, "optimizer"), (report.steps, report.clock)
