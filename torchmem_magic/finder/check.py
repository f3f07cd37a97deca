"""What objects keep alive, as `memcheck(obj)` and `%memcheck` report it: one scan, one result."""

from __future__ import annotations

from typing import Any

from ..render.results import MemcheckResult
from .scan.results import Budget, Root
from .scan.scanner import scan_roots
from .suspects import memcheck_result


def check_roots(
    expr: str, roots: list[Root], sources: list[str], *, namespace: bool, budget: Budget | None = None
) -> MemcheckResult:
    """Scan `roots` and judge what they keep alive: the engine of `memcheck()` and `%memcheck`.

    Args:
        expr: what was checked, as the user wrote it ("" for the whole namespace).
        roots: where the scan starts (one object, or every place a notebook keeps references).
        sources: code to look for the line a fix applies to (e.g. recent notebook cells).
        namespace: the roots are a whole namespace: list its suspect holders, not one object's figures.
        budget: scan limits (time, objects, depth, graph nodes); results say when one was hit.
    """
    return memcheck_result(expr, scan_roots(roots, budget), sources, namespace=namespace)


def memcheck(obj: Any, *, name: str = "obj", sources: list[str] | None = None, budget: Budget | None = None) -> MemcheckResult:
    """Every tensor `obj` reaches, the autograd graphs they keep alive, and what deleting it frees.

    Args:
        obj: anything; it is inspected without running its code (no properties, no __getattr__).
        name: how paths start in the result (`name[3].weight`).
        sources: code to look for the line a fix applies to (e.g. recent notebook cells).
        budget: scan limits (time, objects, depth, graph nodes); results say when one was hit.
    """
    return check_roots(name, [Root(name, "user", name, obj)], sources or [], namespace=False, budget=budget)
