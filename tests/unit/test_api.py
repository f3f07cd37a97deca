"""The public surface and the import-time contract (no torch, no IPython, no work at import)."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import torchmem_magic


def test_public_api_is_pinned() -> None:
    assert sorted(torchmem_magic.__all__) == [
        "MemcheckResult",
        "MemwatchSession",
        "Report",
        "collect_garbage",
        "last_report",
        "load_ipython_extension",
        "memcheck",
        "memwatch",
        "release_last_exception",
        "release_notebook_caches",
        "release_output_cache",
        "return_heap_to_os",
        "set_sharing_strategy",
        "sharing_info",
        "unload_ipython_extension",
    ]
    for name in torchmem_magic.__all__:
        assert hasattr(torchmem_magic, name)


def test_import_loads_neither_torch_nor_ipython_nor_widgets() -> None:
    code = (
        "import sys, json, threading, torchmem_magic, torchmem_magic.analysis, torchmem_magic.model;"
        "print(json.dumps([m for m in ('torch','IPython','ipywidgets','bqplot') if m in sys.modules]"
        " + [threading.active_count()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [1]  # no heavy module imported, no thread started


def test_core_layers_import_no_torch() -> None:
    code = (
        "import sys, torchmem_magic.timeline, torchmem_magic.analysis, torchmem_magic.model, "
        "torchmem_magic.render.text; print('torch' in sys.modules, 'IPython' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {"." * node.level + (node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    return found | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}


def test_suspects_depend_on_scan_results_only_and_scan_package_imports_nothing() -> None:
    package = Path(torchmem_magic.__file__).parent
    assert {m for m in _imported_modules(package / "suspects.py") if "scan" in m} == {".scan.results"}
    assert _imported_modules(package / "scan" / "__init__.py") == set()
    assert _imported_modules(package / "scan" / "results.py") <= {"__future__", "dataclasses", "typing", "..model"}
