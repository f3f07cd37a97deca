"""Find the line of the user's own code that makes a holder grow, and write its fixed form.

Pure: works on source text (the cell being watched, or the notebook's recent cells). Magic lines
are blanked so the rest still parses; a source that does not parse is skipped.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceFix:
    before: str  # the statement as the user wrote it
    after: str  # the same statement, fixed


def _parse(source: str) -> ast.Module | None:
    lines = [("pass" if line.lstrip().startswith(("%", "!")) and not line.startswith((" ", "\t")) else line)
             for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _statements(sources: list[str]) -> Iterator[ast.stmt]:
    for source in sources:
        tree = _parse(source)
        if tree is not None:
            yield from (node for node in ast.walk(tree) if isinstance(node, ast.stmt))


def _matches(target: ast.expr, container: str) -> bool:
    """`history` matches `history`; `logger.hist` also matches `self.hist` (inside a method)."""
    text = ast.unparse(target)
    if text == container:
        return True
    attribute = container.rsplit(".", 1)[-1] if "." in container else None
    return attribute is not None and isinstance(target, ast.Attribute) and target.attr == attribute


def _call_method(value: ast.expr, method: str, wrapped: ast.expr) -> ast.expr:
    return ast.Call(ast.Attribute(value=wrapped, attr=method, ctx=ast.Load()), [], [])


def fix_append(container: str, method: str, sources: list[str]) -> SourceFix | None:
    """`container.append(x)` -> `container.append(x.<method>())` (method: item or detach)."""
    for stmt in _statements(sources):
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in ("append", "extend", "add", "appendleft")
            and len(call.args) == 1
            and _matches(call.func.value, container)
        ):
            before = ast.unparse(stmt)
            fixed = ast.Call(call.func, [_call_method(call.args[0], method, call.args[0])], call.keywords)
            return SourceFix(before, ast.unparse(ast.Expr(fixed)))
    return None


def fix_accumulate(name: str, sources: list[str]) -> SourceFix | None:
    """`total += loss` -> `total += loss.item()`."""
    for stmt in _statements(sources):
        if isinstance(stmt, ast.AugAssign) and ast.unparse(stmt.target) == name:
            fixed = ast.AugAssign(stmt.target, stmt.op, _call_method(stmt.value, "item", stmt.value))
            return SourceFix(ast.unparse(stmt), ast.unparse(fixed))
    return None


class _DetachName(ast.NodeTransformer):
    def __init__(self, name: str) -> None:
        self.name = name
        self.changed = False

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id == self.name and isinstance(node.ctx, ast.Load):
            self.changed = True
            return _call_method(node, "detach", ast.Name(node.id, ast.Load()))
        return node


def _assigned_names(stmt: ast.Assign) -> set[str]:
    names: set[str] = set()
    for target in stmt.targets:
        elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        names.update(ast.unparse(e) for e in elements)
    return names


def fix_carry_over(name: str, sources: list[str]) -> SourceFix | None:
    """`h = cell(x, h)` (state fed back each step) -> `h = cell(x, h.detach())`."""
    for stmt in _statements(sources):
        if isinstance(stmt, ast.Assign) and name in _assigned_names(stmt):
            transformer = _DetachName(name)
            new_value = transformer.visit(ast.parse(ast.unparse(stmt.value), mode="eval").body)
            if transformer.changed:
                targets = " = ".join(
                    ast.unparse(t)[1:-1] if isinstance(t, ast.Tuple) else ast.unparse(t) for t in stmt.targets
                )
                return SourceFix(ast.unparse(stmt), f"{targets} = {ast.unparse(new_value)}")
    return None


def function_sources(name: str, sources: list[str]) -> list[str]:
    """The source of each `def name` in `sources` (methods and nested functions too), newest first:
    a function's fix line is looked for in its own body, not wherever the same variable name appears."""
    found: list[str] = []
    for source in sources:
        tree = _parse(source)
        if tree is not None:
            found.extend(
                ast.unparse(node) for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
            )
    return found
