"""An attribute of torch replaced by one of the hooks' wrappers, and put back."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

WRAPPER_MARK = "__torchmem_magic_wrapper__"


class Patch:
    """One attribute replaced by a wrapper, put back on removal. If someone wrapped our wrapper
    meanwhile, theirs stays and ours turns inert (the wrapper checks `TrainingHooks.active`)."""

    def __init__(self, owner: Any, name: str, make_wrapper: Callable[[Any], Callable[..., Any]]) -> None:
        self.owner, self.name = owner, name
        self.original = owner.__dict__[name]
        self.wrapper = functools.wraps(self.original)(make_wrapper(self.original))
        setattr(self.wrapper, WRAPPER_MARK, True)
        setattr(owner, name, self.wrapper)

    def remove(self) -> bool:
        """Whether the original is back (not when someone wrapped ours meanwhile)."""
        if self.owner.__dict__.get(self.name) is self.wrapper:
            setattr(self.owner, self.name, self.original)
            return True
        return False
