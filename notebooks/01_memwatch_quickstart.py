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
# # Watching a training loop's memory with `%%memwatch`
#
# `%%memwatch` runs a cell's training loop while a background sampler reads the memory of the whole process tree (the kernel plus its DataLoader workers), the C heap the kernel really has in use, GPU memory (allocated vs reserved) and `/dev/shm`. It marks every optimizer step and every epoch without any change to your code, draws the curves live under the cell, and sums the run up at the end.
#
# This notebook trains a small model twice: once cleanly, once with the classic leak of a validation pass that runs without `torch.no_grad()` and keeps its outputs.

# %%
%load_ext torchmem_magic
import torch
import torchmem_magic
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)  # keeps this demo gentle on small machines

# %%
train = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
val = TensorDataset(torch.randn(1024, 256), torch.randint(0, 10, (1024,)))
train_loader = DataLoader(train, batch_size=64, shuffle=True)
val_loader = DataLoader(val, batch_size=128)

def make_model():
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


# %% [markdown]
# ## A clean loop
# Losses are logged with `.item()`, validation runs under `torch.no_grad()`. After the optimizer's first step (Adam allocates its state then) the curves stay flat. Toggle the x axis between time and optimizer steps above the figure. Dashed lines mark each training epoch: a pass of the loader whose batches carry the optimizer steps (the validation pass inside each epoch is not another epoch).

# %%
%%memwatch
model, optimizer = make_model()
history, val_scores = [], []
for epoch in range(6):
    for x, y in train_loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item())
    with torch.no_grad():
        val_scores.append(sum(model(x).argmax(1).eq(y).sum().item() for x, y in val_loader))
val_scores

# %%
clean = torchmem_magic.last_report()
clean.to_dict()['heap']

# %% [markdown]
# ## The same loop with a leak
# Now validation forgets `torch.no_grad()` and keeps its outputs for later analysis. Every output tensor keeps its autograd graph and the activations saved for a backward pass that never comes: heap in use climbs epoch after epoch (a staircase), and so does RAM.

# %%
%%memwatch
model, optimizer = make_model()
history, val_outputs = [], []
for epoch in range(6):
    for x, y in train_loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item())
    for x, y in val_loader:            # no torch.no_grad() ...
        val_outputs.append(model(x))   # ... and the outputs are kept: the leak

# %%
leaky = torchmem_magic.last_report()
print(f"heap growth per step: clean {clean.heap.per_step_bytes / 1024:.1f} KiB, "
      f"leaky {leaky.heap.per_step_bytes / 1024:.1f} KiB")

# %% [markdown]
# Under the report, **What keeps memory alive** names `val_outputs`: a list holding tensors whose autograd graphs retain the activations saved for backward, how much deleting it would free, and the fix, found in the cell's own code. `%memcheck` explains one variable in detail:

# %%
%memcheck val_outputs

# %% [markdown]
# **The fix** is one line: wrap validation in `with torch.no_grad():` (or keep `model(x).detach()` / `.argmax(1)` instead of the raw output). Then free what the leaky run kept:

# %%
del val_outputs
import gc; gc.collect();

# %% [markdown]
# ## In a script
# The same session works without IPython: `with torchmem_magic.memwatch() as w: ...` prints the text report at the end and keeps it in `w.report`.

# %%
with torchmem_magic.memwatch(interval_ms=50) as w:
    model, optimizer = make_model()
    for x, y in train_loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
w.report.steps, w.report.epochs
