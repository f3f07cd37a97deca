"""A transformers Trainer run by `torchrun --nproc-per-node 2` on CPU (gloo), rank 1 alone keeping every step's
logits; the main process saves its report to argv[1]."""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import torch
import transformers

from torchmem_magic.integrations.transformers import MemwatchCallback


class RankOneKeeps(transformers.Trainer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept_logits: list[torch.Tensor] = []

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any) -> Any:
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, **kwargs)
        if self.args.process_index == 1:  # 100 KiB a step, never cleared
            self.kept_logits.append(outputs.logits.detach())
        return (loss, outputs) if return_outputs else loss


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    data = [{"input_ids": torch.randint(0, 100, (32,)), "labels": torch.randint(0, 100, (32,))} for _ in range(8 * 300)]
    args = transformers.TrainingArguments(
        sys.argv[2], per_device_train_batch_size=8, num_train_epochs=1, report_to=[], save_strategy="no",
        use_cpu=True, ddp_backend="gloo", disable_tqdm=True, logging_steps=50,
    )
    callback = MemwatchCallback()
    trainer = RankOneKeeps(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
                           callbacks=[callback])
    trainer.train()
    if trainer.is_world_process_zero():
        with open(sys.argv[1], "w") as file:
            json.dump(callback.report.to_dict(), file)
    if torch.distributed.is_initialized():  # gloo's threads left to the interpreter's exit can abort a rank
        torch.distributed.destroy_process_group()
