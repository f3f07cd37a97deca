"""The teaching notebooks run top to bottom in a real kernel and teach what they say."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _text(cell: dict) -> str:
    out = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            out.append(output["text"])
        elif "data" in output:
            out.append(output["data"].get("text/plain", ""))
    return "".join(out)


@pytest.fixture(scope="module")
def quickstart() -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / "01_memwatch_quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def test_quickstart_runs_and_shows_live_figures(quickstart: nbformat.NotebookNode) -> None:
    memwatch_cells = [c for c in quickstart.cells if c.cell_type == "code" and c.source.startswith("%%memwatch")]
    assert len(memwatch_cells) == 2
    for cell in memwatch_cells:
        kinds = [o.get("data", {}).keys() for o in cell.outputs]
        assert any("application/vnd.jupyter.widget-view+json" in k for k in kinds), "live figure displayed"
        assert any("text/html" in k for k in kinds), "report displayed"


def test_quickstart_shows_the_leak_against_the_clean_loop(quickstart: nbformat.NotebookNode) -> None:
    comparison = next(c for c in quickstart.cells if c.cell_type == "code" and "heap growth per step" in c.source)
    text = _text(comparison)
    clean_kib = float(text.split("clean ")[1].split(" KiB")[0])
    leaky_kib = float(text.split("leaky ")[1].split(" KiB")[0])
    assert leaky_kib > 20 * max(clean_kib, 1.0), text
    script = quickstart.cells[-1]
    assert "(64, 1)" in _text(script)  # 4096 / 64 steps, one epoch
    json.dumps(quickstart)  # the executed notebook stays serialisable


def test_classic_leaks_notebook_names_each_holder_and_its_fix() -> None:
    nb = nbformat.read(NOTEBOOKS / "02_classic_leaks.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    text = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert "history.append(loss.item())  # was: history.append(loss)" in text
    assert "total_loss += loss.item()  # was: total_loss += loss" in text
    assert "h = cell(torch.randn(32, 64), h.detach())" in text
    assert "Out (output-cache): 32.0 MiB retained" in text
    assert "sys.last_traceback (traceback): 32.0 MiB retained" in text
    freed = [int(_text(c)) for c in nb.cells if c.cell_type == "code" and c.source.startswith("torchmem_magic.release")]
    assert len(freed) == 2 and all(f >= 30 << 20 for f in freed)  # each fix really gave back the 32 MiB


def test_rank_that_leaks_notebook_names_rank_1_and_its_holder_then_all_ranks_clean() -> None:
    nb = nbformat.read(NOTEBOOKS / "03_the_rank_that_leaks.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    leaky_run, fixed_run = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%memwatch")]
    leaky = _text(leaky_run)
    assert "verdict: leak (worst rank: 1)" in leaky, leaky
    rank_1 = next(line for line in leaky.splitlines() if line.strip().startswith("1 "))
    assert "leak (per-iteration)" in rank_1 and rank_1.rstrip().endswith("debug_outputs"), leaky
    assert "→ rank 1: leak (per-iteration), heap +" in leaky and "debug_outputs grows +" in leaky, leaky
    assert "→ rank 0: clean" in leaky, leaky
    assert "rank 1: debug_outputs (autograd-graph)" in leaky, leaky
    assert "fix: debug_outputs.append(out.detach())  # was: debug_outputs.append(out)" in leaky, leaky
    summary = _text(nb.cells[nb.cells.index(leaky_run) + 2])
    assert "rank 0: clean  holders: -" in summary and "rank 1: leak   holders: debug_outputs" in summary, summary
    assert "worst rank: 1" in summary, summary
    fixed = _text(fixed_run)
    assert "→ ranks 0, 1: clean" in fixed and "verdict: clean" in fixed, fixed
    assert "verdicts: {0: 'clean', 1: 'clean'}" in _text(nb.cells[-1])
