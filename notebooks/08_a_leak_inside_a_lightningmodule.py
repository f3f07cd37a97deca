# ---
# jupyter:
#   jupytext:
#     comment_magics: false
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A leak inside a LightningModule
#
# With Lightning you do not write the loop: `trainer.fit(...)` runs it, and your code lives in the hooks of a `LightningModule`. A leak there looks like any other from the outside — the process grows until it is killed — but there is no loop of yours to put under `%%memwatch`. One callback is enough: it watches the run that `fit` makes, logs the memory curves where your other metrics go, and at the end names the attribute of your module that keeps the memory.
#
# Below: a small model that learns embeddings and, at the end of each validation pass, measures how many validation points lie nearest their own class's mean embedding — an epoch-end metric written the way Lightning's own docs write one. It has one leak.

# %%
%load_ext torchmem_magic
import csv, logging, tempfile, warnings
from pathlib import Path
import torch, lightning as L
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from lightning.pytorch.loggers import CSVLogger
from torchmem_magic.integrations.lightning import MemwatchCallback
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no banners about GPUs and workers
warnings.filterwarnings("ignore", module="lightning")
torch.manual_seed(0)
torch.set_num_threads(1)
log_dir = Path(tempfile.mkdtemp(prefix="lightning-logs-"))


# %%
def clusters(n, seed):
    """Points around 16 centres in 64 dimensions; the label is the centre."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(16, 64, generator=torch.Generator().manual_seed(0)) * 2
    labels = torch.randint(0, 16, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 64, generator=g), labels)

train_loader = DataLoader(clusters(4096, seed=1), batch_size=64, shuffle=True)
val_loader = DataLoader(clusters(4096, seed=2), batch_size=256)

class Embedder(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
        self.head = torch.nn.Linear(256, 16)
        self.validation_step_outputs = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.head(self.encoder(x)), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.validation_step_outputs.append((self.encoder(x), y))  # for the metric at the epoch's end

    def on_validation_epoch_end(self):
        embeddings = torch.cat([e for e, _ in self.validation_step_outputs])
        labels = torch.cat([y for _, y in self.validation_step_outputs])
        prototypes = torch.stack([embeddings[labels == c].mean(0) for c in range(16)])  # each class's mean
        nearest = torch.cdist(embeddings, prototypes).argmin(1)
        self.log("val_prototype_accuracy", (nearest == labels).float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

def make_trainer(name, **options):
    return L.Trainer(accelerator="cpu", max_epochs=8, logger=CSVLogger(log_dir, name=name), log_every_n_steps=16,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **options)


# %% [markdown]
# ## One line: the callback
# `MemwatchCallback()` in the trainer's callbacks; nothing else changes. In a notebook the live figure shows under the cell that calls `fit`, and the report at its end.

# %%
model = Embedder()
trainer = make_trainer("leaky", callbacks=[MemwatchCallback()])
trainer.fit(model, train_loader, val_loader)
print(f"prototype accuracy after the last epoch: {trainer.callback_metrics['val_prototype_accuracy']:.1%}")

# %% [markdown]
# The curves climb in a **staircase**: flat while an epoch trains, a step up at every validation pass. The verdict is a **per-epoch leak**; the callback marked each validation pass, so the report also says where it grows (**while validating**, so much a pass), and the holder is named at its attribute: `model.validation_step_outputs`. Lightning's docs show this very pattern for metrics computed at the end of an epoch — with one more line, `self.validation_step_outputs.clear()` in `on_validation_epoch_end`. Without it, every pass's embeddings (4 MiB of them here; with a real encoder and dataset, gigabytes) stay on the module for the rest of the run.
#
# The callback also logged the curves and the leak rate to the trainer's loggers, at the steps where the trainer logs its own metrics: here, the CSV logger's `metrics.csv`, beside `train_loss` (TensorBoard, W&B or MLflow get them the same way). The rate is the verdict's so far: 0 while the run looks clean, which a leak of one step a pass does until enough passes have stepped up; the last row is the report's.

# %%
def memwatch_rows(name):
    with open(next((log_dir / name).rglob("metrics.csv"))) as file:
        rows = [row for row in csv.DictReader(file) if row.get("memwatch/heap_bytes")]
    for row in rows[::len(rows) // 5] + rows[-1:]:
        growth = row.get("memwatch/growth_bytes_per_step") or "-"
        print(f"step {row['step']:>4}: heap {float(row['memwatch/heap_bytes']) / 2**20:6.1f} MiB · growth/step {growth}")

memwatch_rows("leaky")

# %% [markdown]
# ## The fix
# Clear the list once the metric is computed:

# %%
class FixedEmbedder(Embedder):
    def on_validation_epoch_end(self):
        super().on_validation_epoch_end()
        self.validation_step_outputs.clear()  # the line Lightning's docs end this hook with

del model, trainer
model = FixedEmbedder()
trainer = make_trainer("fixed", callbacks=[MemwatchCallback()])
trainer.fit(model, train_loader, val_loader)
print(f"prototype accuracy after the last epoch: {trainer.callback_metrics['val_prototype_accuracy']:.1%}")

# %% [markdown]
# The same learning curve, and the staircase is gone: the verdict is **clean**, no holder is named, and the logged growth is 0.
#
# In CI, `MemwatchCallback(fail_on_leak=True)` makes a leaking fit raise `torchmem_magic.LeakError` after the report, so a test that fits a few epochs fails on a leak like this one. The same callback exists for the Hugging Face `Trainer`: `torchmem_magic.integrations.transformers.MemwatchCallback`.

# %%
memwatch_rows("fixed")
