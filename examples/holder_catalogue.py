"""Leaks and lookalikes written from the classes of holders a leak finder misses, not from its own tests.

Each loop is code an ML engineer writes, with the bug looking natural: a holder reached from several roots
(the model and its optimizer), a class attribute filled through an instance, a cached function, a
standard-library registry (logging, `atexit`, `copyreg`), tensors inside numpy and pandas object containers,
autograd graphs kept by small tensors, tensors kept from DataLoader workers, a metric's state, and as many
clean loops that look like leaks (bounded caches, a one-off resize, a warm-up). Each runs as one cell after
`leaky_loops.SETUP` and its own setup cell, and keeps about 256 KiB a step where it leaks.

The ground truth is measured, not assumed: `release` is what a user runs to give the memory back (deleting or
clearing the holder), and the heap in use must fall by most of what the run grew when it runs
(`tests/kernel/test_holder_catalogue.py`; its pass counts over three runs are in docs/leak-finder.md).
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1 << 10
#: what a leaking loop of this catalogue keeps a step (a 128 x 512 float32 activation)
KEPT_PER_STEP_BYTES = 256 * KIB
STEPS = 150


@dataclass(frozen=True)
class Loop:
    """One catalogue loop: where its memory is held, and how a user would find it out."""

    holder_class: str  # the class of holder it stands for (the catalogue table's first column)
    setup: str  # a cell run before the watched one: definitions, data, a registry's handler
    body: str  # the watched cell
    verdict: str  # "leak" or "clean"
    holder: str | None = None  # the name the report gives the holder (first among its suspects)
    path: str | None = None  # how the holder's path starts
    release: str | None = None  # what a user runs to give the memory back (the ground truth)
    #: where no holder can be named (a registry in C, which no search can walk): what the advice must say
    said: str | None = None


_MODEL = "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
_LOOP = f"for step in range({STEPS}):\n    train_step(model, opt, torch.randn(32, 64))\n"
_FEATURES = "    features = model[:2](torch.randn(128, 64)).detach()\n"
#: a forward that fails as a too-large batch would, with a 256 KiB local in its frame; and the loop's catch
_FAILING_FORWARD = (
    "def forward_or_fail(model, x, step):\n"
    "    hidden = model[:2](x).detach()\n"
    "    raise RuntimeError(f'out of memory at step {step}')\n"
)
_CATCH = (
    "    try:\n"
    "        forward_or_fail(model, torch.randn(128, 64), step)\n"
    "    except RuntimeError as exc:\n"
)
#: a dataset the DataLoader workers send as 150 batches of 256 KiB
_WORKER_DATA = "data = torch.utils.data.TensorDataset(torch.randn(4800, 2048))\n"

LEAKS: dict[str, Loop] = {
    "task_heads_in_module_and_optimizer": Loop(
        "several roots: the module owns what the optimizer refers to",
        "class MultiTask(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.body = mlp(); self.heads = torch.nn.ModuleList()\n"
        "    def forward(self, x):\n"
        "        return self.body(x)\n",
        "model = MultiTask(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n" + _LOOP
        + "    head = torch.nn.Linear(512, 128)  # a head per incoming task; old tasks are never pruned\n"
        "    model.heads.append(head); opt.add_param_group({'params': head.parameters()})\n",
        "leak", "model", "model.heads", "del model, opt, head",
    ),
    "class_level_default_dict": Loop(
        "class attribute filled through an instance",
        "class EmbeddingStore:\n"
        "    by_step = {}  # meant as a per-run default, but a class attribute is shared and never freed\n"
        "    def add(self, step, emb):\n"
        "        self.by_step[step] = emb\n",
        _MODEL + "store = EmbeddingStore()\n" + _LOOP + _FEATURES + "    store.add(step, features)\n",
        "leak", "EmbeddingStore", "EmbeddingStore.by_step", "EmbeddingStore.by_step.clear()",
    ),
    "cached_preprocessing_on_batch_ids": Loop(
        "cached function",
        "import functools\n"
        "@functools.cache\n"
        "def augmented(batch_id):\n"
        "    return torch.randn(128, 512)  # an augmented view per batch id: every id is new\n",
        _MODEL + _LOOP + "    x = augmented(step)\n",
        "leak", "augmented", "augmented", "augmented.cache_clear()",
    ),
    "cache_keyed_by_tensor_arguments": Loop(
        "cached function keyed by tensors",
        "import functools\n"
        "@functools.lru_cache(maxsize=None)\n"
        "def normalised(step, t):\n"
        "    return t / (t.norm() + 1)  # the cache keeps the result and, in its key, the argument\n",
        _MODEL + _LOOP + _FEATURES + "    x = normalised(step, features)\n",
        "leak", "normalised", "normalised (functools.lru_cache)", "normalised.cache_clear()",
    ),
    "memory_handler_buffers_loss_records": Loop(
        "standard-library registry: logging",
        "import logging, logging.handlers\n"
        "log = logging.getLogger('train')\n"
        "log.addHandler(logging.handlers.MemoryHandler(capacity=10**9, flushLevel=logging.CRITICAL))\n"
        "log.setLevel(logging.DEBUG); log.propagate = False\n",
        _MODEL + _LOOP + _FEATURES + "    log.debug('step %d features %s', step, features)  # the record keeps its args\n",
        "leak", "log", "log.handlers[0].buffer[", "log.handlers[0].buffer.clear()",
    ),
    "atexit_saves_each_checkpoint": Loop(
        "standard-library registry: atexit",
        "import atexit\n"
        "def save_at_exit(state):\n"
        "    pass  # would torch.save(state, ...) when the process ends\n",
        _MODEL + _LOOP + _FEATURES + "    atexit.register(save_at_exit, {'step': step, 'features': features})\n",
        "leak", None, None, "atexit._clear()", said="; atexit gained ",
    ),
    "numpy_object_array_of_outputs": Loop(
        "numpy object array",
        "import numpy as np\n",
        _MODEL + f"outputs = np.empty({STEPS}, dtype=object)\n" + _LOOP + _FEATURES + "    outputs[step] = features\n",
        "leak", "outputs", "outputs", "outputs[:] = None",
    ),
    "pandas_object_column_of_embeddings": Loop(
        "pandas object column",
        "import pandas as pd\n",
        _MODEL + "rows = []\n" + _LOOP + _FEATURES
        + "    rows.append({'step': step, 'emb': features})\n"
        "    if step % 50 == 49:\n"
        "        table = pd.DataFrame(rows)  # the embeddings end up in an object column\n"
        "rows.clear()\n",
        "leak", "table", "table", "del table",
    ),
    "best_losses_heap_with_graphs": Loop(
        "autograd graphs kept by small tensors",
        "import heapq\n",
        _MODEL + "best = []\n"
        f"for step in range({STEPS}):\n"
        "    out = model(torch.randn(128, 64))\n"
        "    loss = out.square().mean()\n"
        "    opt.zero_grad(); loss.backward(retain_graph=True); opt.step()\n"
        "    heapq.heappush(best, (loss, step))  # a 0-dim loss: its graph keeps the activations\n",
        "leak", "best", "best", "best.clear()",
    ),
    "oom_errors_kept_with_tracebacks": Loop(
        "frames kept by exceptions",
        _FAILING_FORWARD,
        _MODEL + "errors = []\n" + _LOOP + _CATCH
        + "        errors.append(exc)  # kept for the summary: the traceback keeps each frame's locals\n",
        "leak", "errors", "errors", "errors.clear()",
    ),
    "prototypes_by_label": Loop(
        "nested container",
        "from collections import defaultdict\n",
        _MODEL + "by_label = defaultdict(list)\n" + _LOOP + _FEATURES + "    by_label[step % 10].append(features)\n",
        "leak", "by_label", "by_label[", "by_label.clear()",
    ),
    "plot_callbacks_capture_embeddings": Loop(
        "closures",
        "",
        _MODEL + "to_plot = []\n" + _LOOP + _FEATURES + "    to_plot.append(lambda f=features: f.mean(0))  # drawn at the end\n",
        "leak", "to_plot", "to_plot", "to_plot.clear()",
    ),
    "pre_hook_registered_inside_the_loop": Loop(
        "framework state: module hooks",
        "",
        _MODEL + _LOOP + _FEATURES
        + "    model.register_forward_pre_hook(lambda m, args, kept=features: None)  # meant to be registered once\n",
        "leak", "model", "model", "model._forward_pre_hooks.clear()",
    ),
    "auroc_without_thresholds": Loop(
        "framework state: a metric",
        "import torchmetrics\n",
        _MODEL + "auroc = torchmetrics.classification.BinaryAUROC()  # thresholds=None keeps every prediction\n"
        + _LOOP + "    auroc.update(torch.rand(65536), torch.randint(0, 2, (65536,)))\n",
        "leak", "auroc", "auroc", "auroc.reset()",
    ),
    "worker_batches_kept": Loop(
        "tensors from DataLoader workers",
        _WORKER_DATA,
        _MODEL + "loader = DataLoader(data, batch_size=32, num_workers=2)\nseen = []\n"
        "for (batch,) in loader:\n"
        "    train_step(model, opt, batch[:, :64])\n"
        "    seen.append(batch)  # each batch came from a worker\n",
        "leak", "seen", "seen", "seen.clear()",
    ),
    "growing_set_of_hard_examples": Loop(
        "set",
        "",
        _MODEL + "hard = set()\n" + _LOOP + _FEATURES + "    hard.add(features)  # tensors hash by identity: never deduplicated\n",
        "leak", "hard", "hard", "hard.clear()",
    ),
}

CLEAN: dict[str, Loop] = {
    "copyreg_reducer_closure": Loop(
        "a registry entry replaced each step",
        "import copyreg\n"
        "class Sample:\n"
        "    pass\n",
        _MODEL + _LOOP + _FEATURES
        + "    copyreg.pickle(Sample, lambda s, kept=features: (Sample, ()))  # re-registered, each keeping features\n",
        "clean",  # one reducer per class: each registration replaces the last
    ),
    "bounded_memory_handler": Loop(
        "bounded logging buffer",
        "import logging, logging.handlers\n"
        "blog = logging.getLogger('bounded')\n"
        "blog.addHandler(logging.handlers.MemoryHandler(capacity=20, target=logging.NullHandler()))\n"
        "blog.setLevel(logging.DEBUG); blog.propagate = False\n",
        _MODEL + _LOOP + _FEATURES + "    blog.debug('step %d features %s', step, features)\n",
        "clean",
    ),
    "object_ring_buffer": Loop(
        "numpy object ring buffer",
        "import numpy as np\n",
        _MODEL + "recent = np.empty(16, dtype=object)\n" + _LOOP + _FEATURES + "    recent[step % 16] = features\n",
        "clean",
    ),
    "model_widened_once": Loop(
        "one-off resize",
        "",
        _MODEL + "import time\n"
        "for step in range(600):\n"
        "    train_step(model, opt, torch.randn(32, 64))\n"
        "    if step == 100:  # the head is replaced by a wider one once\n"
        "        model[2] = torch.nn.Linear(512, 16384); opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n",
        "clean",
    ),
    "prototype_sums_by_label": Loop(
        "bounded by the labels",
        "",
        _MODEL + "sums = {}\n" + _LOOP + _FEATURES
        + "    sums[step % 10] = sums.get(step % 10, 0) + features  # one running sum per label\n",
        "clean",
    ),
    "auroc_binned": Loop(
        "a metric with fixed state",
        "import torchmetrics\n",
        _MODEL + "auroc = torchmetrics.classification.BinaryAUROC(thresholds=200)\n"
        + _LOOP + "    auroc.update(torch.rand(65536), torch.randint(0, 2, (65536,)))\n",
        "clean",
    ),
    "hook_registered_once": Loop(
        "a hook that keeps the latest only",
        "",
        _MODEL + "latest = {}\n"
        "handle = model[1].register_forward_hook(lambda m, i, o: latest.update(act=o.detach()))\n"
        + _LOOP + "    model(torch.randn(128, 64))\n"
        "handle.remove()\n",
        "clean",
    ),
    "lru_cache_bounded_on_ids": Loop(
        "bounded cache",
        "import functools\n"
        "@functools.lru_cache(maxsize=32)\n"
        "def view_of(batch_id):\n"
        "    return torch.randn(128, 512)\n",
        _MODEL + _LOOP + "    x = view_of(step)\n",
        "clean",
    ),
    "optimizer_rebuilt_each_epoch": Loop(
        "optimizer state rebuilt, old one dropped",
        "",
        _MODEL + f"for step in range({STEPS}):\n"
        "    if step % 50 == 0:  # a fresh Adam each epoch: the old one and its state are dropped\n"
        "        opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "    train_step(model, opt, torch.randn(32, 64))\n",
        "clean",
    ),
    "exceptions_kept_as_messages": Loop(
        "exceptions kept without their frames",
        _FAILING_FORWARD,
        _MODEL + "errors = []\n" + _LOOP + _CATCH
        + "        errors.append(str(exc))  # the message only: no traceback, no frames\n",
        "clean",
    ),
    "loss_floats_in_a_dataframe": Loop(
        "a growing table of numbers",
        "import pandas as pd\n",
        _MODEL + "rows = []\n" + _LOOP
        + "    rows.append({'step': step, 'loss': float(model(torch.randn(8, 64)).mean())})\n"
        "table = pd.DataFrame(rows)\n",
        "clean",
    ),
    "embeddings_averaged_into_a_buffer": Loop(
        "a running statistic kept in place",
        "",
        _MODEL + "mean_features = torch.zeros(128, 512)\n" + _LOOP + _FEATURES
        + "    mean_features.mul_(0.99).add_(features, alpha=0.01)  # in place: one buffer\n",
        "clean",
    ),
    "dataloader_batches_used_then_dropped": Loop(
        "batches from DataLoader workers, not kept",
        _WORKER_DATA,
        _MODEL + "loader = DataLoader(data, batch_size=32, num_workers=2)\n"
        "for (batch,) in loader:\n"
        "    train_step(model, opt, batch[:, :64])\n",
        "clean",
    ),
    "weakref_cache_of_features": Loop(
        "a cache of weak references",
        "import weakref\n",
        _MODEL + "cache = weakref.WeakValueDictionary()\n" + _LOOP + _FEATURES
        + "    cache[step] = features  # gone once the next step drops it\n",
        "clean",
    ),
    "checkpoint_state_dict_replaced": Loop(
        "the best checkpoint, replaced",
        "import copy\n",
        _MODEL + "best_state, best_loss = None, float('inf')\n"
        f"for step in range({STEPS}):\n"
        "    loss = train_step(model, opt, torch.randn(32, 64)).item()\n"
        "    if loss < best_loss:  # a copy of the best weights so far: one at a time\n"
        "        best_state, best_loss = copy.deepcopy(model.state_dict()), loss\n",
        "clean",
    ),
}

CATALOGUE: dict[str, Loop] = {**LEAKS, **CLEAN}
