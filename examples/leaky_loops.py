"""A catalogue of classic leaking and clean training loops, as cell bodies.

Used by the verdict tests (in a real kernel) and by bench/verdicts.py (the seeds' rules vs ours).
Each leak maps to (cell body, the leak kind it must be called); each clean loop to its body.
"""

SETUP = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
def mlp(width=512):
    return torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
def train_step(model, opt, x):
    loss = model(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    return loss
"""

LEAKS = {
    "eval_without_no_grad": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); val_outputs = []\n"
        "for step in range(100):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    val_outputs.append(model(torch.randn(128, 64)))\n",
        "per-iteration",
    ),
    "loss_kept_without_backward": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); aux_losses = []\n"
        "for step in range(100):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    aux_losses.append(model(torch.randn(256, 64)).abs().mean())  # logged, never backpropagated\n",
        "per-iteration",
    ),
    "rnn_hidden_not_detached": (
        "cell = torch.nn.RNNCell(64, 512); head = torch.nn.Linear(512, 1)\n"
        "opt = torch.optim.SGD(head.parameters(), lr=1e-3); h = torch.zeros(64, 512)\n"
        "for step in range(100):\n"
        "    h = cell(torch.randn(64, 64), h)\n"
        "    loss = head(h).mean()\n"
        "    opt.zero_grad(); loss.backward(retain_graph=True); opt.step()\n",
        "per-iteration",
    ),
    "leak_into_object_attribute": (
        "class Tracker:\n"
        "    def __init__(self): self.outputs = []\n"
        "    def record(self, out): self.outputs.append(out)\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); tracker = Tracker()\n"
        "for step in range(100):\n"
        "    x = torch.randn(128, 64)\n"
        "    train_step(model, opt, x)\n"
        "    tracker.record(model(x))\n",
        "per-iteration",
    ),
    "validation_leak_per_epoch": (
        "model = mlp(1024); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "train = DataLoader(TensorDataset(torch.randn(640, 64)), batch_size=32)\n"
        "val = DataLoader(TensorDataset(torch.randn(2048, 64)), batch_size=256)\n"
        "val_outputs = []\n"
        "for epoch in range(6):\n"
        "    for (x,) in train:\n"
        "        train_step(model, opt, x)\n"
        "    for (x,) in val:\n"
        "        val_outputs.append(model(x))  # no torch.no_grad()\n",
        "per-epoch",
    ),
    "leak_every_40th_step": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); snapshots = []\n"
        "for step in range(200):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    if step % 40 == 39:\n"
        "        snapshots.append(torch.ones(5 << 20))  # a 20 MiB 'checkpoint' kept every 40th step\n",
        "sporadic",
    ),
}

CLEAN = {
    "loss_item": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); history = []\n"
        "for step in range(150):\n"
        "    history.append(train_step(model, opt, torch.randn(32, 64)).item())\n"
    ),
    "warmup_plateau": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); cache = {}\n"
        "for step in range(150):\n"
        "    cache.setdefault(step % 3, torch.ones(2 << 20))  # fills in the first 3 steps, then stays\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
    ),
    "adam_first_step_state": (
        "model = mlp(4096); opt = torch.optim.Adam(model.parameters())  # ~2 MiB of state at step 1\n"
        "for step in range(150):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
    ),
    "sawtooth_temporaries": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    if step % 5 == 0:\n"
        "        scratch = torch.ones(10 << 20)  # 40 MiB, alive for a few steps\n"
        "    if step % 5 == 3:\n"
        "        del scratch\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
    ),
    "big_constant_model": (
        "big = torch.nn.Sequential(torch.nn.Linear(64, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 1))\n"
        "opt = torch.optim.SGD(big.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    train_step(big, opt, torch.randn(32, 64))\n"
    ),
}
