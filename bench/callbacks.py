"""What the trainers' callbacks cost: the same fit bare and with `MemwatchCallback`, interleaved A-B-A rounds in
one process, medians of per-round ratios (wall time and process CPU time of the whole fit: Lightning's or the
transformers Trainer's own work included, the callback's session start and end scans too).

Run: .venv/bin/python bench/callbacks.py [--rounds N]   (prints a markdown table)
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

LIGHTNING_BATCHES, TRANSFORMERS_STEPS = 400, 200
#: the fits are also run this many times as long: the extra seconds of the two lengths split the callback's
#: cost into what a fit pays once (the session's start and end scans, the report) and what each step pays
LONG = 4


def _lightning(watched: bool, batches: int) -> Callable[[], None]:
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from torchmem_magic.integrations.lightning import MemwatchCallback

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.net(batch[0]).square().mean()
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = DataLoader(TensorDataset(torch.randn(32 * batches, 64)), batch_size=32)

    def fit() -> None:
        callbacks: list[Any] = [MemwatchCallback(quiet=True)] if watched else []
        trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=CSVLogger(tempfile.mkdtemp()), callbacks=callbacks,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            log_every_n_steps=50)
        trainer.fit(Regressor(), data)

    return fit


def _transformers(watched: bool, steps: int) -> Callable[[], None]:
    import transformers

    from torchmem_magic.integrations.transformers import MemwatchCallback

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    data = [{"input_ids": torch.randint(0, 100, (32,)), "labels": torch.randint(0, 100, (32,))}
            for _ in range(8 * steps)]

    def train() -> None:
        args = transformers.TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=8, report_to=[],
                                              logging_steps=50, save_strategy="no", use_cpu=True, disable_tqdm=True)
        callbacks: list[Any] = [MemwatchCallback(quiet=True)] if watched else []
        transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
                             callbacks=callbacks).train()

    return train


def _timed(run: Callable[[], None]) -> tuple[float, float]:
    wall_s, cpu_s = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall_s, time.process_time() - cpu_s


def measure(make: Callable[[bool, int], Callable[[], None]], steps: int, rounds: int) -> dict[str, float]:
    """Median (over A-B-A rounds) ratios of the watched run to the mean of the bare ones around it, in %, and
    the median extra seconds."""
    bare, watched = make(False, steps), make(True, steps)
    bare()  # warm-up: imports, first-use allocations
    wall, cpu, seconds, extra = [], [], [], []
    for _ in range(rounds):
        before, run, after = _timed(bare), _timed(watched), _timed(bare)
        base_wall_s = (before[0] + after[0]) / 2
        wall.append(run[0] / base_wall_s)
        cpu.append(run[1] / ((before[1] + after[1]) / 2))
        seconds.append(base_wall_s)
        extra.append(run[0] - base_wall_s)
    return {"bare_s": statistics.median(seconds), "wall_pct": (statistics.median(wall) - 1) * 100,
            "cpu_pct": (statistics.median(cpu) - 1) * 100, "extra_s": statistics.median(extra)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    print("| fit | steps | bare | wall time, watched | process CPU, watched | extra wall time |\n|---|---|---|---|---|---|")
    for name, make, steps in (("Lightning (MLP 64-256-1, AdamW, CSV logger)", _lightning, LIGHTNING_BATCHES),
                              ("transformers Trainer (GPT-2 of one layer)", _transformers, TRANSFORMERS_STEPS)):
        extra = []
        for length in (steps, LONG * steps):
            row = measure(make, length, rounds)
            extra.append(row["extra_s"])
            print(f"| {name} | {length} | {row['bare_s']:.2f} s | {row['wall_pct']:+.1f} % | {row['cpu_pct']:+.1f} % |"
                  f" {row['extra_s'] * 1e3:+.0f} ms |")
        per_step_s = (extra[1] - extra[0]) / ((LONG - 1) * steps)
        print(f"| {name}: split | | | once a fit {(extra[0] - per_step_s * steps) * 1e3:+.0f} ms |"
              f" each step {per_step_s * 1e6:+.1f} µs | |")


if __name__ == "__main__":
    main()
