"""PyTorch 2 machinery as users train with it, as notebook cells: compiled models and optimizer steps,
torch.func, activation checkpointing, scripted and exported programs, autocast with a GradScaler, saved-tensor
hooks and compiled autograd.

Each loop is a pair of cells over one state: MAKE builds it (model, optimizer, compiled callables; seeded)
and returns it, STEP runs one training step on it and returns the loss as a Python float. A loop's leaking
variant keeps every step's output, with its autograd graph, in the global list `kept_outputs`; its clean
variant keeps nothing. tests/kernel/test_pytorch2_loops.py runs each both with and without memwatch and
compares what they computed.
"""

from __future__ import annotations

from dataclasses import dataclass

#: defined once in the kernel before any loop
SETUP = """\
import torch
from torch._dynamo.utils import counters as dynamo_counters
def mlp(width=512):
    return torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
def dynamo_figures():
    return {'unique_graphs': dynamo_counters['stats']['unique_graphs'],
            'graph_breaks': sum(dynamo_counters['graph_break'].values()),
            'recompiles': sum(dynamo_counters['recompiles'].values()) if 'recompiles' in dynamo_counters else 0}
kept_outputs = []
"""


@dataclass(frozen=True)
class Loop:
    """One way of training: how its state is made, one step of it, and what its step clock must say."""

    make: str  # the body of `def make():` (returns the state; torch's RNG is seeded before it)
    step: str  # the body of `def step(state, i, keep):` (returns the loss as a float; keeps outputs when keep)
    clock: str = "optimizer"  # the report's clock
    steps_per_iteration: float = 1.0  # the clock's steps per loop iteration (GradScaler skips some)
    available: str = "True"  # an expression, true where this torch has what the loop needs


#: the leak: a validation output made without torch.no_grad() kept, with the graph that holds its activations
_KEEP = "    if keep: kept_outputs.append(state['model'](torch.randn(64, 64)))\n"
_TRAIN = (
    "    x = torch.randn(64, 64)\n"
    "    out = state['model'](x)\n"
    "    loss = out.square().mean()\n"
    "    state['opt'].zero_grad(); loss.backward(); state['opt'].step()\n"
    + _KEEP
    + "    return loss.item()\n"
)


def _compiled(**options: object) -> str:
    spelled = ", ".join(f"{k}={v!r}" for k, v in options.items())
    return (
        "    model = mlp()\n"
        f"    return {{'model': torch.compile(model, {spelled}), 'opt': torch.optim.SGD(model.parameters(), lr=1e-2)}}\n"
    )


_MODEL_ONLY = "    model = mlp(); return {'model': model}\n"


def _checkpointed_by_hand(reentrant: bool) -> str:
    """A checkpointed model's step, its parameters updated by hand (no optimizer)."""
    return (
        f"    x = torch.randn(64, 64){'.requires_grad_()' if reentrant else ''}\n"
        f"    out = torch.utils.checkpoint.checkpoint(state['model'], x, use_reentrant={reentrant})\n"
        "    loss = out.square().mean()\n"
        "    loss.backward()\n"
        "    with torch.no_grad():\n"
        "        for p in state['model'].parameters():\n"
        "            p -= 1e-2 * p.grad; p.grad = None\n"
        + _KEEP
        + "    return loss.item()\n"
    )


LOOPS: dict[str, Loop] = {
    "compile_eager": Loop(_compiled(backend="eager"), _TRAIN),
    "compile_aot_eager": Loop(_compiled(backend="aot_eager"), _TRAIN),
    "compile_inductor": Loop(_compiled(), _TRAIN),
    "compile_dynamic": Loop(_compiled(backend="aot_eager", dynamic=True), _TRAIN),
    # batch sizes that change: one recompile for each new shape (dynamic=False), the same in both runs
    "compile_recompiles_over_shapes": Loop(
        _compiled(backend="eager", dynamic=False),
        _TRAIN.replace("torch.randn(64, 64)", "torch.randn((48, 56, 64)[i % 3], 64)"),
    ),
    # the optimizer step compiled (torch's "compiling the optimizer" recipe): its hook is traced, so the steps
    # are the backward passes
    "compiled_optimizer_step": Loop(
        "    model = mlp(); opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "    @torch.compile(backend='aot_eager')\n"
        "    def opt_step():\n"
        "        opt.step()\n"
        "    return {'model': model, 'opt': opt, 'opt_step': opt_step}\n",
        _TRAIN.replace("state['opt'].step()", "state['opt_step']()"),
        clock="backward",
    ),
    # torch.func: per-sample gradients by vmap(grad(functional_call)), applied by hand (no optimizer)
    "func_per_sample_grads": Loop(
        "    from torch.func import functional_call, grad, vmap\n"
        "    model = mlp()\n"
        "    params = {k: v.detach() for k, v in model.named_parameters()}\n"
        "    def sample_loss(p, x):\n"
        "        return functional_call(model, p, (x.unsqueeze(0),)).square().mean()\n"
        "    return {'model': model, 'params': params, 'grads': vmap(grad(sample_loss), in_dims=(None, 0))}\n",
        "    x = torch.randn(16, 64)\n"
        "    grads = state['grads'](state['params'], x)\n"
        "    with torch.no_grad():\n"
        "        for k, g in grads.items():\n"
        "            state['params'][k] -= 1e-2 * g.mean(0)\n"
        "    out = torch.func.functional_call(state['model'], state['params'], (torch.randn(128, 64).requires_grad_(),))\n"
        + _KEEP
        + "    return float(sum(g.square().sum() for g in grads.values()))\n",
        clock="backward",
    ),
    "checkpoint_reentrant": Loop(
        "    model = mlp(); return {'model': model, 'opt': torch.optim.SGD(model.parameters(), lr=1e-2)}\n",
        _TRAIN.replace(
            "state['model'](x)",
            "torch.utils.checkpoint.checkpoint(state['model'], x.requires_grad_(), use_reentrant=True)",
        ),
    ),
    # no optimizer: the steps are backward passes, and the checkpoint's re-run forward is none of them
    "checkpoint_non_reentrant_no_optimizer": Loop(_MODEL_ONLY, _checkpointed_by_hand(reentrant=False), clock="backward"),
    "checkpoint_reentrant_no_optimizer": Loop(_MODEL_ONLY, _checkpointed_by_hand(reentrant=True), clock="backward"),
    "jit_script": Loop(
        "    model = torch.jit.script(mlp())\n"
        "    return {'model': model, 'opt': torch.optim.SGD(model.parameters(), lr=1e-2)}\n",
        _TRAIN,
    ),
    # an exported program run eagerly, as inference: the steps are its forward calls
    "export_inference_no_optimizer": Loop(
        "    model = mlp()\n"
        "    program = torch.export.export(model, (torch.randn(64, 64),))\n"
        "    return {'model': program.module()}\n",
        "    out = state['model'](torch.randn(64, 64))\n"
        "    if keep: kept_outputs.append(out)\n"
        "    return out.sum().item()\n",
        clock="forward",
        available="hasattr(torch, 'export')",
    ),
    # autocast with a GradScaler; every 5th step's gradients are made infinite, so the scaler skips it
    "autocast_grad_scaler_skips": Loop(
        "    model = mlp()\n"
        "    return {'model': model, 'opt': torch.optim.SGD(model.parameters(), lr=1e-2),\n"
        "            'scaler': torch.amp.GradScaler('cpu', init_scale=2.0 ** 8)}\n",
        "    x = torch.randn(64, 64)\n"
        "    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "        out = state['model'](x)\n"
        "        loss = out.float().square().mean()\n"
        "    if i % 5 == 4:\n"
        "        loss = loss * float('inf')\n"
        "    state['opt'].zero_grad()\n"
        "    state['scaler'].scale(loss).backward()\n"
        "    state['scaler'].step(state['opt']); state['scaler'].update()\n"
        + _KEEP
        + "    return loss.item()\n",
        steps_per_iteration=0.8,
    ),
    # the user's own saved-tensor hooks (here: saved activations kept in half precision)
    "saved_tensors_hooks": Loop(
        "    model = mlp(); return {'model': model, 'opt': torch.optim.SGD(model.parameters(), lr=1e-2)}\n",
        _TRAIN.replace(
            "    out = state['model'](x)\n",
            "    pack = lambda t: (t.dtype, t.to(torch.float16))\n"
            "    unpack = lambda packed: packed[1].to(packed[0])\n"
            "    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):\n"
            "        out = state['model'](x)\n",
        ),
    ),
    # the backward pass traced by compiled autograd (torch._dynamo.compiled_autograd, private in this torch)
    "compiled_autograd": Loop(
        _compiled(backend="eager"),
        _TRAIN.replace(
            "loss.backward();",
            "\n    with torch._dynamo.compiled_autograd._enable(torch.compile(backend='eager')):\n"
            "        loss.backward()\n   ",
        ),
        available="hasattr(__import__('torch._dynamo.compiled_autograd')._dynamo.compiled_autograd, '_enable')",
    ),
}
