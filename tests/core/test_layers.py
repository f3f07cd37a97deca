"""The layers, read from the imports: no import circle anywhere (type-checking imports included),
and the pure modules (data, analysis, report assembly, text forms) import only each other and the
standard library, so each one loads alone with no torch, IPython, psutil or widgets."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import torchmem_magic

PACKAGE = Path(torchmem_magic.__file__).parent

#: the layers from the bottom up; a module imports only modules of its own layer or of one below
#: (a package's `__init__` stands with its modules; a name ending in "." is every module under it)
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("data", ("units", "needs", "model", "options", "resources", "step_sampling", "step_requests", "fixes")),
    ("analysis", ("timeline", "slopes", "verdict", "holders", "forensics", "scan", "scan.", "notebook", "flight.place", "live_route", "tracebacks")),
    ("forms", ("render", "render.")),
    ("results", ("results",)),
    ("assembly", ("suspects", "merge", "report", "saved", "check", "compare", "ranks.protocol", "ranks.job")),
    ("gathering", (
        "probes", "probes.", "hooks", "grad_mode", "sampler", "stack_roots", "holder_tracking", "guard", "actions",
        "ranks", "ranks.transport", "ranks.relay", "ranks.feed", "ranks.live", "ranks.settings", "flight",
        "ranks.store_client", "ranks.publisher", "ranks.remote", "ranks.launch_env",
        "flight.recorder", "flight.crashes",
    )),
    ("session", ("steps", "leak_finder", "lifecycle", "live_view", "session")),
    ("widgets", ("widgets", "widgets.")),
    ("front ends", ("api", "gate", "magics", "late_interrupts", "late_worker_deaths", "command", "watch_status", "watch_metrics", "pytest_plugin", "agent", "agent.", "__main__", "")),
)
#: the bottom of the stack, up to the report's assembly and the ranks' wire format: decides and formats,
#: never measures, and imports nothing but the standard library
PURE_LAYERS = ("data", "analysis", "forms", "results", "assembly")
HEAVY = ("torch", "IPython", "psutil", "ipywidgets", "bqplot", "numpy")


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path) -> tuple[set[str], set[str]]:
    """(package modules, outside top-level modules) that `name` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    modules = _modules()
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("torchmem_magic"):
                    inside.add(alias.name.removeprefix("torchmem_magic").lstrip("."))
                else:
                    outside.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if (node.module or "").startswith("torchmem_magic"):
                    inside.add((node.module or "").removeprefix("torchmem_magic").lstrip("."))
                else:
                    outside.add((node.module or "").split(".")[0])
                continue
            base = package.split(".") if package else []
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for alias in node.names:  # `from . import actions`: a module, not a name
                sub = f"{target}.{alias.name}" if target else alias.name
                inside.add(sub if sub in modules else target)
    inside.discard("")
    inside.discard(name)
    return inside, outside


def layer_of(name: str) -> int:
    """The index in LAYERS of the layer that holds `name` (the longest matching entry wins)."""
    best, best_len = -1, -1
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            matches = name == member or (member.endswith(".") and name.startswith(member))
            if matches and len(member) > best_len:
                best, best_len = index, len(member)
    return best


PURE = tuple(
    name for name in _modules() if layer_of(name) >= 0 and LAYERS[layer_of(name)][0] in PURE_LAYERS
)


def test_every_module_has_one_layer() -> None:
    assert [name for name in _modules() if layer_of(name) < 0] == []


def test_every_layer_entry_names_modules() -> None:
    modules = set(_modules())
    stale = [
        member for _, members in LAYERS for member in members
        if not (member in modules or (member.endswith(".") and any(m.startswith(member) for m in modules)))
    ]
    assert stale == []


def test_imports_point_down_the_layers() -> None:
    """An import of a module of a higher layer fails here, naming both ends and their layers."""
    upward = []
    for name, path in _modules().items():
        for target in sorted(_imports(name, path)[0]):
            if layer_of(target) > layer_of(name):
                upward.append(
                    f"{name or '__init__'} ({LAYERS[layer_of(name)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
                )
    assert upward == []


def test_no_import_circle() -> None:
    graph = {name: _imports(name, path)[0] for name, path in _modules().items() if name}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join([*trail[trail.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_import_only_pure_modules_and_the_standard_library(name: str) -> None:
    inside, outside = _imports(name, _modules()[name])
    assert inside <= set(PURE), f"{name} imports {sorted(inside - set(PURE))}"
    assert outside <= set(sys.stdlib_module_names) | {"__future__"}, f"{name} imports {sorted(outside)}"


@pytest.mark.parametrize("name", PURE)
def test_each_pure_module_loads_alone_without_heavy_modules(name: str) -> None:
    code = f"import sys, torchmem_magic.{name}; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_module_compiles_on_this_python() -> None:
    """The whole package, not only the pure modules, is valid syntax on each supported Python (the core venvs
    run this on 3.10, 3.12 and 3.13, where the rest cannot be imported without its dependencies)."""
    bad = []
    for name, path in _modules().items():
        try:
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
        except SyntaxError as exc:
            bad.append(f"{name or '__init__'}: {exc}")
    assert bad == []
