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
        "optimizer steps above the figure. Dashed lines mark each new DataLoader iterator: here every "
        "training epoch and every validation pass, which is why the report counts twice as many \"epochs\" "
        "as the loop has."
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


def write(name: str, cells: list) -> None:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.validate(nb)
    nbformat.write(nb, ROOT / "notebooks" / name)


if __name__ == "__main__":
    write("01_memwatch_quickstart.ipynb", QUICKSTART)
