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
        "for epoch in range(5):\n"
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
        "for epoch in range(5):\n"
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


DATALOADER_SHM = [
    new_markdown_cell(
        "# DataLoader workers and shared memory\n\n"
        "A `DataLoader` with `num_workers > 0` forks worker processes. Two things about them fill up memory "
        "in ways the training loop never shows:\n\n"
        "1. **Copy-on-access.** A forked worker shares the dataset's pages with the kernel until it *touches* "
        "them, and with Python objects reading is touching: every access writes the object's reference count. "
        "A dataset held as a list of Python strings, dicts or lists is copied into every worker page by page "
        "as the workers read it (pytorch/pytorch#13246). RSS cannot see it (a shared page and its copy both "
        "count); PSS, which splits shared pages between the processes sharing them, can.\n"
        "2. **Shared memory.** Every batch a worker produces travels to the main process through `/dev/shm`. "
        "In a container that is 64 MB unless you ask for more, and a worker that writes into a full "
        "`/dev/shm` is killed by a bus error.\n\n"
        "`%%memwatch` follows the workers (by PSS), `/dev/shm` and how each worker ended. This notebook makes "
        "each problem, watches it, names it and fixes it."
    ),
    new_code_cell(
        "%load_ext torchmem_magic\n"
        "import os, time\n"
        "import numpy as np\n"
        "import torch, torchmem_magic\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "torch.manual_seed(0)\n"
        "torch.set_num_threads(1)  # the workers need the cores more than this tiny model"
    ),
    new_markdown_cell(
        "## 1. Copy-on-access: a dataset of Python objects\n"
        "A million records, each a Python string, read by two workers for two epochs. The model is "
        "deliberately tiny: all the memory here is the dataset's."
    ),
    new_code_cell(
        "records = [f\"sample-{i:08d}-{'x' * 40}\" for i in range(1_000_000)]  # ~90 MiB of Python strings\n"
        "\n"
        "class Records(Dataset):\n"
        "    def __init__(self, data):\n"
        "        self.data = data\n"
        "    def __len__(self):\n"
        "        return len(self.data)\n"
        "    def __getitem__(self, i):\n"
        "        return len(self.data[i])  # reading the record is enough to copy its page into the worker\n"
        "\n"
        "model = torch.nn.Linear(8, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "\n"
        "def train(dataset, epochs=2):\n"
        "    loader = DataLoader(dataset, batch_size=2048, shuffle=True, num_workers=2, persistent_workers=True)\n"
        "    for epoch in range(epochs):\n"
        "        for batch in loader:\n"
        "            optimizer.zero_grad()\n"
        "            model(torch.randn(4, 8)).sum().backward()\n"
        "            optimizer.step()"
    ),
    new_code_cell("%%memwatch\ntrain(Records(records))"),
    new_markdown_cell(
        "In the figure, the **workers** curve (their PSS) climbs through the first epoch while the kernel's "
        "**heap in use** stays flat: nothing in the training loop allocates, the workers are copying the "
        "dataset. The report's advice says where it goes: *DataLoader workers' memory grew by … (by PSS) while "
        "the kernel's heap stayed nearly flat: workers copying a dataset of Python objects page by page as they "
        "read it (copy-on-access) …*, with the fix, and where the workers will level off. The verdict line "
        "itself depends on timing: a leak of the process tree's RAM if the workers were still copying when "
        "the cell ended (the OOM killer counts their memory as the job's), `clean` if the copying had "
        "stopped — copy-on-access ends once each worker has touched every record. It is a problem of size, "
        "not of endless growth: with two workers the dataset ends up in memory three times; with eight, "
        "nine. The figures for each worker are in the report object:"

    ),
    new_code_cell(
        "objects = torchmem_magic.last_report()\n"
        "for worker in objects.workers.per_worker:\n"
        "    print(f\"worker {worker['pid']}: PSS peak {worker['pss_peak'] / 2**20:.0f} MiB\")\n"
        "print(next(line for line in objects.advice if 'copy-on-access' in line))"
    ),
    new_markdown_cell(
        "### The fix: the same data as one array\n"
        "A numpy array of fixed-width bytes is a single object: reading an element touches no reference count "
        "in the shared pages, so nothing is copied. (For variable-length text, `np.frombuffer` over one bytes "
        "blob plus an offsets array, or pyarrow, do the same.) Same records, same loop:"
    ),
    new_code_cell(
        "array = np.array(records, dtype='S56')  # 56 MiB in one buffer\n"
        "del records"
    ),
    new_code_cell("%%memwatch\ntrain(Records(array))"),
    new_code_cell(
        "arrays = torchmem_magic.last_report()\n"
        "for name, report in ((\"list of str\", objects), (\"numpy array\", arrays)):\n"
        "    peak = max(w['pss_peak'] for w in report.workers.per_worker) / 2**20\n"
        "    flagged = any('copy-on-access' in line for line in report.advice)\n"
        "    print(f\"{name:12} worker PSS peak {peak:4.0f} MiB · copy-on-access flagged: {flagged}\")"
    ),
    new_markdown_cell(
        "The workers stay small and the advice is gone.\n\n"
        "## 2. How batches reach the kernel: sharing strategies and `/dev/shm`\n"
        "A worker puts each batch's tensors in shared memory and sends the kernel a handle. torch has two "
        "ways to do it:\n\n"
        "- **`file_descriptor`** (the default on Linux): a segment is created in `/dev/shm` and unlinked at "
        "once; the handle is an open file descriptor. `ls /dev/shm` shows nothing, only the mount's used "
        "space (`df /dev/shm`) does — and every batch in flight holds a descriptor, so many workers with big "
        "prefetch queues can hit `ulimit -n` (*received 0 items of ancdata*).\n"
        "- **`file_system`**: segments are named files `/dev/shm/torch_*`, found by name, and a "
        "`torch_shm_manager` process cleans them up. No descriptors, but files that outlive a crash.\n\n"
        "`torchmem_magic.sharing_info()` tells you the current strategy, how big `/dev/shm` is and how many "
        "descriptors are open, and recommends a change when one is needed (it is the *sharing strategy* "
        "panel under the live figure):"
    ),
    new_code_cell("print(torchmem_magic.sharing_info(workers=2))"),
    new_markdown_cell(
        "Here is what each strategy leaves in `/dev/shm` while batches are in flight: a loader of "
        "1 MiB samples, four to a batch, with four batches held by the loop (and a few more prefetched by the "
        "workers). The counts are what appeared while the loader ran."
    ),
    new_code_cell(
        "class Images(Dataset):\n"
        "    def __len__(self):\n"
        "        return 64\n"
        "    def __getitem__(self, i):\n"
        "        return torch.full((256, 1024), float(i))  # 1 MiB a sample\n"
        "\n"
        "def shm_used():\n"
        "    st = os.statvfs('/dev/shm')\n"
        "    return (st.f_blocks - st.f_bfree) * st.f_frsize\n"
        "\n"
        "def in_flight(strategy):\n"
        "    torchmem_magic.set_sharing_strategy(strategy)\n"
        "    files_before, used_before = set(os.listdir('/dev/shm')), shm_used()\n"
        "    loader = DataLoader(Images(), batch_size=4, num_workers=2)\n"
        "    held = []\n"
        "    for batch in loader:\n"
        "        held.append(batch)  # four batches kept: 16 MiB in shared memory\n"
        "        if len(held) == 4:\n"
        "            break\n"
        "    files = [f for f in os.listdir('/dev/shm') if f.startswith('torch_')]\n"
        "    print(f\"{strategy:16} new torch_* files in /dev/shm: {len(set(files) - files_before):3} · \"\n"
        "          f\"more in use on the mount: {(shm_used() - used_before) / 2**20:5.1f} MiB\")\n"
        "    del loader, held\n"
        "\n"
        "in_flight('file_descriptor')\n"
        "in_flight('file_system')\n"
        "torchmem_magic.set_sharing_strategy('file_descriptor');  # back to the default"
    ),
    new_markdown_cell(
        "With `file_descriptor` the segments are invisible to `ls`; with `file_system` they are files. "
        "Either way they take room on the mount (other programs' files count there too). `%%memwatch` reads "
        "the mount itself: the **shm** curve and row of the report, with the strategy in use.\n\n"
        "## 3. A worker killed because `/dev/shm` is full\n"
        "A container's 64 MB `/dev/shm` is far too small for workers that prefetch large batches. When a "
        "worker writes into a full mount, the kernel sends it `SIGBUS`; the loop sees *DataLoader worker "
        "(pid N) is killed by signal: Bus error* — or, on a busy machine, only a reset connection. "
        "`%%memwatch` reads how the worker ended and what the curves showed just before, and explains it.\n\n"
        "To make it happen here without touching this machine's `/dev/shm`, we mount a 16 MiB tmpfs (this "
        "needs root) and give the workers a dataset that places every sample in shared memory on that mount "
        "the way torch does — create a file, size it, map it, write — and keeps it there, as batches waiting "
        "in a prefetch queue would. `--shm-path` tells `%%memwatch` to watch that mount instead of `/dev/shm`."
    ),
    new_code_cell(
        "import mmap, subprocess, tempfile\n"
        "small_shm = tempfile.mkdtemp(prefix='small-shm-')\n"
        "mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=16m', 'tmpfs', small_shm],\n"
        "                         capture_output=True).returncode == 0\n"
        "if mounted:\n"
        "    print(f'a 16 MiB tmpfs is mounted at {small_shm}, standing in for a container\\'s /dev/shm')\n"
        "    print(torchmem_magic.sharing_info(workers=2, shm_path=small_shm))\n"
        "else:\n"
        "    print('cannot mount a small tmpfs here (it needs root): the worker death below is skipped')"
    ),
    new_markdown_cell(
        "`sharing_info` already warns about a mount this small. Now the workers fill it:"
    ),
    new_code_cell(
        "class SharedSamples(Dataset):\n"
        "    \"\"\"Each sample goes to shared memory as torch's workers put it there: create, size, map, write.\"\"\"\n"
        "    def __init__(self, mount, size=1 << 20):\n"
        "        self.mount, self.size = mount, size\n"
        "    def __len__(self):\n"
        "        return 200\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.02)\n"
        "        fd = os.open(os.path.join(self.mount, f'segment-{i}'), os.O_RDWR | os.O_CREAT, 0o600)\n"
        "        os.ftruncate(fd, self.size)  # reserves nothing yet: tmpfs gives pages when they are written\n"
        "        with mmap.mmap(fd, self.size) as segment:\n"
        "            segment[:] = bytes([i % 256]) * self.size  # on a full mount: SIGBUS\n"
        "        os.close(fd)\n"
        "        return torch.tensor(i)"
    ),
    new_code_cell(
        "%%memwatch --interval 20 --shm-path {small_shm}\n"
        "if mounted:\n"
        "    loader = DataLoader(SharedSamples(small_shm), batch_size=1, num_workers=2)\n"
        "    try:\n"
        "        for step, x in enumerate(loader):\n"
        "            optimizer.zero_grad()\n"
        "            model(torch.randn(4, 8)).sum().backward()\n"
        "            optimizer.step()\n"
        "    except (RuntimeError, ConnectionError) as error:  # torch's message, or on a busy machine a reset connection\n"
        "        print(f'the loop failed at step {step}: {error}')\n"
        "else:\n"
        "    print('skipped: no small tmpfs')"
    ),
    new_markdown_cell(
        "Each worker printed torch's own hint (*Unexpected bus error encountered in worker. This might be "
        "caused by insufficient shared memory*), and the loop failed with whatever it happened to see. The "
        "verdict is a leak in shm, and the first line of advice explains the death from how the workers ended "
        "and what the shm curve showed just before: *DataLoader worker … died (Bus error): /tmp/small-shm-… "
        "was 100% full (16.0 MiB of 16.0 MiB)*. The next line is the fix. For room, what counts is a bigger "
        "mount for the container (`docker run --shm-size=8g` or `--ipc=host`) or fewer batches in flight "
        "(fewer workers, a lower `prefetch_factor`, smaller batches); `file_system` helps when file "
        "descriptors run out, but its files live on the same mount."

    ),
    new_code_cell(
        "if mounted:\n"
        "    died = torchmem_magic.last_report()\n"
        "    print(died.advice[0])\n"
        "    print(died.advice[1])\n"
        "    del loader\n"
        "    subprocess.run(['umount', '-l', small_shm])\n"
        "os.rmdir(small_shm)"
    ),
]


GPU_MEMORY = [
    new_markdown_cell(
        "# GPU memory: allocated, reserved, and what `nvidia-smi` shows\n\n"
        "PyTorch does not give freed GPU memory back to the driver. Its **caching allocator** keeps the "
        "blocks it got from `cudaMalloc` and reuses them for the next tensors of a similar size, because "
        "asking the driver is slow. So there are two numbers:\n\n"
        "- **allocated** (`torch.cuda.memory_allocated()`): bytes in live tensors — what your code holds;\n"
        "- **reserved** (`torch.cuda.memory_reserved()`): allocated plus the cached free blocks — what "
        "`nvidia-smi` shows for the process (plus the CUDA context's few hundred MiB), and what other "
        "processes cannot use.\n\n"
        "A leak grows *allocated*. Reserved growing while allocated stays flat is the cache (or "
        "fragmentation), not a leak — the most common false alarm. `%%memwatch` draws both curves and "
        "tells them apart.\n\n"
        "**No GPU?** Every cell below runs on the CPU too, where the C heap tells the same story: glibc's "
        "`malloc` also keeps freed memory for reuse. **heap in use** (what live objects hold, read with "
        "glibc's `mallinfo2`) plays *allocated*; the process's **RSS** (what `top` and the OOM killer see) "
        "plays *reserved*. Where a GPU is present the cells use it, and the text says what each shows."
    ),
    new_code_cell(
        "%load_ext torchmem_magic\n"
        "import ctypes, os\n"
        "import psutil, torch, torchmem_magic\n"
        "torch.manual_seed(0)\n"
        "torch.set_num_threads(1)\n"
        "cuda = torch.cuda.is_available()\n"
        "device = torch.device('cuda' if cuda else 'cpu')\n"
        "\n"
        "class Mallinfo2(ctypes.Structure):  # glibc's heap statistics, what the heap curve reads\n"
        "    _fields_ = [(name, ctypes.c_size_t) for name in (\n"
        "        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.mallinfo2.restype = Mallinfo2\n"
        "\n"
        "def memory():\n"
        "    \"\"\"(in live tensors, held by the process): allocated/reserved on a GPU, heap in use/RSS on a CPU.\"\"\"\n"
        "    if cuda:\n"
        "        return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()\n"
        "    info = libc.mallinfo2()\n"
        "    return info.uordblks + info.hblkhd, psutil.Process().memory_info().rss\n"
        "\n"
        "def show(when):\n"
        "    used, held = memory()\n"
        "    names = ('allocated', 'reserved') if cuda else ('heap in use', 'RSS')\n"
        "    print(f\"{when:28} {names[0]} {used / 2**20:7.1f} MiB · {names[1]} {held / 2**20:7.1f} MiB\")\n"
        "\n"
        "print('watching', torch.cuda.get_device_name() if cuda else 'the CPU heap (no GPU here)')"
    ),
    new_markdown_cell(
        "## 1. Freed is not given back\n"
        "Allocate 3,000 tensors of 64 KiB (about 190 MiB), each next to a tiny tensor that stays alive — "
        "a per-chunk statistic, say — then free the big ones."
    ),
    new_code_cell(
        "show('before')\n"
        "chunks, stats = [], []\n"
        "for i in range(3000):\n"
        "    chunks.append(torch.ones(16 * 1024, device=device))  # 64 KiB\n"
        "    stats.append(chunks[-1].sum())                       # a few bytes, kept\n"
        "show('3,000 chunks alive')\n"
        "del chunks\n"
        "show('chunks freed')"
    ),
    new_markdown_cell(
        "The first number drops back at once; the second does not. On a GPU the freed 190 MiB are cached "
        "blocks, still *reserved*: `nvidia-smi` shows the process as big as at its peak. On the CPU, glibc "
        "keeps the freed pages in its heap and RSS stays high.\n\n"
        "Giving them back is the job of `torch.cuda.empty_cache()` on a GPU, and of glibc's "
        "`malloc_trim(0)` on the CPU: `torchmem_magic.collect_garbage()` runs `gc.collect()` and "
        "`empty_cache()`, `torchmem_magic.return_heap_to_os()` runs `malloc_trim` (they are the **gc + "
        "empty_cache** and **return heap to OS** buttons under the live figure). Each says what it gave back:"
    ),
    new_code_cell(
        "print(torchmem_magic.collect_garbage() if cuda else torchmem_magic.return_heap_to_os())\n"
        "show('after giving back')"
    ),
    new_markdown_cell(
        "Here the two allocators differ. glibc returns every free *page*, even between the tiny tensors "
        "still alive: RSS drops by almost all of the 190 MiB. The CUDA caching allocator can only release "
        "a whole *segment* (a `cudaMalloc`'d block of 2 MiB or more) with nothing alive in it, and nearly "
        "every segment here still holds one of the tiny `stats` tensors: on a GPU `empty_cache()` gives back "
        "little, and reserved stays high until `stats` goes too. That is **fragmentation**: memory that is "
        "free but cannot be used for a bigger tensor or given back because small live blocks are "
        "scattered through it."
    ),
    new_code_cell(
        "del stats\n"
        "print(torchmem_magic.collect_garbage() if cuda else torchmem_magic.return_heap_to_os())\n"
        "show('stats freed too')"
    ),
    new_markdown_cell(
        "## 2. What `%%memwatch` makes of it\n"
        "A training loop whose evaluation batches get longer as it goes, as with variable-length sequences: "
        "every 40 steps it evaluates a batch longer than any before, in 64 KiB chunks, and keeps a small "
        "tensor of statistics — the same pattern, inside a run. Is it a leak?"
    ),
    new_code_cell(
        "model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "\n"
        "def evaluate_long_batch(n_chunks):\n"
        "    with torch.no_grad():\n"
        "        features = [torch.ones(64, 256, device=device) for _ in range(n_chunks)]  # 64 KiB each\n"
        "        return torch.stack([f.mean() for f in features])  # the features go; 12 KiB of statistics stay"

    ),
    new_code_cell(
        "%%memwatch\n"
        "for step in range(400):\n"
        "    x, y = torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device)\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % 40 == 39:  # a batch longer than any before: 19 MiB more each time\n"
        "        chunk_means = evaluate_long_batch(n_chunks=300 * (step // 40 + 1))"
    ),
    new_markdown_cell(
        "**heap in use** (on a GPU: **CUDA allocated**) jumps at each evaluation (where a sample falls "
        "inside one) and falls straight back: the features are freed when `evaluate_long_batch` returns. "
        "**RAM** (on a GPU: **CUDA reserved**) climbs a step with each new longest batch and never comes "
        "down: the allocator needed room for the biggest batch so far, and keeps it. The verdict is "
        "**clean**: what decides is what live objects hold, and that did not grow. On a GPU the report adds "
        "that reserved memory growing while allocated is flat is the "

        "caching allocator, with `torch.cuda.empty_cache()` and `expandable_segments` as the remedies; on "
        "the CPU it adds that *RSS grows while the heap in use is flat: not memory your objects hold, but "
        "freed memory the allocator keeps (fragmentation)…*, and that `malloc_trim(0)` (the **return heap to "
        "OS** button) gives it back."

    ),
    new_code_cell(
        "run = torchmem_magic.last_report().to_dict()\n"
        "print('verdict:', run['verdict'])\n"
        "mib = lambda n: f\"{n / 2**20:.1f} MiB\"\n"
        "if cuda:\n"
        "    vram = run['vram']\n"
        "    print(f\"CUDA allocated: start {mib(vram['allocated_start'])}, peak {mib(vram['allocated_peak'])}, \"\n"
        "          f\"end {mib(vram['allocated_end'])} · reserved at the end {mib(vram['reserved_end'])}\")\n"
        "else:\n"
        "    for name, label in (('heap', 'heap in use'), ('ram', 'RAM')):\n"
        "        r = run[name]\n"
        "        print(f\"{label:12} start {mib(r['start'])}, peak {mib(r['peak'])}, end {mib(r['end'])}\")"

    ),
    new_markdown_cell(
        "Not a leak — but memory the process holds that nothing uses. When another process needs it (or "
        "before handing the GPU over), give it back, and RAM (on a GPU: reserved) comes down to what is in use:"
    ),
    new_code_cell(
        "given_back = torchmem_magic.collect_garbage() if cuda else torchmem_magic.return_heap_to_os()\n"
        "print(given_back)"
    ),
    new_markdown_cell(
        "## 3. Fragmentation: `expandable_segments` and `max_split_size_mb`\n"
        "The caching allocator is configured by the environment variable `PYTORCH_CUDA_ALLOC_CONF`, read "
        "once, when CUDA makes its first allocation — set it in the shell that starts Jupyter, or in the "
        "notebook's first cell *before* anything touches the GPU (then restart the kernel):\n\n"
        "- **`expandable_segments:True`** — segments grow in place (virtual memory mapped as needed) instead "
        "of being fixed-size `cudaMalloc` blocks. Tensors of varying sizes (variable sequence lengths, "
        "growing batch sizes) then leave far fewer unusable holes, and `empty_cache()` can unmap a "
        "segment's free pages. The first thing to try when reserved keeps creeping or an OOM message "

        "says *reserved but unallocated* is large.\n"
        "- **`max_split_size_mb:N`** — blocks larger than N MiB are never split to serve smaller "
        "requests, so big blocks stay available for big tensors. An older remedy for the same OOM; "
        "`expandable_segments` usually works better.\n"
        "- `garbage_collection_threshold:0.8` — reclaim cached blocks once reserved passes 80% of the GPU.\n\n"
        "The allocator's own view of fragmentation is `torch.cuda.memory_stats()`: "
        "`inactive_split_bytes` are free pieces of split blocks, unusable for anything bigger."
    ),
    new_code_cell(
        "print('PYTORCH_CUDA_ALLOC_CONF =', os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(not set: the defaults)'))\n"
        "if cuda:\n"
        "    stats = torch.cuda.memory_stats()\n"
        "    print(f\"reserved {stats['reserved_bytes.all.current'] / 2**20:.1f} MiB, \"\n"
        "          f\"allocated {stats['allocated_bytes.all.current'] / 2**20:.1f} MiB, \"\n"
        "          f\"free pieces of split blocks {stats['inactive_split_bytes.all.current'] / 2**20:.1f} MiB\")\n"
        "else:\n"
        "    info = libc.mallinfo2()\n"
        "    print(f\"no GPU: glibc's heap holds {info.fordblks / 2**20:.1f} MiB free in {info.ordblks:,} free chunks \"\n"
        "          f\"(its own fragmentation), {info.keepcost / 2**20:.1f} MiB of it at the top, releasable at once\")"
    ),
    new_markdown_cell(
        "## What to remember\n"
        "- Judge a leak by **allocated** (on the CPU: **heap in use**), not by `nvidia-smi` or RSS.\n"
        "- A plateau of reserved memory after a peak is the cache: `torch.cuda.empty_cache()` hands it back "
        "(useful before handing the GPU to another process; it does not make your own training use less).\n"
        "- Reserved far above allocated, growing, or OOMs that mention *reserved but unallocated*: "
        "fragmentation — try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`."
    ),
]


REAL_SCRIPT = [
    new_markdown_cell(
        "# Finding the leak in a real training script\n\n"
        "The classic leaks are easy to spot in a five-line loop. In a real script they hide: the training "
        "step is right, validation looks right, and the tensor that keeps memory alive goes through a helper "
        "class before it lands in a container nobody looks at.\n\n"
        "Below is an ordinary image-classification script — a small CNN on synthetic 28×28 images, AdamW "
        "with a learning-rate schedule, gradient clipping, a validation pass each epoch and a metrics "
        "logger. It has one leak. Try to find it by reading first; then let `%%memwatch` find it."
    ),
    new_code_cell(
        "%load_ext torchmem_magic\n"
        "from collections import defaultdict\n"
        "import torch, torchmem_magic\n"
        "import torch.nn.functional as F\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "torch.manual_seed(0)\n"
        "torch.set_num_threads(1)"
    ),
    new_code_cell(
        "def synthetic_digits(n, seed):\n"
        "    \"\"\"28×28 images whose class is a brighter 7×7 tile in one of 10 places, plus noise.\"\"\"\n"
        "    g = torch.Generator().manual_seed(seed)\n"
        "    labels = torch.randint(0, 10, (n,), generator=g)\n"
        "    images = torch.randn(n, 1, 28, 28, generator=g)\n"
        "    for c in range(10):\n"
        "        r, k = divmod(c, 4)\n"
        "        images[labels == c, :, 7 * r:7 * r + 7, 7 * k:7 * k + 7] += 0.25\n"
        "    return TensorDataset(images, labels)\n"
        "\n"
        "train_loader = DataLoader(synthetic_digits(2560, seed=1), batch_size=64, shuffle=True)\n"
        "val_loader = DataLoader(synthetic_digits(512, seed=2), batch_size=128)\n"
        "\n"
        "class SmallCNN(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.features = torch.nn.Sequential(\n"
        "            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),\n"
        "            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),\n"
        "        )\n"
        "        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.2), torch.nn.Linear(16 * 7 * 7, 10))\n"

        "    def forward(self, x):\n"
        "        return self.head(self.features(x))"
    ),
    new_code_cell(
        "class MetricsLogger:\n"
        "    \"\"\"Keeps every logged value by name; prints an epoch summary.\"\"\"\n"
        "    def __init__(self):\n"
        "        self.history = defaultdict(list)\n"
        "    def log(self, **values):\n"
        "        for name, value in values.items():\n"
        "            self.history[name].append(value)\n"
        "    def mean(self, name, last):\n"
        "        values = self.history[name][-last:]\n"
        "        return sum(float(v) for v in values) / len(values)\n"
        "    def summary(self, epoch, steps, val_batches):\n"
        "        return (f\"epoch {epoch}: train loss {self.mean('train_loss', steps):.3f} · \"\n"
        "                f\"val loss {self.mean('val_loss', val_batches):.3f} · val acc {self.history['val_acc'][-1]:.1%}\")\n"
        "\n"
        "def train_one_epoch(model, optimizer, logger):\n"
        "    model.train()\n"
        "    for images, labels in train_loader:\n"
        "        loss = F.cross_entropy(model(images), labels)\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "        optimizer.step()\n"
        "        logger.log(train_loss=loss.item(), lr=optimizer.param_groups[0]['lr'])\n"
        "\n"
        "def validate(model, logger):\n"
        "    model.eval()  # dropout off, batch-norm statistics frozen\n"
        "    correct = 0\n"
        "    for images, labels in val_loader:\n"
        "        logits = model(images)\n"
        "        logger.log(val_loss=F.cross_entropy(logits, labels))\n"
        "        correct += (logits.argmax(1) == labels).sum().item()\n"
        "    logger.log(val_acc=correct / len(val_loader.dataset))"
    ),
    new_markdown_cell(
        "## Run it under `%%memwatch`\n"
        "Five epochs. Nothing in the code looks wrong, and the accuracy climbs as it should."
    ),
    new_code_cell(
        "%%memwatch\n"
        "model = SmallCNN()\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)\n"
        "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)\n"
        "logger = MetricsLogger()\n"
        "for epoch in range(5):\n"
        "    train_one_epoch(model, optimizer, logger)\n"
        "    validate(model, logger)\n"
        "    scheduler.step()\n"
        "    print(logger.summary(epoch, len(train_loader), len(val_loader)))"
    ),
    new_markdown_cell(
        "The curves show a **staircase**: flat while an epoch trains, a step up at every validation pass. The "
        "verdict is a **per-epoch leak** (*per-epoch leak in heap: … MiB per epoch*), the report says the heap's "
        "growth and the holder's agree (*… and logger grows …: that is where it goes*), and it names the "
        "holder: `logger`, through "
        "`logger.history['val_loss']` — a list of loss *tensors*, each keeping the autograd graph of its "
        "validation batch and the activations it saved for a backward pass that never comes.\n\n"
        "That is the hidden part: `model.eval()` switches dropout and batch norm to inference mode, but it "
        "does **not** turn off autograd. Every validation forward pass still records a graph, and "
        "`logger.log(val_loss=...)` keeps it. (torch's *UserWarning: Converting a tensor with "
        "requires_grad=True to a scalar*, from `MetricsLogger.mean`, was a hint — one warning among many in a "
        "real log, and it does not say what is kept or how much.) The fix line of the report points at the "
        "list to fill under `torch.no_grad()`. `%memcheck` shows what the logger holds, tensor by tensor — "
        "a few bytes of scalar losses that keep hundreds of MiB alive:"
    ),
    new_code_cell("leaky = torchmem_magic.last_report()\n%memcheck logger"),
    new_markdown_cell(
        "## The fix\n"
        "Two changes, each enough on its own, both good practice: run validation under `torch.no_grad()` "
        "(no graph is recorded at all, and it is faster), and log numbers, not tensors (`.item()`). "
        "First free what the leaky run kept:"
    ),
    new_code_cell(
        "del logger\n"
        "import gc; gc.collect();"
    ),
    new_code_cell(
        "@torch.no_grad()\n"
        "def validate(model, logger):\n"
        "    model.eval()\n"
        "    correct = 0\n"
        "    for images, labels in val_loader:\n"
        "        logits = model(images)\n"
        "        logger.log(val_loss=F.cross_entropy(logits, labels).item())\n"
        "        correct += (logits.argmax(1) == labels).sum().item()\n"
        "    logger.log(val_acc=correct / len(val_loader.dataset))"
    ),
    new_code_cell(
        "%%memwatch\n"
        "model = SmallCNN()\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)\n"
        "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)\n"
        "logger = MetricsLogger()\n"
        "for epoch in range(5):\n"
        "    train_one_epoch(model, optimizer, logger)\n"
        "    validate(model, logger)\n"
        "    scheduler.step()\n"
        "    print(logger.summary(epoch, len(train_loader), len(val_loader)))"
    ),
    new_markdown_cell(
        "The same learning curve (give or take a fresh model's random start), and the curves are flat after "
        "the first steps: the verdict is **clean** and no holder is named. Side by side:"

    ),
    new_code_cell(
        "fixed = torchmem_magic.last_report()\n"
        "for name, report in ((\"leaky\", leaky), (\"fixed\", fixed)):\n"
        "    heap = report.to_dict()['heap']\n"
        "    holders = ', '.join(s.name for s in report.suspects if s.kind == 'autograd-graph') or '-'\n"
        "    print(f\"{name}: {report.verdict:5} · heap {(heap['end'] - heap['start']) / 2**20:+6.1f} MiB over the run · \"\n"
        "          f\"graph holders: {holders}\")"
    ),
]


# another IPython process plays the kernel that the OOM killer ends (a notebook cannot kill itself and go on)
KILLED_RUN = 'body = \'\'\'\nimport torch\nmodel = torch.nn.Linear(256, 256); optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\noutputs = []\nget_ipython().run_cell_magic("memwatch", "--no-plot", """\nfor step in range(10**6):\n    out = model(torch.randn(256, 256))  # 256 KiB of output, and its graph\n    loss = out.square().mean()\n    optimizer.zero_grad(); loss.backward(); optimizer.step()\n    outputs.append(out)  # keeps every step\'s graph\n""")\n\'\'\'\nkernel = subprocess.Popen([sys.executable, "-m", "IPython", "--no-banner", "--ext", "torchmem_magic", "-c", body],\n                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nfrom torchmem_magic.flight.place import records_dir  # where records live (see the README)\ndeadline = time.time() + 120\nwhile time.time() < deadline and not list(records_dir().glob("*.jsonl")):\n    time.sleep(0.1)  # its record appears when its %%memwatch run starts ...\ntime.sleep(3)  # ... and we let it train for three seconds\nkernel.send_signal(signal.SIGKILL)\nprint("killed with", signal.Signals(-kernel.wait()).name)'

KERNEL_DEATH = [
    new_markdown_cell(
        "# When the kernel dies\n\n"
        "*\"The kernel appears to have died. It will restart automatically.\"* That is how most notebook users meet a "
        "memory leak: the OOM killer SIGKILLs the kernel, every variable and every figure is gone, and nothing says why.\n\n"
        "This notebook shows the two things `%%memwatch` does about it:\n\n"
        "1. **The guard** (`%%memwatch --guard 90%`) stops a leaking loop *before* the kill, with an exception in the "
        "loop, and the kernel, its variables and the report survive.\n"
        "2. **The flight recorder** keeps a small record of every `%%memwatch` run on disk while it runs, so that after "
        "a kill the next kernel can still show the curves up to the death, the verdict, the holder and what most "
        "likely killed it."
    ),
    new_code_cell(
        "%load_ext torchmem_magic\n"
        "import os, signal, subprocess, sys, time\n"
        "import psutil, torch, torchmem_magic\n"
        "torch.manual_seed(0)\n"
        "torch.set_num_threads(1)"
    ),
    new_markdown_cell(
        "## 1. The guard stops the loop before the limit\n\n"
        "A small memory limit for this demonstration: 600 MiB above what this kernel uses now. A container or a "
        "cgroup would set one for real (`%%memwatch` reads the tightest cgroup limit, else the machine's RAM); "
        "`TORCHMEM_MAGIC_RAM_LIMIT` tells it one where it cannot see it, as here."
    ),
    new_code_cell(
        "ram_now = psutil.Process().memory_info().rss\n"
        "os.environ['TORCHMEM_MAGIC_RAM_LIMIT'] = str(ram_now + (600 << 20))\n"
        "print(f'RAM now {ram_now / 2**20:.0f} MiB, limit {int(os.environ[\"TORCHMEM_MAGIC_RAM_LIMIT\"]) / 2**20:.0f} MiB')\n"
        "model = torch.nn.Linear(256, 256)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "cache = []  # the leak: every step keeps 5 MiB"
    ),
    new_code_cell(
        "%%memwatch --guard 90%\n"
        "for step in range(1000):  # 1000 x 5 MiB would be 5 GiB: far past the limit\n"
        "    loss = model(torch.randn(64, 256)).square().mean()\n"
        "    optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
        "    cache.append(torch.ones(5 << 18))  # 5 MiB\n"
        "    time.sleep(0.01)",
        metadata={"tags": ["raises-exception"]},  # the guard's MemoryGuardError: Run All goes on
    ),
    new_markdown_cell(
        "The loop raised `MemoryGuardError` (a `MemoryError`) at a step boundary once RAM reached 90% of the limit, "
        "and the report above says so. The kernel is alive and nothing is lost: the model, the optimizer and the "
        "cache are all still here, to inspect and to fix."
    ),
    new_code_cell(
        "print(f'{len(cache)} steps kept {len(cache) * 5} MiB in cache; the model is still here: {tuple(model.weight.shape)}')\n"
        "print('status:', torchmem_magic.last_report().status)\n"
        "cache.clear()\n"
        "del os.environ['TORCHMEM_MAGIC_RAM_LIMIT']"
    ),
    new_markdown_cell(
        "## 2. The flight record of a kernel that was killed\n\n"
        "A notebook cannot kill its own kernel and go on, so here another IPython process plays the kernel: it "
        "runs a leaking loop under `%%memwatch` in this directory, and we SIGKILL it three seconds into the run, as the "
        "OOM killer would. (Its working directory, like a restarted kernel's notebook, is what ties its record to "
        "this notebook.)"
    ),
    new_code_cell(KILLED_RUN),
    new_markdown_cell(
        "Its record outlived it. In a new kernel of this notebook, the first `%load_ext torchmem_magic` would show "
        "it once by itself; `%memwatch --last` shows it whenever asked (and `torchmem_magic.last_crash()` returns "
        "it as a `Report`):"
    ),
    new_code_cell("%memwatch --last"),
    new_markdown_cell(
        "The record holds its curves up to the last half second before the kill, the verdict they give, the holder "
        "the last scan saw (`outputs`) with its fix, and the last readings against their limits. Here nothing was "
        "near a limit, so it says the cause cannot be known from the record; a real OOM kill is told as the OOM "
        "killer's (the kernel's OOM-kill counters went up, or RAM was at its limit).\n\n"
        "Records stay until you clear them:"
    ),
    new_code_cell("crash = torchmem_magic.last_crash()\nprint(crash.status, crash.steps, [s.name for s in crash.suspects])\nprint('cleared', torchmem_magic.clear_crashes())"),
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
    write("04_dataloader_workers_and_shared_memory.ipynb", DATALOADER_SHM)
    write("05_gpu_memory.ipynb", GPU_MEMORY)
    write("06_finding_the_leak_in_a_real_script.ipynb", REAL_SCRIPT)
    write("07_when_the_kernel_dies.ipynb", KERNEL_DEATH)
