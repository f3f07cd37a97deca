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
# # When the kernel dies
#
# *"The kernel appears to have died. It will restart automatically."* That is how most notebook users meet a memory leak: the OOM killer SIGKILLs the kernel, every variable and every figure is gone, and nothing says why.
#
# This notebook shows the two things `%%memwatch` does about it:
#
# 1. **The guard** (`%%memwatch --guard 90%`) stops a leaking loop *before* the kill, with an exception in the loop, and the kernel, its variables and the report survive.
# 2. **The flight recorder** keeps a small record of every `%%memwatch` run on disk while it runs, so that after a kill the next kernel can still show the curves up to the death, the verdict, the holder and what most likely killed it.

# %%
%load_ext torchmem_magic
import os, signal, subprocess, sys, time
import psutil, torch, torchmem_magic
torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. The guard stops the loop before the limit
#
# A small memory limit for this demonstration: 600 MiB above what this kernel uses now. A container or a cgroup would set one for real (`%%memwatch` reads the tightest cgroup limit, else the machine's RAM); `TORCHMEM_MAGIC_RAM_LIMIT` tells it one where it cannot see it, as here.

# %%
ram_now = psutil.Process().memory_info().rss
os.environ['TORCHMEM_MAGIC_RAM_LIMIT'] = str(ram_now + (600 << 20))
print(f'RAM now {ram_now / 2**20:.0f} MiB, limit {int(os.environ["TORCHMEM_MAGIC_RAM_LIMIT"]) / 2**20:.0f} MiB')
model = torch.nn.Linear(256, 256)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
cache = []  # the leak: every step keeps 5 MiB

# %% tags=["raises-exception"]
%%memwatch --guard 90%
for step in range(1000):  # 1000 x 5 MiB would be 5 GiB: far past the limit
    loss = model(torch.randn(64, 256)).square().mean()
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    cache.append(torch.ones(5 << 18))  # 5 MiB
    time.sleep(0.01)

# %% [markdown]
# The loop raised `MemoryGuardError` (a `MemoryError`) at a step boundary once RAM reached 90% of the limit, and the report above says so. The kernel is alive and nothing is lost: the model, the optimizer and the cache are all still here, to inspect and to fix.

# %%
print(f'{len(cache)} steps kept {len(cache) * 5} MiB in cache; the model is still here: {tuple(model.weight.shape)}')
print('status:', torchmem_magic.last_report().status)
cache.clear()
del os.environ['TORCHMEM_MAGIC_RAM_LIMIT']

# %% [markdown]
# ## 2. The flight record of a kernel that was killed
#
# A notebook cannot kill its own kernel and go on, so here another IPython process plays the kernel: it runs a leaking loop under `%%memwatch` in this directory, and we SIGKILL it three seconds into the run, as the OOM killer would. (Its working directory, like a restarted kernel's notebook, is what ties its record to this notebook.)

# %%
body = '''
import torch
model = torch.nn.Linear(256, 256); optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
outputs = []
get_ipython().run_cell_magic("memwatch", "--no-plot", """
for step in range(10**6):
    out = model(torch.randn(256, 256))  # 256 KiB of output, and its graph
    loss = out.square().mean()
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    outputs.append(out)  # keeps every step's graph
""")
'''
kernel = subprocess.Popen([sys.executable, "-m", "IPython", "--no-banner", "--ext", "torchmem_magic", "-c", body],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
from torchmem_magic.flight.place import records_dir  # where records live (see the README)
deadline = time.time() + 120
while time.time() < deadline and not list(records_dir().glob(f"*-{kernel.pid}-*.jsonl")):
    time.sleep(0.1)  # its own record (its pid is in the name) appears when its %%memwatch run starts ...
time.sleep(3)  # ... and we let it train for three seconds
kernel.send_signal(signal.SIGKILL)
print("killed with", signal.Signals(-kernel.wait()).name)

# %% [markdown]
# Its record outlived it. In a new kernel of this notebook, the first `%load_ext torchmem_magic` would show it once by itself; `%memwatch --last` shows it whenever asked (and `torchmem_magic.last_crash()` returns it as a `Report`):

# %%
%memwatch --last

# %% [markdown]
# The record holds its curves up to the last half second before the kill, the verdict they give, the holder the last scan saw (`outputs`) with its fix, and the last readings against their limits. Here nothing was near a limit, so it says the cause cannot be known from the record; a real OOM kill is told as the OOM killer's (the kernel's OOM-kill counters went up, or RAM was at its limit).
#
# Records stay until you clear them:

# %%
crash = torchmem_magic.last_crash()
print(crash.status, crash.steps, [s.name for s in crash.suspects])
print('cleared', torchmem_magic.clear_crashes())
