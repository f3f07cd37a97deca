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
        "import sys, json, threading, torchmem_magic, torchmem_magic.verdict, torchmem_magic.model;"
        "print(json.dumps([m for m in ('torch','IPython','ipywidgets','bqplot') if m in sys.modules]"
        " + [threading.active_count()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [1]  # no heavy module imported, no thread started


def test_core_layers_import_no_torch() -> None:
    code = (
        "import sys, torchmem_magic.timeline, torchmem_magic.verdict, torchmem_magic.model, "
        "torchmem_magic.render.text; print('torch' in sys.modules, 'IPython' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def _package_imports(module: str) -> set[str]:
    """The torchmem_magic modules `module` imports anywhere in its file, TYPE_CHECKING blocks included."""
    path = Path(torchmem_magic.__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(module.split(".")[: -node.level]) if node.level else ""
            target = ".".join(part for part in (base, node.module) if part)
            found |= {target} if node.module else {f"{target}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("torchmem_magic")}


def test_results_render_and_model_import_one_way() -> None:
    """results → render.text → model, with no edge back (not even for type checkers)."""
    assert _package_imports("torchmem_magic.model") == set()
    assert _package_imports("torchmem_magic.render.text") == {"torchmem_magic.model", "torchmem_magic.units"}
    assert _package_imports("torchmem_magic.results") == {"torchmem_magic.model", "torchmem_magic.render.text"}
