"""The public surface and the import-time contract (no torch, no IPython, no work at import)."""

import json
import subprocess
import sys

import torchmem_magic


def test_public_api_is_pinned() -> None:
    assert sorted(torchmem_magic.__all__) == [
        "LeakError",
        "MemcheckResult",
        "MemoryGuardError",
        "MemwatchSession",
        "Report",
        "SessionOptions",
        "assert_no_leak",
        "clear_crashes",
        "collect_garbage",
        "last_crash",
        "last_report",
        "load_ipython_extension",
        "load_report",
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
        "import sys, json, threading, torchmem_magic, torchmem_magic.analysis.verdict, torchmem_magic.core.model;"
        "print(json.dumps([m for m in ('torch','IPython','ipywidgets','bqplot','psutil') if m in sys.modules]"
        " + [threading.active_count()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [1]  # no heavy module imported, no thread started
