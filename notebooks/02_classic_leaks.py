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
# # The classic PyTorch memory leaks, found and fixed
#
# Each section makes one leak on purpose, lets `%%memwatch` / `%memcheck` name the variable that holds the memory, and applies the one-line fix it suggests.

# %%
%load_ext torchmem_magic
import torch, torchmem_magic
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
def batch(n=64):
    return torch.randn(n, 256), torch.randint(0, 10, (n,))


# %% [markdown]
# ## 1. Logging the loss tensor instead of its value
# `history.append(loss)` keeps every step's loss *tensor*, and with it the nodes of its autograd graph. Backward already freed the saved activations, so this leak is slow — a few KiB a step — and it is exactly the kind that takes hours to kill a run.

# %%
%%memwatch --no-plot
history = []
for step in range(300):
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history.append(loss)

# %%
[(s.name, s.kind, s.fix) for s in torchmem_magic.last_report().suspects]

# %% [markdown]
# The fix is the line the report printed: `history.append(loss.item())`.

# %% [markdown]
# ## 2. Summing losses into a tensor
# `total_loss += loss` builds one ever-longer autograd chain. `%memcheck` walks only part of very long chains (touching too many nodes from Python can crash their deletion) and says its figure is an estimate.

# %%
total_loss = 0
for step in range(2000):
    x, y = batch(8)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss
%memcheck total_loss

# %%
total_loss = total_loss.item()  # the fix: keep a float

# %% [markdown]
# ## 3. A hidden state that is never detached
# Truncated backpropagation through time needs `h = h.detach()` between chunks. Without it, every step's graph stays attached to the next.

# %%
%%memwatch --no-plot
cell = torch.nn.RNNCell(64, 512)
h = torch.zeros(32, 512)
for step in range(50):
    h = cell(torch.randn(32, 64), h)
    h.pow(2).mean().backward(retain_graph=True)

# %%
[(s.name, s.kind, s.fix) for s in torchmem_magic.last_report().suspects]

# %%
h = h.detach()  # what the fix does at every step: cut the graph

# %% [markdown]
# ## 4. A big result kept by the output cache
# Displaying a value stores it in `Out`, `_N`, `_` and hidden copies. `del` of your own name does not free it.

# %%
embeddings = torch.randn(4096, 2048)  # 32 MiB
embeddings

# %%
del embeddings
%memcheck

# %%
torchmem_magic.release_output_cache()  # bytes freed


# %% [markdown]
# ## 5. An exception that keeps its frames
# After an error, IPython keeps the traceback for `%debug` — and every local of every frame in it.

# %%
def train_step():
    activations = torch.randn(4096, 2048)  # 32 MiB
    raise ValueError('loss is nan')
try:
    train_step()
except ValueError:
    import sys
    sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()  # what IPython does for an error
%memcheck

# %%
torchmem_magic.release_last_exception()  # bytes freed
