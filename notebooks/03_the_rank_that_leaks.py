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
# # The rank that leaks
#
# Data-parallel training runs one process per device: each *rank* trains on its own share of the data and they average their gradients. When one rank keeps something it should not, only that process grows — the others stay flat, the run as a whole looks fine for hours, and then one rank is OOM-killed and takes the whole job down with it.
#
# `%%memwatch` watches every process a cell forks that trains, from inside that process: its steps, its heap, its GPU memory and the variables of its own training function. The report then has one line per rank and names the worst one.
#
# This notebook launches two ranks from the notebook itself (`torch.multiprocessing` with `fork`, as Lightning's `ddp_notebook` and Accelerate's `notebook_launcher` do). It uses one GPU per rank with NCCL where there are at least two GPUs, and CPU processes talking over gloo everywhere else.

# %%
%load_ext torchmem_magic
import os, socket
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torchmem_magic

use_cuda = torch.cuda.device_count() >= 2  # NCCL needs a GPU of its own for each rank
backend = "nccl" if use_cuda else "gloo"
world = 2

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def setup(rank, port):
    """Join the process group; a small DDP model and its optimizer on this rank's device."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)  # two ranks share this machine's cores
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).to(device))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), device

backend


# %% [markdown]
# ## A per-rank list "for debugging"
# Rank 1's loss looked odd, so its outputs are collected to inspect later. A classic mistake: `out` still carries its autograd graph, so every kept output also keeps the graph's nodes — and, on a GPU, its memory. Only rank 1 does it, and only rank 1 grows.

# %%
def train_leaky(rank, port, steps=200):
    model, optimizer, device = setup(rank, port)
    debug_outputs = []  # rank 1 collects its outputs to look at later
    for step in range(steps):
        out = model(torch.randn(64, 256, device=device))
        loss = out.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 1:
            debug_outputs.append(out)
    dist.destroy_process_group()


# %%
%%memwatch
mp.start_processes(train_leaky, args=(free_port(),), nprocs=world, start_method="fork")

# %% [markdown]
# The report has a line per rank: rank 0 is clean, rank 1 leaks at a steady rate per step, and the holder is named — `debug_outputs`, a local variable of the training function *inside rank 1's process* — with the line that fixes it. The same is in the report object, for scripts:

# %%
leaky = torchmem_magic.last_report()
for rank in leaky.ranks:
    holders = ", ".join(s.name for s in rank.suspects) or "-"
    print(f"rank {rank.rank}: {rank.verdict:5}  holders: {holders}")
print("worst rank:", leaky.worst_rank)


# %% [markdown]
# ## The fix
# Keep what you want to look at, without the graph. `out.detach()` drops the graph but still keeps a 64 KiB tensor a step (the list would still grow: a tensor cache, which the report names just the same); for debugging a number is usually enough: `.item()`. Now every rank is flat.

# %%
def train_fixed(rank, port, steps=200):
    model, optimizer, device = setup(rank, port)
    debug_outputs = []
    for step in range(steps):
        out = model(torch.randn(64, 256, device=device))
        loss = out.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 1:
            debug_outputs.append(out.detach().abs().mean().item())  # a number: no graph, no tensor
    dist.destroy_process_group()


# %%
%%memwatch
mp.start_processes(train_fixed, args=(free_port(),), nprocs=world, start_method="fork")

# %%
fixed = torchmem_magic.last_report()
print("verdicts:", {rank.rank: rank.verdict for rank in fixed.ranks}, "- worst rank:", fixed.worst_rank)
