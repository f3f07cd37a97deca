"""Widget models that every live figure of a kernel can share: layouts, styles and the [0, 1] scale,
whose state never changes once made.

Every widget, a layout or a style too, is a model the kernel opens a comm for and the front end builds,
and a cell pays for each one it makes. A model whose state no one changes afterwards can serve every
figure of the kernel (ipywidgets lets many widgets share one layout or style), so it is made once, by
the first figure that asks for it. Nothing here holds a user's object: only the models themselves.
"""

from __future__ import annotations

from typing import Any

import ipywidgets

#: (the model's class, its state as sorted (trait, value) pairs) -> the model made with that state
_made: dict[tuple[type, tuple[tuple[str, Any], ...]], Any] = {}


def shared(cls: type, **state: Any) -> Any:
    """The kernel's model of `cls` with `state` (hashable trait values), made at the first call.

    Callers must never change its traits: every figure shown since it was made would change with it.
    One that was closed (`Widget.close_all()`) has no comm any more, and is made again.
    """
    key = (cls, tuple(sorted(state.items())))
    model = _made.get(key)
    if model is None or getattr(model, "comm", None) is None:
        model = _made[key] = cls(**state)
    return model


def layout(**state: Any) -> ipywidgets.Layout:
    """A shared `Layout` with `state` (e.g. `width="100%"`), for widgets whose layout never changes."""
    return shared(ipywidgets.Layout, **state)
