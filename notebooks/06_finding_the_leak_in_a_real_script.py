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
# # Finding the leak in a real training script
#
# The classic leaks are easy to spot in a five-line loop. In a real script they hide: the training step is right, validation looks right, and the tensor that keeps memory alive goes through a helper class before it lands in a container nobody looks at.
#
# Below is an ordinary image-classification script — a small CNN on synthetic 28×28 images, AdamW with a learning-rate schedule, gradient clipping, a validation pass each epoch and a metrics logger. It has one leak. Try to find it by reading first; then let `%%memwatch` find it.

# %%
%load_ext torchmem_magic
from collections import defaultdict
import torch, torchmem_magic
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)


# %%
def synthetic_digits(n, seed):
    """28×28 images whose class is a brighter 7×7 tile in one of 10 places, plus noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randn(n, 1, 28, 28, generator=g)
    for c in range(10):
        r, k = divmod(c, 4)
        images[labels == c, :, 7 * r:7 * r + 7, 7 * k:7 * k + 7] += 0.25
    return TensorDataset(images, labels)

train_loader = DataLoader(synthetic_digits(2560, seed=1), batch_size=64, shuffle=True)
val_loader = DataLoader(synthetic_digits(512, seed=2), batch_size=128)

class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        )
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.2), torch.nn.Linear(16 * 7 * 7, 10))
    def forward(self, x):
        return self.head(self.features(x))


# %%
class MetricsLogger:
    """Keeps every logged value by name; prints an epoch summary."""
    def __init__(self):
        self.history = defaultdict(list)
    def log(self, **values):
        for name, value in values.items():
            self.history[name].append(value)
    def mean(self, name, last):
        values = self.history[name][-last:]
        return sum(float(v) for v in values) / len(values)
    def summary(self, epoch, steps, val_batches):
        return (f"epoch {epoch}: train loss {self.mean('train_loss', steps):.3f} · "
                f"val loss {self.mean('val_loss', val_batches):.3f} · val acc {self.history['val_acc'][-1]:.1%}")

def train_one_epoch(model, optimizer, logger):
    model.train()
    for images, labels in train_loader:
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        logger.log(train_loss=loss.item(), lr=optimizer.param_groups[0]['lr'])

def validate(model, logger):
    model.eval()  # dropout off, batch-norm statistics frozen
    correct = 0
    for images, labels in val_loader:
        logits = model(images)
        logger.log(val_loss=F.cross_entropy(logits, labels))
        correct += (logits.argmax(1) == labels).sum().item()
    logger.log(val_acc=correct / len(val_loader.dataset))


# %% [markdown]
# ## Run it under `%%memwatch`
# Five epochs. Nothing in the code looks wrong, and the accuracy climbs as it should.

# %%
%%memwatch
model = SmallCNN()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
logger = MetricsLogger()
for epoch in range(5):
    train_one_epoch(model, optimizer, logger)
    validate(model, logger)
    scheduler.step()
    print(logger.summary(epoch, len(train_loader), len(val_loader)))

# %% [markdown]
# The curves show a **staircase**: flat while an epoch trains, a step up at every validation pass. The verdict is a **per-epoch leak** (*per-epoch leak in heap: … MiB per epoch*), the report says the heap's growth and the holder's agree (*… and logger grows …: that is where it goes*), and it names the holder: `logger`, through `logger.history['val_loss']` — a list of loss *tensors*, each keeping the autograd graph of its validation batch and the activations it saved for a backward pass that never comes.
#
# That is the hidden part: `model.eval()` switches dropout and batch norm to inference mode, but it does **not** turn off autograd. Every validation forward pass still records a graph, and `logger.log(val_loss=...)` keeps it. (torch's *UserWarning: Converting a tensor with requires_grad=True to a scalar*, from `MetricsLogger.mean`, was a hint — one warning among many in a real log, and it does not say what is kept or how much.) The fix line of the report points at the list to fill under `torch.no_grad()`. `%memcheck` shows what the logger holds, tensor by tensor — a few bytes of scalar losses that keep hundreds of MiB alive:

# %%
leaky = torchmem_magic.last_report()
%memcheck logger

# %% [markdown]
# ## The fix
# Two changes, each enough on its own, both good practice: run validation under `torch.no_grad()` (no graph is recorded at all, and it is faster), and log numbers, not tensors (`.item()`). First free what the leaky run kept:

# %%
del logger
import gc; gc.collect();


# %%
@torch.no_grad()
def validate(model, logger):
    model.eval()
    correct = 0
    for images, labels in val_loader:
        logits = model(images)
        logger.log(val_loss=F.cross_entropy(logits, labels).item())
        correct += (logits.argmax(1) == labels).sum().item()
    logger.log(val_acc=correct / len(val_loader.dataset))


# %%
%%memwatch
model = SmallCNN()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
logger = MetricsLogger()
for epoch in range(5):
    train_one_epoch(model, optimizer, logger)
    validate(model, logger)
    scheduler.step()
    print(logger.summary(epoch, len(train_loader), len(val_loader)))

# %% [markdown]
# The same learning curve (give or take a fresh model's random start), and the curves are flat after the first steps: the verdict is **clean** and no holder is named. Side by side:

# %%
fixed = torchmem_magic.last_report()
for name, report in (("leaky", leaky), ("fixed", fixed)):
    heap = report.to_dict()['heap']
    holders = ', '.join(s.name for s in report.suspects if s.kind == 'autograd-graph') or '-'
    print(f"{name}: {report.verdict:5} · heap {(heap['end'] - heap['start']) / 2**20:+6.1f} MiB over the run · "
          f"graph holders: {holders}")
