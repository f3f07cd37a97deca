"""What the package needs at run time and does not declare: PyTorch. Installing torchmem_magic never
installs, upgrades or replaces torch (a user's CPU, CUDA or ROCm build is theirs); without torch, the
entry points say so in one line instead of failing deep inside with a traceback."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, NoReturn

INSTALL_TORCH = "torchmem_magic needs PyTorch: install your build first (CPU, CUDA or ROCm: https://pytorch.org/get-started/locally/)"


class TorchMissingError(ImportError):
    """Raised by the script entry points (`memwatch()`, `assert_no_leak()`) where torch is not installed."""


def torch_installed() -> bool:
    """True where `import torch` can find torch (nothing is imported)."""
    if "torch" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def torch_missing(name: str) -> Any:
    """Stands in for the entry point `name` where torch is not installed: calling it raises the one line."""

    def needs_torch(*args: Any, **kwargs: Any) -> NoReturn:
        __tracebackhide__ = True
        raise TorchMissingError(f"{INSTALL_TORCH}, then run this again") from None

    needs_torch.__name__ = needs_torch.__qualname__ = name
    needs_torch.__doc__ = f"`{name}`: {INSTALL_TORCH}."
    return needs_torch
