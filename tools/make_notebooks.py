"""Writes the teaching notebooks under notebooks/ (kept as code so they stay reviewable).

Run: .venv/bin/python tools/make_notebooks.py
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent

QUICKSTART = [
    new_markdown_cell(
        "# Watching a training loop's memory with `%%memwatch`\n\n"
        "`%%memwatch` runs a cell's training loop while a background sampler reads the memory of the whole "
        "process tree (the kernel plus its DataLoader workers), the C heap the kernel really has in use, "
        "GPU memory (allocated vs reserved) and `/dev/shm`. It marks every optimizer step and every epoch "
        "without any change to your code, draws the curves live under the cell, and sums the run up at the end.\n\n"
        "This notebook trains a small model twice: once cleanly, once with the classic leak of a validation "
        "pass that runs without `torch.no_grad()` and keeps its outputs."
    ),
    new_code_cell(
        "%load_ext torchmem_magic\n"
        "import torch\n"
        "import torchmem_magic\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "torch.manual_seed(0)\n"
        "torch.set_num_threads(1)  # keeps this demo gentle on small machines"
    ),
    new_code_cell(
        "train = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))\n"
        "val = TensorDataset(torch.randn(1024, 256), torch.randint(0, 10, (1024,)))\n"
        "train_loader = DataLoader(train, batch_size=64, shuffle=True)\n"
        "val_loader = DataLoader(val, batch_size=128)\n"
        "\n"
        "def make_model():\n"
        "    model = torch.nn.Sequential(\n"
        "        torch.nn.Linear(256, 1024), torch.nn.ReLU(),\n"
        "        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),\n"
        "        torch.nn.Linear(1024, 10),\n"
        "    )\n"
        "    return model, torch.optim.Adam(model.parameters(), lr=1e-3)"
    ),
    new_markdown_cell(
        "## A clean loop\n"
        "Losses are logged with `.item()`, validation runs under `torch.no_grad()`. After the optimizer's first "
        "step (Adam allocates its state then) the curves stay flat. Toggle the x axis between time and "
        "optimizer steps above the figure. Dashed lines mark each training epoch: a pass of the loader whose "
        "batches carry the optimizer steps (the validation pass inside each epoch is not another epoch)."
    ),
    new_code_cell(
        "%%memwatch\n"
        "model, optimizer = make_model()\n"
        "history, val_scores = [], []\n"
        "for epoch in range(6):\n"
        "    for x, y in train_loader:\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        history.append(loss.item())\n"
        "    with torch.no_grad():\n"
        "        val_scores.append(sum(model(x).argmax(1).eq(y).sum().item() for x, y in val_loader))\n"
        "val_scores"
    ),
    new_code_cell("clean = torchmem_magic.last_report()\nclean.to_dict()['heap']"),
    new_markdown_cell(
        "## The same loop with a leak\n"
        "Now validation forgets `torch.no_grad()` and keeps its outputs for later analysis. Every output "
        "tensor keeps its autograd graph and the activations saved for a backward pass that never comes: "
        "heap in use climbs epoch after epoch (a staircase), and so does RAM."
    ),
    new_code_cell(
        "%%memwatch\n"
        "model, optimizer = make_model()\n"
        "history, val_outputs = [], []\n"
        "for epoch in range(6):\n"
        "    for x, y in train_loader:\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        history.append(loss.item())\n"
        "    for x, y in val_loader:            # no torch.no_grad() ...\n"
        "        val_outputs.append(model(x))   # ... and the outputs are kept: the leak"
    ),
    new_code_cell(
        "leaky = torchmem_magic.last_report()\n"
        "print(f\"heap growth per step: clean {clean.heap.per_step_bytes / 1024:.1f} KiB, \"\n"
        "      f\"leaky {leaky.heap.per_step_bytes / 1024:.1f} KiB\")"
    ),
    new_markdown_cell(
        "Under the report, **What keeps memory alive** names `val_outputs`: a list holding tensors whose "
        "autograd graphs retain the activations saved for backward, how much deleting it would free, and "
        "the fix, found in the cell's own code. `%memcheck` explains one variable in detail:"
    ),
    new_code_cell("%memcheck val_outputs"),
    new_markdown_cell(
        "**The fix** is one line: wrap validation in `with torch.no_grad():` (or keep `model(x).detach()` / "
        "`.argmax(1)` instead of the raw output). Then free what the leaky run kept:"
    ),
    new_code_cell("del val_outputs\nimport gc; gc.collect();"),
    new_markdown_cell(
        "## In a script\n"
        "The same session works without IPython: `with torchmem_magic.memwatch() as w: ...` prints the text "
        "report at the end and keeps it in `w.report`."
    ),
    new_code_cell(
        "with torchmem_magic.memwatch(interval_ms=50) as w:\n"
        "    model, optimizer = make_model()\n"
        "    for x, y in train_loader:\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
        "w.report.steps, w.report.epochs"
    ),
]


CLASSIC_LEAKS = [
    new_markdown_cell(
        "# The classic PyTorch memory leaks, found and fixed\n\n"
        "Each section makes one leak on purpose, lets `%%memwatch` / `%memcheck` name the variable that holds "
        "the memory, and applies the one-line fix it suggests."
    ),
    new_code_cell(
        "%load_ext torchmem_magic\n"
        "import torch, torchmem_magic\n"
        "torch.manual_seed(0)\n"
        "torch.set_num_threads(1)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "def batch(n=64):\n"
        "    return torch.randn(n, 256), torch.randint(0, 10, (n,))"
    ),
    new_markdown_cell(
        "## 1. Logging the loss tensor instead of its value\n"
        "`history.append(loss)` keeps every step's loss *tensor*, and with it the nodes of its autograd graph. "
        "Backward already freed the saved activations, so this leak is slow — a few KiB a step — and it is "
        "exactly the kind that takes hours to kill a run."
    ),
    new_code_cell(
        "%%memwatch --no-plot\n"
        "history = []\n"
        "for step in range(300):\n"
        "    x, y = batch()\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    history.append(loss)"
    ),
    new_code_cell("[(s.name, s.kind, s.fix) for s in torchmem_magic.last_report().suspects]"),
    new_markdown_cell("The fix is the line the report printed: `history.append(loss.item())`."),
    new_markdown_cell(
        "## 2. Summing losses into a tensor\n"
        "`total_loss += loss` builds one ever-longer autograd chain. `%memcheck` walks only part of very long "
        "chains (touching too many nodes from Python can crash their deletion) and says its figure is an estimate."
    ),
    new_code_cell(
        "total_loss = 0\n"
        "for step in range(2000):\n"
        "    x, y = batch(8)\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    loss.backward()\n"
        "    total_loss += loss\n"
        "%memcheck total_loss"
    ),
    new_code_cell("total_loss = total_loss.item()  # the fix: keep a float"),
    new_markdown_cell(
        "## 3. A hidden state that is never detached\n"
        "Truncated backpropagation through time needs `h = h.detach()` between chunks. Without it, every "
        "step's graph stays attached to the next."
    ),
    new_code_cell(
        "%%memwatch --no-plot\n"
        "cell = torch.nn.RNNCell(64, 512)\n"
        "h = torch.zeros(32, 512)\n"
        "for step in range(50):\n"
        "    h = cell(torch.randn(32, 64), h)\n"
        "    h.pow(2).mean().backward(retain_graph=True)"
    ),
    new_code_cell("[(s.name, s.kind, s.fix) for s in torchmem_magic.last_report().suspects]"),
    new_code_cell("h = h.detach()  # what the fix does at every step: cut the graph"),
    new_markdown_cell(
        "## 4. A big result kept by the output cache\n"
        "Displaying a value stores it in `Out`, `_N`, `_` and hidden copies. `del` of your own name does not "
        "free it."
    ),
    new_code_cell("embeddings = torch.randn(4096, 2048)  # 32 MiB\nembeddings"),
    new_code_cell("del embeddings\n%memcheck"),
    new_code_cell("torchmem_magic.release_output_cache()  # bytes freed"),
    new_markdown_cell(
        "## 5. An exception that keeps its frames\n"
        "After an error, IPython keeps the traceback for `%debug` — and every local of every frame in it."
    ),
    new_code_cell(
        "def train_step():\n"
        "    activations = torch.randn(4096, 2048)  # 32 MiB\n"
        "    raise ValueError('loss is nan')\n"
        "try:\n"
        "    train_step()\n"
        "except ValueError:\n"
        "    import sys\n"
        "    sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()  # what IPython does for an error\n"
        "%memcheck"
    ),
    new_code_cell("torchmem_magic.release_last_exception()  # bytes freed"),
]


RANK_THAT_LEAKS = [
    new_markdown_cell(
        "# The rank that leaks\n\n"
        "Data-parallel training runs one process per device: each *rank* trains on its own share of the "
        "data and they average their gradients. When one rank keeps something it should not, only that "
        "process grows — the others stay flat, the run as a whole looks fine for hours, and then one rank "
        "is OOM-killed and takes the whole job down with it.\n\n"
        "`%%memwatch` watches every process a cell forks that trains, from inside that process: its "
        "steps, its heap, its GPU memory and the variables of its own training function. The report "
        "then has one line per rank and names the worst one.\n\n"
        "This notebook launches two ranks from the notebook itself (`torch.multiprocessing` with "
        "`fork`, as Lightning's `ddp_notebook` and Accelerate's `notebook_launcher` do). It uses one GPU "
        "per rank with NCCL where there are at least two GPUs, and CPU processes talking over gloo "
        "everywhere else."
    ),
    new_code_cell(
        "%load_ext torchmem_magic\n"
        "import os, socket\n"
        "import torch, torch.distributed as dist, torch.multiprocessing as mp\n"
        "import torchmem_magic\n"
        "\n"
        "use_cuda = torch.cuda.device_count() >= 2  # NCCL needs a GPU of its own for each rank\n"
        "backend = \"nccl\" if use_cuda else \"gloo\"\n"
        "world = 2\n"
        "\n"
        "def free_port():\n"
        "    with socket.socket() as s:\n"
        "        s.bind((\"127.0.0.1\", 0))\n"
        "        return s.getsockname()[1]\n"
        "\n"
        "def setup(rank, port):\n"
        "    \"\"\"Join the process group; a small DDP model and its optimizer on this rank's device.\"\"\"\n"
        "    os.environ[\"MASTER_ADDR\"], os.environ[\"MASTER_PORT\"] = \"127.0.0.1\", str(port)\n"
        "    torch.set_num_threads(1)  # two ranks share this machine's cores\n"
        "    device = torch.device(\"cuda\", rank) if use_cuda else torch.device(\"cpu\")\n"
        "    if use_cuda:\n"
        "        torch.cuda.set_device(rank)\n"
        "    dist.init_process_group(backend, rank=rank, world_size=world)\n"
        "    torch.manual_seed(rank)\n"
        "    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).to(device))\n"
        "    return model, torch.optim.SGD(model.parameters(), lr=0.01), device\n"
        "\n"
        "backend"
    ),
    new_markdown_cell(
        "## A per-rank list \"for debugging\"\n"
        "Rank 1's loss looked odd, so its outputs are collected to inspect later. A classic mistake: "
        "`out` still carries its autograd graph, so every kept output also keeps the graph's nodes — and, "
        "on a GPU, its memory. Only rank 1 does it, and only rank 1 grows."
    ),
    new_code_cell(
        "def train_leaky(rank, port, steps=200):\n"
        "    model, optimizer, device = setup(rank, port)\n"
        "    debug_outputs = []  # rank 1 collects its outputs to look at later\n"
        "    for step in range(steps):\n"
        "        out = model(torch.randn(64, 256, device=device))\n"
        "        loss = out.pow(2).mean()\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        if rank == 1:\n"
        "            debug_outputs.append(out)\n"
        "    dist.destroy_process_group()"
    ),
    new_code_cell(
        "%%memwatch\n"
        "mp.start_processes(train_leaky, args=(free_port(),), nprocs=world, start_method=\"fork\")"
    ),
    new_markdown_cell(
        "The report has a line per rank: rank 0 is clean, rank 1 leaks at a steady rate per step, and "
        "the holder is named — `debug_outputs`, a local variable of the training function *inside rank 1's "
        "process* — with the line that fixes it. The same is in the report object, for scripts:"
    ),
    new_code_cell(
        "leaky = torchmem_magic.last_report()\n"
        "for rank in leaky.ranks:\n"
        "    holders = \", \".join(s.name for s in rank.suspects) or \"-\"\n"
        "    print(f\"rank {rank.rank}: {rank.verdict:5}  holders: {holders}\")\n"
        "print(\"worst rank:\", leaky.worst_rank)"
    ),
    new_markdown_cell(
        "## The fix\n"
        "Keep what you want to look at, without the graph. `out.detach()` drops the graph but still keeps a "
        "64 KiB tensor a step (the list would still grow: a tensor cache, which the report names just the "
        "same); for debugging a number is usually enough: `.item()`. Now every rank is flat."
    ),
    new_code_cell(
        "def train_fixed(rank, port, steps=200):\n"
        "    model, optimizer, device = setup(rank, port)\n"
        "    debug_outputs = []\n"
        "    for step in range(steps):\n"
        "        out = model(torch.randn(64, 256, device=device))\n"
        "        loss = out.pow(2).mean()\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        if rank == 1:\n"
        "            debug_outputs.append(out.detach().abs().mean().item())  # a number: no graph, no tensor\n"
        "    dist.destroy_process_group()"
    ),
    new_code_cell(
        "%%memwatch\n"
        "mp.start_processes(train_fixed, args=(free_port(),), nprocs=world, start_method=\"fork\")"
    ),
    new_code_cell(
        "fixed = torchmem_magic.last_report()\n"
        "print(\"verdicts:\", {rank.rank: rank.verdict for rank in fixed.ranks}, \"- worst rank:\", fixed.worst_rank)"
    ),
]


def write(name: str, cells: list) -> None:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.validate(nb)
    nbformat.write(nb, ROOT / "notebooks" / name)


if __name__ == "__main__":
    write("01_memwatch_quickstart.ipynb", QUICKSTART)
    write("02_classic_leaks.ipynb", CLASSIC_LEAKS)
    write("03_the_rank_that_leaks.ipynb", RANK_THAT_LEAKS)
