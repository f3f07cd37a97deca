"""A catalogue of leaking and clean training loops, as cell bodies, written the way users write them.

Used by the verdict tests (in a real kernel) and by bench/verdicts.py (the seeds' rules vs ours).
Each leak maps to (cell body, the leak kind it must be called); each clean loop to its body.
HOLDER_LEAKS and HOLDER_CLEAN (at the end) are loops through Lightning, transformers, torchmetrics and
Accelerate, and plain-PyTorch holder shapes, whose holder (HOLDERS) tests/kernel/test_framework_loops.py
checks is named first.
A name also says what its verdict must be found with:
- `_no_optimizer`: no optimizer, so the steps are backward passes (or forward calls when there is no backward);
- `_graph_only`: only autograd graph nodes pile up (backward already freed their saved tensors), a few KiB a step;
- `every_Nth_step`: a sporadic leak whose jumps come after steps N, 2N, ...;
- `copy_on_access`: the growth is in the DataLoader workers (their PSS), not in the kernel's heap.
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
    # per-iteration ------------------------------------------------------------------------------------
    # each step's validation output is kept without torch.no_grad(): its graph keeps the activations
    "eval_without_no_grad": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); val_outputs = []\n"
        "for step in range(100):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    val_outputs.append(model(torch.randn(128, 64)))\n",
        "per-iteration",
    ),
    # an auxiliary loss that is logged but never backpropagated keeps its graph and activations
    "loss_kept_without_backward": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); aux_losses = []\n"
        "for step in range(100):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    aux_losses.append(model(torch.randn(256, 64)).abs().mean())  # logged, never backpropagated\n",
        "per-iteration",
    ),
    # the hidden state is never detached: with retain_graph=True every earlier step's graph stays alive
    "rnn_hidden_not_detached": (
        "cell = torch.nn.RNNCell(64, 512); head = torch.nn.Linear(512, 1)\n"
        "opt = torch.optim.SGD(head.parameters(), lr=1e-3); h = torch.zeros(64, 512)\n"
        "for step in range(100):\n"
        "    h = cell(torch.randn(64, 64), h)\n"
        "    loss = head(h).mean()\n"
        "    opt.zero_grad(); loss.backward(retain_graph=True); opt.step()\n",
        "per-iteration",
    ),
    # an object's list attribute keeps every step's output, with its graph
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
    # `total_loss += loss` after backward chains every step's graph nodes onto one tensor
    "total_loss_sum_graph_only": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "total_loss = 0\n"
        "for step in range(300):\n"
        "    loss = model(torch.randn(32, 64)).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    total_loss += loss\n"
        "mean_loss = total_loss / 300\n",
        "per-iteration",
    ),
    # manual SGD: `history.append(loss)` after backward keeps every step's graph nodes
    "loss_history_graph_only_no_optimizer": (
        "model = mlp(); history = []\n"
        "for step in range(300):\n"
        "    loss = model(torch.randn(32, 64)).square().mean()\n"
        "    model.zero_grad()\n"
        "    loss.backward()\n"
        "    with torch.no_grad():\n"
        "        for p in model.parameters():\n"
        "            p -= 1e-3 * p.grad\n"
        "    history.append(loss)\n",
        "per-iteration",
    ),
    # a running mean of the features that is never detached chains every step's graph nodes
    "feature_ema_not_detached_graph_only": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "feature_mean = torch.zeros(512)\n"
        "for step in range(300):\n"
        "    hidden = model[:2](torch.randn(32, 64))\n"
        "    loss = model[2](hidden).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    feature_mean = 0.99 * feature_mean + 0.01 * hidden.mean(0)\n",
        "per-iteration",
    ),
    # manual SGD: a forward hook appends every ReLU output (128 KiB) to a list held only by its closure
    "forward_hook_closure_no_optimizer": (
        "def record_outputs(module):\n"
        "    outputs = []\n"
        "    def hook(module, inputs, output):\n"
        "        outputs.append(output)  # meant for an activation histogram, never read\n"
        "    module.register_forward_hook(hook)\n"
        "model = mlp()\n"
        "record_outputs(model[1])\n"
        "for step in range(200):\n"
        "    loss = model(torch.randn(64, 64)).square().mean()\n"
        "    model.zero_grad()\n"
        "    loss.backward()\n"
        "    with torch.no_grad():\n"
        "        for p in model.parameters():\n"
        "            p.add_(p.grad, alpha=-1e-3)\n",
        "per-iteration",
    ),
    # a logger made by a closure keeps every step's embeddings (256 KiB) in the list it captured
    "logger_closure_keeps_embeddings": (
        "def make_logger():\n"
        "    logged = []\n"
        "    def log(embeddings):\n"
        "        logged.append(embeddings)\n"
        "        return len(logged)\n"
        "    return log\n"
        "log_embeddings = make_logger()\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    embeddings = model[:2](torch.randn(128, 64))\n"
        "    loss = model[2](embeddings).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    log_embeddings(embeddings)\n",
        "per-iteration",
    ),
    # `seen=[]` is created once, with the function: every call appends its batch (64 KiB) to the same list
    "mutable_default_argument": (
        "def remember_batch(batch, seen=[]):\n"
        "    seen.append(batch)\n"
        "    return len(seen)\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(200):\n"
        "    x = torch.randn(256, 64)\n"
        "    train_step(model, opt, x)\n"
        "    remember_batch(x)\n",
        "per-iteration",
    ),
    # a helper appends to a global dict of the notebook: feature means not detached keep their activations
    "global_dict_in_notebook": (
        "STATS = {'feature_mean': []}\n"
        "def track_features(model, x):\n"
        "    STATS['feature_mean'].append(model[:2](x).mean(0))\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    x = torch.randn(128, 64)\n"
        "    train_step(model, opt, x)\n"
        "    track_features(model, x)\n",
        "per-iteration",
    ),
    # a dict keyed by step keeps every step's logits (125 KiB) and their graph nodes
    "logits_dict_keyed_by_step": (
        "model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1000))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1e-2); logits_by_step = {}\n"
        "for step in range(200):\n"
        "    x, y = torch.randn(32, 64), torch.randint(0, 1000, (32,))\n"
        "    logits = model(x)\n"
        "    loss = torch.nn.functional.cross_entropy(logits, y)\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    logits_by_step[step] = logits\n",
        "per-iteration",
    ),
    # torch.cat onto an ever longer tensor: every step's embeddings (128 KiB, no graph) kept
    "torch_cat_growing_tensor": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "all_embeddings = torch.empty(0, 512)\n"
        "for step in range(150):\n"
        "    x = torch.randn(64, 64)\n"
        "    train_step(model, opt, x)\n"
        "    with torch.no_grad():\n"
        "        all_embeddings = torch.cat([all_embeddings, model[:2](x)])\n",
        "per-iteration",
    ),
    # inference only: model.eval() does not turn autograd off, so every kept prediction keeps its graph
    "inference_without_no_grad_no_optimizer": (
        "model = mlp(); model.eval(); predictions = []\n"
        "for step in range(150):\n"
        "    predictions.append(model(torch.randn(128, 64)))\n",
        "per-iteration",
    ),
    # the model appends its features (128 KiB) to one of its own attributes at every forward call
    "module_keeps_features_in_forward": (
        "class Regressor(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.encoder = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU())\n"
        "        self.head = torch.nn.Linear(512, 1)\n"
        "        self.features = []  # for a t-SNE plot after training\n"
        "    def forward(self, x):\n"
        "        h = self.encoder(x)\n"
        "        self.features.append(h.detach())\n"
        "        return self.head(h)\n"
        "model = Regressor(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(200):\n"
        "    train_step(model, opt, torch.randn(64, 64))\n",
        "per-iteration",
    ),
    # lru_cache(maxsize=None) over a million sample indices: the cache only grows
    "unbounded_lru_cache": (
        "import functools\n"
        "@functools.lru_cache(maxsize=None)\n"
        "def load_sample(index):\n"
        "    return torch.randn(64, generator=torch.Generator().manual_seed(index))  # stands for decoding a file\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(200):\n"
        "    indices = torch.randint(0, 1_000_000, (128,)).tolist()\n"
        "    train_step(model, opt, torch.stack([load_sample(i) for i in indices]))\n",
        "per-iteration",
    ),
    # 2 DataLoader workers read 1.5 M Python strings: each read writes the string's refcount, which copies
    # its page into the worker, so the workers' memory grows until they have read everything
    "copy_on_access_dataloader_workers": (
        "from torch.utils.data import Dataset\n"
        "class Captions(Dataset):\n"
        "    def __init__(self, n):\n"
        "        self.captions = [f'photo {i}: a dog next to a red bicycle, number {i % 977}' for i in range(n)]\n"
        "    def __len__(self):\n"
        "        return len(self.captions)\n"
        "    def __getitem__(self, i):\n"
        "        return len(self.captions[i].split())\n"
        "model = torch.nn.Linear(1, 1); opt = torch.optim.SGD(model.parameters(), lr=1e-4)\n"
        "loader = DataLoader(Captions(1_500_000), batch_size=5000, num_workers=2)\n"
        "for words in loader:\n"
        "    loss = model(words.float().unsqueeze(1)).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n",
        "per-iteration",
    ),
    # per-epoch ----------------------------------------------------------------------------------------
    # every epoch's validation outputs are kept without torch.no_grad(): 8 MiB of activations per epoch
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
    # an in-memory checkpoint of the model and its Adam state (~6 MiB) every epoch, none ever dropped
    "checkpoint_copies_per_epoch": (
        "import copy\n"
        "model = mlp(8192); opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "train = DataLoader(TensorDataset(torch.randn(640, 64)), batch_size=32, shuffle=True)\n"
        "checkpoints = []\n"
        "for epoch in range(6):\n"
        "    for (x,) in train:\n"
        "        train_step(model, opt, x)\n"
        "    checkpoints.append(copy.deepcopy({'model': model.state_dict(), 'optimizer': opt.state_dict()}))\n",
        "per-epoch",
    ),
    # manual SGD: each epoch's validation predictions, kept by epoch without torch.no_grad(), keep 4 MiB of activations
    "val_predictions_by_epoch_no_optimizer": (
        "model = mlp(1024)\n"
        "train = DataLoader(TensorDataset(torch.randn(640, 64)), batch_size=32, shuffle=True)\n"
        "val_x = torch.randn(1024, 64); val_predictions = {}\n"
        "for epoch in range(6):\n"
        "    model.train()\n"
        "    for (x,) in train:\n"
        "        loss = model(x).square().mean()\n"
        "        model.zero_grad(); loss.backward()\n"
        "        with torch.no_grad():\n"
        "            for p in model.parameters():\n"
        "                p -= 1e-3 * p.grad\n"
        "    model.eval()\n"
        "    val_predictions[epoch] = model(val_x)\n",
        "per-epoch",
    ),
    # every epoch's embeddings of a fixed probe set (8 MiB, no graph), kept to animate them later
    "embedding_history_per_epoch": (
        "model = mlp(1024); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "train = DataLoader(TensorDataset(torch.randn(640, 64)), batch_size=32, shuffle=True)\n"
        "probe = torch.randn(2048, 64); embedding_history = []\n"
        "for epoch in range(6):\n"
        "    for (x,) in train:\n"
        "        train_step(model, opt, x)\n"
        "    with torch.no_grad():\n"
        "        embedding_history.append(model[:2](probe))\n",
        "per-epoch",
    ),
    # sporadic -----------------------------------------------------------------------------------------
    # a 20 MiB 'checkpoint' tensor kept every 40th step
    "leak_every_40th_step": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); snapshots = []\n"
        "for step in range(200):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    if step % 40 == 39:\n"
        "        snapshots.append(torch.ones(5 << 20))  # a 20 MiB 'checkpoint' kept every 40th step\n",
        "sporadic",
    ),
    # a failed checkpoint save every 50th step: each kept exception's traceback keeps the frame of
    # save_checkpoint, and in it a copy of the weights and momentum (~4 MiB)
    "failed_checkpoint_saves_every_50th_step": (
        "import copy\n"
        "def save_checkpoint(model, opt, step):\n"
        "    state = copy.deepcopy({'model': model.state_dict(), 'optimizer': opt.state_dict()})\n"
        "    torch.save(state, f'/nonexistent/checkpoints/step{step}.pt')  # the directory is missing: raises\n"
        "model = mlp(8192); opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)\n"
        "failed_saves = []\n"
        "for step in range(250):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    if step % 50 == 49:\n"
        "        try:\n"
        "            save_checkpoint(model, opt, step)\n"
        "        except RuntimeError as error:\n"
        "            failed_saves.append(error)  # to report at the end\n",
        "sporadic",
    ),
    # manual SGD: every 50th step a validation pass without torch.no_grad() is kept by step (4 MiB of activations)
    "val_outputs_by_step_every_50th_step_no_optimizer": (
        "model = mlp(); val_x = torch.randn(2048, 64); val_outputs = {}\n"
        "for step in range(250):\n"
        "    loss = model(torch.randn(32, 64)).square().mean()\n"
        "    model.zero_grad(); loss.backward()\n"
        "    with torch.no_grad():\n"
        "        for p in model.parameters():\n"
        "            p -= 1e-3 * p.grad\n"
        "    if step % 50 == 49:\n"
        "        val_outputs[step] = model(val_x)\n",
        "sporadic",
    ),
}

CLEAN = {
    # the loss is logged as a Python float
    "loss_item": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); history = []\n"
        "for step in range(150):\n"
        "    history.append(train_step(model, opt, torch.randn(32, 64)).item())\n"
    ),
    # a cache fills in the first 3 steps, then stays
    "warmup_plateau": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); cache = {}\n"
        "for step in range(150):\n"
        "    cache.setdefault(step % 3, torch.ones(2 << 20))  # fills in the first 3 steps, then stays\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
    ),
    # Adam's state (~2 MiB) appears at the first step, then stays
    "adam_first_step_state": (
        "model = mlp(4096); opt = torch.optim.Adam(model.parameters())  # ~2 MiB of state at step 1\n"
        "for step in range(150):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
    ),
    # 40 MiB temporaries alive for a few steps, then freed
    "sawtooth_temporaries": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    if step % 5 == 0:\n"
        "        scratch = torch.ones(10 << 20)  # 40 MiB, alive for a few steps\n"
        "    if step % 5 == 3:\n"
        "        del scratch\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
    ),
    # a big model: a lot of memory, all of it there from the start
    "big_constant_model": (
        "big = torch.nn.Sequential(torch.nn.Linear(64, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 1))\n"
        "opt = torch.optim.SGD(big.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    train_step(big, opt, torch.randn(32, 64))\n"
    ),
    # a 50-step warm-up: the first epoch caches its 50 preprocessed batches (512 KiB each), later epochs reuse them
    "first_epoch_fills_batch_cache": (
        "projection = torch.randn(64, 4096)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4096, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "loader = DataLoader(TensorDataset(torch.randn(1600, 64)), batch_size=32)\n"
        "features = {}\n"
        "for epoch in range(5):\n"
        "    for i, (x,) in enumerate(loader):\n"
        "        if i not in features:\n"
        "            features[i] = torch.tanh(x @ projection)  # expensive preprocessing, done once per batch\n"
        "        train_step(model, opt, features[i])\n"
    ),
    # one causal mask per bucketed sequence length (8 buckets, 13 MiB): all made within the first ~15 steps
    "mask_cache_per_length": (
        "import random\n"
        "masks = {}\n"
        "def causal_mask(n):\n"
        "    if n not in masks:\n"
        "        masks[n] = torch.full((n, n), float('-inf')).triu(1)\n"
        "    return masks[n]\n"
        "query = torch.nn.Linear(32, 32); opt = torch.optim.SGD(query.parameters(), lr=1e-3)\n"
        "rng = random.Random(0)\n"
        "for step in range(150):\n"
        "    n = rng.choice(range(128, 1025, 128))\n"
        "    x = torch.randn(n, 32)\n"
        "    weights = torch.softmax(query(x) @ x.T / 8 + causal_mask(n), dim=-1)\n"
        "    loss = (weights @ x).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
    ),
    # a bounded buffer: collections.deque(maxlen=40) of recent batches (2.5 MiB when full), replayed with the current one
    "recent_batches_deque": (
        "import collections, random\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "recent = collections.deque(maxlen=40)\n"
        "for step in range(200):\n"
        "    x = torch.randn(256, 64)\n"
        "    replay = random.choice(recent) if recent else x\n"
        "    recent.append(x)\n"
        "    train_step(model, opt, torch.cat([x, replay]))\n"
    ),
    # an epoch's features (3 MiB) are collected for an epoch statistic, then the list is cleared
    "epoch_features_cleared": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "train = DataLoader(TensorDataset(torch.randn(1600, 64)), batch_size=32, shuffle=True)\n"
        "epoch_features = []\n"
        "for epoch in range(4):\n"
        "    for (x,) in train:\n"
        "        hidden = model[:2](x)\n"
        "        loss = model[2](hidden).square().mean()\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n"
        "        epoch_features.append(hidden.detach())\n"
        "    feature_spread = torch.cat(epoch_features).std(0).mean().item()\n"
        "    epoch_features.clear()\n"
    ),
    # a validation output without torch.no_grad(), but each step's replaces the last: one graph alive at a time
    "last_val_output_kept": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); val_x = torch.randn(512, 64)\n"
        "for step in range(150):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    val_out = model(val_x)\n"
        "    val_score = val_out.mean().item()\n"
    ),
    # two losses through one graph: retain_graph=True on the first backward only, the graph goes with the step
    "two_losses_retain_graph": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    hidden = model[:2](torch.randn(64, 64))\n"
        "    main_loss = model[2](hidden).square().mean()\n"
        "    sparsity_loss = 1e-3 * hidden.abs().mean()\n"
        "    opt.zero_grad()\n"
        "    main_loss.backward(retain_graph=True)\n"
        "    sparsity_loss.backward()\n"
        "    opt.step()\n"
    ),
    # gradient accumulation over 4 micro-batches: gradients are summed in place
    "gradient_accumulation": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); accumulation = 4\n"
        "for step in range(400):\n"
        "    loss = model(torch.randn(32, 64)).square().mean() / accumulation\n"
        "    loss.backward()\n"
        "    if (step + 1) % accumulation == 0:\n"
        "        opt.step()\n"
        "        opt.zero_grad()\n"
    ),
    # mixed precision on CPU: autocast's bfloat16 copies of the weights are dropped when the context exits
    "autocast_bfloat16": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "        loss = model(torch.randn(64, 64)).float().square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
    ),
    # inference under torch.no_grad(): only a count is kept
    "inference_no_grad_no_optimizer": (
        "model = mlp(); model.eval(); positives = 0\n"
        "with torch.no_grad():\n"
        "    for step in range(200):\n"
        "        positives += (model(torch.randn(256, 64)) > 0).sum().item()\n"
    ),
    # a fixed-size replay buffer: tensors allocated once, written as a ring
    "fixed_size_replay_buffer": (
        "capacity = 5000\n"
        "states = torch.zeros(capacity, 64); targets = torch.zeros(capacity, 1)\n"
        "q_net = mlp(); opt = torch.optim.Adam(q_net.parameters(), lr=1e-3); stored = 0\n"
        "for step in range(300):\n"
        "    slots = torch.arange(stored, stored + 32) % capacity\n"
        "    states[slots] = torch.randn(32, 64); targets[slots] = torch.randn(32, 1)\n"
        "    stored += 32\n"
        "    batch = torch.randint(0, min(stored, capacity), (64,))\n"
        "    loss = (q_net(states[batch]) - targets[batch]).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
    ),
    # Adam with a one-cycle learning-rate schedule: the scheduler keeps a few floats
    "adam_one_cycle_schedule": (
        "model = mlp(); opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=200)\n"
        "for step in range(200):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    schedule.step()\n"
    ),
    # an exponential moving average of the weights, updated in place under torch.no_grad()
    "ema_weights_in_place": (
        "import copy\n"
        "model = mlp(); ema = copy.deepcopy(model); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    with torch.no_grad():\n"
        "        for p_ema, p in zip(ema.parameters(), model.parameters()):\n"
        "            p_ema.mul_(0.99).add_(p, alpha=0.01)\n"
    ),
    # truncated backpropagation through time: the hidden state is detached at every step
    "rnn_hidden_detached": (
        "cell = torch.nn.RNNCell(64, 512); head = torch.nn.Linear(512, 1)\n"
        "opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=1e-3); h = torch.zeros(64, 512)\n"
        "for step in range(150):\n"
        "    h = cell(torch.randn(64, 64), h.detach())\n"
        "    loss = head(h).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
    ),
    # 2 DataLoader workers over 1.5 M samples held in one tensor: no Python objects for them to copy
    "dataloader_workers_tensor_dataset": (
        "from torch.utils.data import BatchSampler, RandomSampler\n"
        "lengths = TensorDataset(torch.randint(5, 40, (1_500_000, 1)).float())\n"
        "batches = BatchSampler(RandomSampler(lengths), batch_size=5000, drop_last=False)\n"
        "loader = DataLoader(lengths, sampler=batches, batch_size=None, num_workers=2)\n"
        "model = torch.nn.Linear(1, 1); opt = torch.optim.SGD(model.parameters(), lr=1e-4)\n"
        "for (x,) in loader:\n"
        "    loss = model(x).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
    ),
    # manual SGD, the loss logged as a Python float
    "manual_sgd_loss_item_no_optimizer": (
        "model = mlp(); losses = []\n"
        "for step in range(200):\n"
        "    loss = model(torch.randn(32, 64)).square().mean()\n"
        "    model.zero_grad()\n"
        "    loss.backward()\n"
        "    with torch.no_grad():\n"
        "        for p in model.parameters():\n"
        "            p -= 1e-3 * p.grad\n"
        "    losses.append(loss.item())\n"
    ),
    # gradient clipping, and a running loss summed into a detached tensor that is reset every 50 steps
    "clipped_grads_detached_running_loss": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "running = torch.zeros(()); mean_losses = []\n"
        "for step in range(200):\n"
        "    loss = model(torch.randn(32, 64)).square().mean()\n"
        "    opt.zero_grad(); loss.backward()\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
        "    opt.step()\n"
        "    running += loss.detach()\n"
        "    if step % 50 == 49:\n"
        "        mean_losses.append(running.item() / 50)\n"
        "        running.zero_()\n"
    ),
    # a forward hook keeps only the latest activation, detached, overwritten at every step
    "hook_keeps_latest_activation": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); latest = {}\n"
        "model[1].register_forward_hook(lambda module, inputs, output: latest.update(relu=output.detach()))\n"
        "for step in range(150):\n"
        "    train_step(model, opt, torch.randn(64, 64))\n"
        "    dead_fraction = (latest['relu'] == 0).float().mean().item()\n"
    ),
    # lru_cache(maxsize=256): full after two steps, then it evicts as much as it adds
    "bounded_lru_cache": (
        "import functools\n"
        "@functools.lru_cache(maxsize=256)\n"
        "def load_sample(index):\n"
        "    return torch.randn(64, generator=torch.Generator().manual_seed(index))  # stands for decoding a file\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(200):\n"
        "    indices = torch.randint(0, 1_000_000, (128,)).tolist()\n"
        "    train_step(model, opt, torch.stack([load_sample(i) for i in indices]))\n"
    ),
    # validation every epoch under torch.no_grad(), its loss kept as a Python float
    "validation_no_grad_per_epoch": (
        "model = mlp(1024); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "train = DataLoader(TensorDataset(torch.randn(640, 64)), batch_size=32)\n"
        "val = DataLoader(TensorDataset(torch.randn(2048, 64)), batch_size=256)\n"
        "val_losses = []\n"
        "for epoch in range(6):\n"
        "    for (x,) in train:\n"
        "        train_step(model, opt, x)\n"
        "    with torch.no_grad():\n"
        "        val_losses.append(sum(model(x).square().mean().item() for (x,) in val) / len(val))\n"
    ),
    # a sliding window built with torch.cat and cut to its last 2048 rows (4 MiB): full after 32 steps
    "bounded_window_cat": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "window = torch.empty(0, 512)\n"
        "for step in range(150):\n"
        "    x = torch.randn(64, 64)\n"
        "    train_step(model, opt, x)\n"
        "    with torch.no_grad():\n"
        "        window = torch.cat([window, model[:2](x)])[-2048:]\n"
    ),
}


# Loops whose holder the report must name ---------------------------------------------------------------
# Through the frameworks users train with (Lightning, Hugging Face transformers, torchmetrics, Accelerate),
# and holder shapes of plain PyTorch that the loops above do not have (a registered buffer, a class
# attribute, a list deep in a big object; DataLoader workers that must stay clean). They run after SETUP and
# after FRAMEWORK_SETUP of the framework FRAMEWORKS names (imported outside the watched cell, as a notebook
# imports in its first cell); `lightning_root` is the Trainer's default_root_dir (a temporary directory).

#: what a notebook runs before the loops of each framework
FRAMEWORK_SETUP = {
    "lightning": (
        "import logging, warnings, lightning as L\n"
        "from lightning.fabric.utilities.warnings import PossibleUserWarning\n"
        "logging.getLogger('lightning.pytorch').setLevel(logging.ERROR)  # no 'GPU available' banners\n"
        "warnings.filterwarnings('ignore', category=PossibleUserWarning)  # 'does not have many workers'\n"
        "def make_trainer(**options):\n"
        "    return L.Trainer(accelerator='cpu', logger=False, enable_checkpointing=False, enable_progress_bar=False,\n"
        "                     enable_model_summary=False, default_root_dir=lightning_root, **options)\n"
    ),
    "transformers": (
        "import transformers\n"
        "transformers.logging.set_verbosity_error()\n"
        "def tiny_gpt2():  # built from a config: nothing downloaded\n"
        "    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64,\n"
        "                                     bos_token_id=0, eos_token_id=0)\n"
        "    return transformers.GPT2LMHeadModel(config)\n"
    ),
    "torchmetrics": "import torchmetrics\n",
    "accelerate": "from accelerate import Accelerator\n",
}

#: name -> (cell body, the leak kind it must be called)
HOLDER_LEAKS = {
    # Lightning ---------------------------------------------------------------------------------------
    # validation outputs (512 KiB a batch, no graph: Lightning validates under inference mode) kept on the
    # module for on_validation_epoch_end, never cleared: 2 MiB more after every epoch's validation
    "lightning_val_outputs_on_module": (
        "class LitRegressor(L.LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.net = mlp()\n"
        "        self.val_outputs = []\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        (x,) = batch\n"
        "        return self.net(x).square().mean()\n"
        "    def validation_step(self, batch, batch_idx):\n"
        "        (x,) = batch\n"
        "        out = self.net[:2](x)\n"
        "        self.val_outputs.append(out)  # for on_validation_epoch_end, never cleared\n"
        "    def configure_optimizers(self):\n"
        "        return torch.optim.SGD(self.parameters(), lr=1e-3)\n"
        "model = LitRegressor()\n"
        "train = DataLoader(TensorDataset(torch.randn(320, 64)), batch_size=32)\n"
        "val = DataLoader(TensorDataset(torch.randn(1024, 64)), batch_size=256)\n"
        "make_trainer(max_epochs=6).fit(model, train, val)\n",
        "per-epoch",
    ),
    # every step's loss kept on the module (the training_step_outputs of Lightning's docs, never cleared):
    # after backward only its graph's nodes stay, a few KiB a step
    "lightning_train_outputs_with_graphs": (
        "class LitRegressor(L.LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.net = mlp()\n"
        "        self.train_outputs = []\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        (x,) = batch\n"
        "        loss = self.net(x).square().mean()\n"
        "        self.train_outputs.append(loss)  # for on_train_epoch_end, never cleared\n"
        "        return loss\n"
        "    def configure_optimizers(self):\n"
        "        return torch.optim.SGD(self.parameters(), lr=1e-3)\n"
        "model = LitRegressor()\n"
        "train = DataLoader(TensorDataset(torch.randn(1920, 64)), batch_size=32)\n"
        "make_trainer(max_epochs=4).fit(model, train)\n",
        "per-iteration",
    ),
    # Hugging Face transformers -------------------------------------------------------------------------
    # every step's logits (400 KiB) kept for a perplexity at the end, with their graph's nodes
    "hf_logits_kept": (
        "model = tiny_gpt2(); opt = torch.optim.AdamW(model.parameters(), lr=1e-3); kept_logits = []\n"
        "for step in range(60):\n"
        "    input_ids = torch.randint(0, 100, (16, 64))\n"
        "    outputs = model(input_ids, labels=input_ids)\n"
        "    opt.zero_grad(); outputs.loss.backward(); opt.step()\n"
        "    kept_logits.append(outputs.logits)\n",
        "per-iteration",
    ),
    # every step's whole ModelOutput kept: loss, logits and the key/value cache, with their graph's nodes
    "hf_model_outputs_kept": (
        "model = tiny_gpt2(); opt = torch.optim.AdamW(model.parameters(), lr=1e-3); step_outputs = []\n"
        "for step in range(60):\n"
        "    input_ids = torch.randint(0, 100, (16, 64))\n"
        "    outputs = model(input_ids, labels=input_ids)\n"
        "    opt.zero_grad(); outputs.loss.backward(); opt.step()\n"
        "    step_outputs.append(outputs)\n",
        "per-iteration",
    ),
    # torchmetrics --------------------------------------------------------------------------------------
    # a CatMetric collecting every step's embeddings (128 KiB) in its list state, never reset
    "torchmetrics_cat_metric_never_reset": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "all_embeddings = torchmetrics.CatMetric()\n"
        "for step in range(100):\n"
        "    x = torch.randn(64, 64)\n"
        "    train_step(model, opt, x)\n"
        "    with torch.no_grad():\n"
        "        all_embeddings.update(model[:2](x))  # for a projection after training; never reset\n",
        "per-iteration",
    ),
    # Accelerate ----------------------------------------------------------------------------------------
    # every step's gathered output (128 KiB) kept, with its graph's nodes
    "accelerate_outputs_kept": (
        "accelerator = Accelerator(cpu=True)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "loader = DataLoader(TensorDataset(torch.randn(6400, 64)), batch_size=128)\n"
        "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
        "all_outputs = []\n"
        "for epoch in range(2):\n"
        "    for (x,) in loader:\n"
        "        out = model(x)\n"
        "        loss = out.square().mean()\n"
        "        opt.zero_grad(); accelerator.backward(loss); opt.step()\n"
        "        all_outputs.append(accelerator.gather_for_metrics(out))\n",
        "per-iteration",
    ),
    # plain PyTorch -------------------------------------------------------------------------------------
    # a registered buffer re-registered bigger at every forward call: 128 KiB more features a step
    "registered_buffer_grows": (
        "class FeatureBank(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.encoder = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU())\n"
        "        self.head = torch.nn.Linear(512, 1)\n"
        "        self.register_buffer('seen', torch.empty(0, 512))  # saved with the state_dict\n"
        "    def forward(self, x):\n"
        "        h = self.encoder(x)\n"
        "        self.seen = torch.cat([self.seen, h.detach()])  # still the buffer, one batch bigger\n"
        "        return self.head(h)\n"
        "model = FeatureBank(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for step in range(150):\n"
        "    train_step(model, opt, torch.randn(64, 64))\n",
        "per-iteration",
    ),
    # a class attribute dict, meant per tap, is one dict shared by every Tap and kept by the class:
    # every step's activations (128 KiB) stay, with their graph's nodes
    "class_attribute_store_shared": (
        "class Tap:\n"
        "    store = {}  # a class attribute: shared by every Tap, alive as long as the class\n"
        "    def __init__(self, name):\n"
        "        self.name = name\n"
        "    def record(self, step, t):\n"
        "        self.store[step] = t\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "hidden_tap = Tap('hidden')\n"
        "for step in range(150):\n"
        "    hidden = model[:2](torch.randn(64, 64))\n"
        "    loss = model[2](hidden).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    hidden_tap.record(step, hidden)\n",
        "per-iteration",
    ),
    # a run-state object: a resumed run's 40,000 plain log records, then, four levels down, the validation
    # outputs of every step kept without torch.no_grad() (256 KiB of activations a step)
    "run_state_deep_list": (
        "class History:\n"
        "    def __init__(self):\n"
        "        self.records = []  # one plain dict per step\n"
        "        self.tensors = {'val': {'outputs': []}}\n"
        "class RunState:\n"
        "    def __init__(self):\n"
        "        self.config = {'lr': 1e-3, 'batch_size': 32, 'seed': 0}\n"
        "        self.history = History()\n"
        "run = RunState()\n"
        "run.history.records.extend({'step': i, 'loss': 1 / (i + 1), 'lr': 1e-3, 'phase': 'train'} for i in range(40_000))\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); val_x = torch.randn(128, 64)\n"
        "for step in range(120):\n"
        "    loss = train_step(model, opt, torch.randn(32, 64))\n"
        "    run.history.records.append({'step': 40_000 + step, 'loss': loss.item(), 'lr': 1e-3, 'phase': 'train'})\n"
        "    run.history.tensors['val']['outputs'].append(model(val_x))  # no torch.no_grad()\n",
        "per-iteration",
    ),
}

#: name -> cell body
HOLDER_CLEAN = {
    # Lightning, with validation; the losses logged through self.log
    "lightning_clean": (
        "class LitRegressor(L.LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.net = mlp()\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        (x,) = batch\n"
        "        loss = self.net(x).square().mean()\n"
        "        self.log('train_loss', loss)\n"
        "        return loss\n"
        "    def validation_step(self, batch, batch_idx):\n"
        "        (x,) = batch\n"
        "        self.log('val_loss', self.net(x).square().mean())\n"
        "    def configure_optimizers(self):\n"
        "        return torch.optim.SGD(self.parameters(), lr=1e-3)\n"
        "model = LitRegressor()\n"
        "train = DataLoader(TensorDataset(torch.randn(640, 64)), batch_size=32)\n"
        "val = DataLoader(TensorDataset(torch.randn(1024, 64)), batch_size=256)\n"
        "make_trainer(max_epochs=5).fit(model, train, val)\n"
    ),
    # transformers: the loss logged as a Python float (the last step's outputs stay in `outputs`)
    "hf_loss_item": (
        "model = tiny_gpt2(); opt = torch.optim.AdamW(model.parameters(), lr=1e-3); losses = []\n"
        "for step in range(60):\n"
        "    input_ids = torch.randint(0, 100, (16, 64))\n"
        "    outputs = model(input_ids, labels=input_ids)\n"
        "    opt.zero_grad(); outputs.loss.backward(); opt.step()\n"
        "    losses.append(outputs.loss.item())\n"
    ),
    # torchmetrics: an epoch's predictions and error collected, computed and reset at every epoch's end
    "torchmetrics_compute_reset_per_epoch": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "train = DataLoader(TensorDataset(torch.randn(640, 64), torch.randn(640, 1)), batch_size=32)\n"
        "epoch_features = torchmetrics.CatMetric(); mse = torchmetrics.MeanSquaredError(); history = []\n"
        "for epoch in range(5):\n"
        "    for x, y in train:\n"
        "        hidden = model[:2](x); pred = model[2](hidden)\n"
        "        loss = (pred - y).square().mean()\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n"
        "        mse.update(pred.detach(), y); epoch_features.update(hidden.detach())\n"
        "    history.append((mse.compute().item(), epoch_features.compute().std().item()))\n"
        "    mse.reset(); epoch_features.reset()\n"
    ),
    # Accelerate: the loss and the gathered outputs' statistic kept as Python floats
    "accelerate_clean": (
        "accelerator = Accelerator(cpu=True)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "loader = DataLoader(TensorDataset(torch.randn(6400, 64)), batch_size=128)\n"
        "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
        "losses, output_means = [], []\n"
        "for epoch in range(2):\n"
        "    for (x,) in loader:\n"
        "        out = model(x)\n"
        "        loss = out.square().mean()\n"
        "        opt.zero_grad(); accelerator.backward(loss); opt.step()\n"
        "        losses.append(loss.item())\n"
        "        output_means.append(accelerator.gather_for_metrics(out.detach()).mean().item())\n"
    ),
    # 2 persistent DataLoader workers, kept alive across 3 epochs
    "dataloader_persistent_workers": (
        "loader = DataLoader(TensorDataset(torch.randn(4096, 64)), batch_size=64, shuffle=True, num_workers=2,\n"
        "                    persistent_workers=True)\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for epoch in range(3):\n"
        "    for (x,) in loader:\n"
        "        train_step(model, opt, x)\n"
    ),
    # a window of detached activations (3 MiB when full) cleared every 25 steps
    "detached_window_cleared_every_25_steps": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); window = []; spreads = []\n"
        "for step in range(200):\n"
        "    hidden = model[:2](torch.randn(64, 64))\n"
        "    loss = model[2](hidden).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    window.append(hidden.detach())\n"
        "    if step % 25 == 24:\n"
        "        spreads.append(torch.cat(window).std(0).mean().item())\n"
        "        window.clear()\n"
    ),
    # 2 DataLoader workers over a numpy array (one object: nothing for them to copy), 2 epochs
    "dataloader_numpy_array_two_workers": (
        "import numpy as np\n"
        "class ArrayDataset(torch.utils.data.Dataset):\n"
        "    def __init__(self, array):\n"
        "        self.array = array\n"
        "    def __len__(self):\n"
        "        return len(self.array)\n"
        "    def __getitem__(self, i):\n"
        "        return torch.from_numpy(self.array[i])\n"
        "features = np.random.default_rng(0).standard_normal((20_000, 64), dtype=np.float32)\n"
        "loader = DataLoader(ArrayDataset(features), batch_size=128, shuffle=True, num_workers=2)\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "for epoch in range(2):\n"
        "    for x in loader:\n"
        "        train_step(model, opt, x)\n"
    ),
}

#: leak -> (the name the report must name first among its suspects, the place that holds the tensors: the
#: suspect's path is that place or one inside it)
HOLDERS = {
    "lightning_val_outputs_on_module": ("model", "model.val_outputs"),
    "lightning_train_outputs_with_graphs": ("model", "model.train_outputs"),
    "hf_logits_kept": ("kept_logits", "kept_logits"),
    "hf_model_outputs_kept": ("step_outputs", "step_outputs"),
    "torchmetrics_cat_metric_never_reset": ("all_embeddings", "all_embeddings.value"),
    "accelerate_outputs_kept": ("all_outputs", "all_outputs"),
    "registered_buffer_grows": ("model", "model.seen"),
    "class_attribute_store_shared": ("Tap", "Tap.store"),
    "run_state_deep_list": ("run", "run.history.tensors['val']['outputs']"),
}

#: loop -> the framework it trains with, from its name's prefix (its FRAMEWORK_SETUP runs first; None: plain PyTorch)
_PREFIXES = {"lightning_": "lightning", "hf_": "transformers", "torchmetrics_": "torchmetrics", "accelerate_": "accelerate"}
FRAMEWORKS = {
    name: next((framework for prefix, framework in _PREFIXES.items() if name.startswith(prefix)), None)
    for name in (*HOLDER_LEAKS, *HOLDER_CLEAN)
}

#: growth that stops, and growth that starts late or pauses: name -> (cell body, verdict, the holder it names:
#: first among the suspects for a leak; as the cache that filled, in the advice, for a clean loop)
#: the step where the curves must say a growth shape's leak began (where its steps are sampled densely)
GROWTH_BEGINS_AT = {"leak_starts_late_in_20ms_steps": 180}

GROWTH_SHAPES = {
    # a per-sample memo (16 KiB a sample, 31 MiB in all) filled during the first of four epochs, then reused
    "per_sample_memo_filled_in_first_epoch": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "data = torch.randn(2000, 64); projection = torch.randn(64, 4096)\n"
        "memo = {}\n"
        "def features(i):\n"
        "    if i not in memo:\n"
        "        memo[i] = torch.tanh(data[i:i + 1] @ projection)  # made once per sample\n"
        "    return memo[i]\n"
        "for epoch in range(4):\n"
        "    for b in range(0, 2000, 20):\n"
        "        train_step(model, opt, torch.cat([features(i) for i in range(b, b + 20)])[:, :64])\n",
        "clean", "memo",
    ),
    # validation outputs kept with their graphs, only from step 180 of 300 on
    "leak_starts_late": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); kept = []\n"
        "for step in range(300):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    if step >= 180:\n"
        "        kept.append(model(torch.randn(128, 64)))\n",
        "leak", "kept",
    ),
    # the same, in steps of 20 ms (a real model's): sampled densely enough for the curves to show the ramp
    "leak_starts_late_in_20ms_steps": (
        "import time\n"
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); kept = []\n"
        "for step in range(300):\n"
        "    train_step(model, opt, torch.randn(32, 64)); time.sleep(0.02)\n"
        "    if step >= 180:\n"
        "        kept.append(model(torch.randn(128, 64)))\n",
        "leak", "kept",
    ),
    # the same leak for 80 steps, a pause of 120, and again for 80
    "leak_pauses_between_ramps": (
        "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); kept = []\n"
        "for step in range(280):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    if step < 80 or step >= 200:\n"
        "        kept.append(model(torch.randn(128, 64)))\n",
        "leak", "kept",
    ),
}
