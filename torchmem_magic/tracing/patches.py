"""What the hooks change in torch (an attribute replaced by a wrapper, and put back), and what they find a
torch without: one stderr line per missing internal, once per process."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class MissingInternal:
    """A torch internal a hook needs that this torch does not have, and what goes uncounted without it."""

    name: str  # e.g. "torch.autograd._engine_run_backward"
    uncounted: str  # e.g. "backward passes"


_announced: set[str] = set()  # the internals already said missing in this process


def announce_missing(missing: list[MissingInternal]) -> None:
    """One stderr line naming the internals not seen before in this process and what they cost."""
    new = [m for m in missing if m.name not in _announced]
    if not new:
        return
    _announced.update(m.name for m in new)
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", "?")
    names = ", ".join(m.name for m in new)
    uncounted = ", ".join(dict.fromkeys(m.uncounted for m in new))
    print(
        f"torchmem_magic: this torch ({version}) has no {names}: {uncounted} are not counted; "
        "the other step clocks and every memory curve still work",
        file=sys.stderr,
    )
