"""What the hooks ask of dynamo: whether it is tracing now (a hook then returns at once: no graph break, no
guard), and whether `torch.compile` was used in this process (then no global module hook is put in: dynamo
guards on their number, and adding and removing them would recompile the user's model at each cell)."""

from __future__ import annotations

import sys
from collections.abc import Callable


def never_compiling() -> bool:
    return False


def compiling_check() -> Callable[[], bool]:
    """torch's own "is dynamo tracing now" (constant-folded by dynamo, a flag read in eager code)."""
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return check if callable(check) else never_compiling


def dynamo_has_compiled() -> bool:
    """Whether `torch.compile` was used in this process: dynamo keeps every backend it was given (the
    `None` entry is its own `disable`, made at import). Where that table is gone, assume it was."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return False
    backends = getattr(eval_frame, "cached_backends", None)
    if not isinstance(backends, dict):
        return True
    return any(backend is not None for backend in list(backends.values()))
