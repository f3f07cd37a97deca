"""A Lightning fit of 2 CPU ranks (`strategy="ddp"`, the script launched again for rank 1), rank 1 alone keeping
each step's activations on its module; rank 0 saves its report to argv[1] and says whether `last_report()`
is the callback's."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchmem_magic
from torchmem_magic.integrations.lightning import MemwatchCallback


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        self.train_outputs: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        if self.global_rank == 1:  # 128 KiB a step, never cleared
            self.train_outputs.append(self.net[:2](x).detach().repeat(4, 1))
        return self.net(x).square().mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    callback = MemwatchCallback()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3, logger=False,
                        callbacks=[callback], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    model = Regressor()
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(32 * 200, 64)), batch_size=32))
    if trainer.is_global_zero:
        with open(sys.argv[1], "w") as file:
            json.dump({"report": callback.report.to_dict(),
                       "is_last_report": callback.report is torchmem_magic.last_report()}, file)
