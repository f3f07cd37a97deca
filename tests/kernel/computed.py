"""What a cell computed, to compare a watched run with a bare one: watching must not change it."""

from __future__ import annotations

from kernel_client import Kernel

#: each tensor, module and list of tensors the cell left in the namespace (a digest of their values, bitwise),
#: torch's and Python's RNG states and grad mode after it (both RNGs seeded before it)
COMPUTED = (
    "(lambda tensors: {'left': {n: [t.double().sum().item() for t in tensors(v)] for n, v in globals().items()"
    " if n not in _before and not n.startswith('_') and tensors(v)}, 'rng': torch.get_rng_state().tolist(),"
    " 'random': hash(__import__('random').getstate()),"
    " 'grad': torch.is_grad_enabled()})(lambda v: [v] if isinstance(v, torch.Tensor) else list(v.parameters())"
    " if isinstance(v, torch.nn.Module) else [t for t in v if isinstance(t, torch.Tensor)]"
    " if isinstance(v, (list, tuple)) else [])"
)


def computed(k: Kernel, body: str, magic: str = "", timeout_s: float = 180) -> dict:
    """Run `body` from seeded RNGs (under `magic`, a cell magic line, or bare) and return what it computed."""
    k.ok("_before = set(globals()); torch.manual_seed(0); __import__('random').seed(0)", store_history=False)
    k.ok((magic + "\n" if magic else "") + body, timeout_s=timeout_s)
    return k.value(COMPUTED, store_history=False)


def differences(watched: dict, bare: dict) -> list[str]:
    """What differs between a watched run's `computed` and a bare one's (empty: nothing)."""
    return [key for key in bare if bare[key] != watched.get(key)]
