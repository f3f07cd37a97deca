"""The layers, read from the imports and the folders: each folder of the package is a floor (the public
modules at its top stand with the front ends), a module imports only its own floor and the floors below it,
no import circle anywhere (type-checking imports included), and the pure floors (the data model, analysis,
renderers, report assembly) import only each other and the standard library, so each of their modules
loads alone with no torch, IPython, psutil or widgets."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import torchmem_magic

PACKAGE = Path(torchmem_magic.__file__).parent

#: the floors from the bottom up, each the folders on it ("": the modules at the package's top)
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the data model", ("core",)),
    ("analysis", ("analysis",)),
    ("renderers", ("render",)),
    ("report assembly", ("report",)),
    ("leak finder", ("finder",)),
    ("probes", ("probes",)),
    ("tracing", ("tracing",)),
    ("the stream", ("stream",)),
    ("ranks", ("ranks",)),
    ("flight record", ("flight",)),
    ("session", ("session",)),
    ("widgets", ("widgets",)),
    ("front ends", ("frontends", "agent", "integrations", "")),
)
#: decide and format, never measure: the standard library only
PURE_FLOORS = ("the data model", "analysis", "renderers", "report assembly")
#: modules above the pure floors that are pure all the same, and must stay so: the leak finder's scan, its
#: suspects and memcheck (they read torch objects only when handed them), where a notebook keeps its names,
#: the stream's wire format and its reader, the ranks' job records, where flight records live, which thread
#: sends the live figure's updates, and tracebacks IPython can show (a name ending in "." is every module under it)
PURE_ELSEWHERE = (
    "finder.scan", "finder.scan.", "finder.notebook", "finder.suspects", "finder.check", "stream.protocol", "stream.feed",
    "ranks.job",
    "flight.place", "widgets.live_route", "session.tracebacks",
)
#: the public surface at the package's top, and little else
MAX_TOP_LEVEL_MODULES = 12
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


def folder_of(name: str) -> str:
    """The package folder a module lies in ("" for the modules at the top and the package itself)."""
    first = name.split(".")[0]
    return first if name and (PACKAGE / first).is_dir() else ""


def layer_of(name: str) -> int:
    """The index in FLOORS of the floor that holds `name`."""
    return next(index for index, (_, folders) in enumerate(FLOORS) if folder_of(name) in folders)


def _pure_elsewhere(name: str) -> bool:
    return any(name == entry or (entry.endswith(".") and name.startswith(entry)) for entry in PURE_ELSEWHERE)


PURE = tuple(name for name in _modules() if FLOORS[layer_of(name)][0] in PURE_FLOORS or _pure_elsewhere(name))


def test_every_module_named_pure_elsewhere_exists() -> None:
    modules = set(_modules())
    stale = [e for e in PURE_ELSEWHERE if not (e in modules or (e.endswith(".") and any(m.startswith(e) for m in modules)))]
    assert stale == []


def test_every_folder_is_on_one_floor() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    placed = [folder for _, on_floor in FLOORS for folder in on_floor if folder]
    assert sorted(placed) == sorted(folders)


def test_the_top_level_is_the_public_surface() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_each_folder_says_what_lives_there() -> None:
    """Each folder's `__init__` docstring names what it holds (and the floors say what it may import)."""
    silent = [p.parent.name for p in PACKAGE.glob("*/__init__.py") if not ast.get_docstring(ast.parse(p.read_text()))]
    assert silent == []


def test_imports_point_down_the_layers() -> None:
    """An import of a module of a higher layer fails here, naming both ends and their layers."""
    upward = []
    for name, path in _modules().items():
        for target in sorted(_imports(name, path)[0]):
            if layer_of(target) > layer_of(name):
                upward.append(
                    f"{name or '__init__'} ({FLOORS[layer_of(name)][0]}) -> {target} ({FLOORS[layer_of(target)][0]})"
                )
    assert upward == []


def test_the_ranks_and_the_flight_record_import_nothing_of_each_other() -> None:
    """Both ride the stream (stream/); neither is the other's part."""
    crossing = [
        f"{name} -> {target}" for name, path in _modules().items() for target in _imports(name, path)[0]
        if {folder_of(name), folder_of(target)} == {"ranks", "flight"}
    ]
    assert crossing == []


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
