"""`memcheck(obj)`: what one object keeps alive, for scripts and tests (the magic's engine too)."""

from __future__ import annotations

from typing import Any

from .leaks import memcheck_result
from .results import MemcheckResult
from .scan import Budget, Root, scan_roots


def memcheck(obj: Any, *, name: str = "obj", sources: list[str] | None = None, budget: Budget | None = None) -> MemcheckResult:
    """Every tensor `obj` reaches, the autograd graphs they keep alive, and what deleting it frees.

    Args:
        obj: anything; it is inspected without running its code (no properties, no __getattr__).
        name: how paths start in the result (`name[3].weight`).
        sources: code to look for the line a fix applies to (e.g. recent notebook cells).
        budget: scan limits (time, objects, depth, graph nodes); results say when one was hit.
    """
    result = scan_roots([Root(name, "user", name, obj)], budget)
    return memcheck_result(name, result, sources or [])
