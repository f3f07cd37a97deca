"""Each teaching notebook is exactly what its jupytext source makes: the two cannot drift apart.

No kernel here: these read files only.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def _load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "tools" / "build_notebooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


builder = _load_builder()
SOURCES = builder.sources(NOTEBOOKS)


def test_every_notebook_has_its_source_and_every_source_its_notebook() -> None:
    assert [p.name[:2] for p in SOURCES] == ["01", "02", "03", "04", "05", "06", "07", "08"], SOURCES
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == [p.stem for p in SOURCES]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_the_committed_notebook_is_what_its_source_makes(source: Path) -> None:
    notebook = source.with_suffix(".ipynb")
    assert builder.differences(source, notebook) == [], f"run `make notebooks` to rewrite {notebook.name}"
    committed = nbformat.read(notebook, as_version=4)
    built = builder.build(source)
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in built.cells]
    assert all(c.outputs == [] and c.execution_count is None for c in committed.cells if c.cell_type == "code")
    assert committed.metadata.kernelspec == {"display_name": "Python 3", "language": "python", "name": "python3"}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_magics_stay_magics_in_the_source_and_the_notebook(source: Path) -> None:
    magic_lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.startswith("%")]
    assert any(line.startswith("%load_ext torchmem_magic") for line in magic_lines), source.name
    code = [c.source for c in builder.build(source).cells if c.cell_type == "code"]
    cell_magics = [line for line in magic_lines if line.startswith("%%")]
    assert cell_magics == [c.splitlines()[0] for c in code if c.startswith("%%")], "each cell magic opens its cell"
    assert not any(line.lstrip().startswith(("# %memwatch", "# %%memwatch", "# %load_ext", "# %memcheck"))
                   for c in code for line in c.splitlines()), "a magic was commented out"


def test_the_quickstart_opens_with_its_two_watched_cells() -> None:
    cells = nbformat.read(NOTEBOOKS / "01_memwatch_quickstart.ipynb", as_version=4).cells
    assert len([c for c in cells if c.cell_type == "code" and c.source.startswith("%%memwatch")]) == 2


def test_the_check_finds_an_edit_on_either_side(tmp_path: Path) -> None:
    source = tmp_path / "01_memwatch_quickstart.py"
    notebook = source.with_suffix(".ipynb")
    shutil.copy(NOTEBOOKS / source.name, source)
    shutil.copy(NOTEBOOKS / notebook.name, notebook)
    assert builder.differences(source, notebook) == []

    # the source edited, the notebook not rebuilt
    original = source.read_text(encoding="utf-8")
    assert original.count("for epoch in range(6):") == 2
    source.write_text(original.replace("for epoch in range(6):", "for epoch in range(7):", 1), encoding="utf-8")
    found = builder.differences(source, notebook)
    assert len(found) == 1 and found[0].startswith("cell 4 (code) differs from the source at its line 4"), found
    source.write_text(original.replace("# %% [markdown]\n# ## A clean loop", "# %%\n# ## A clean loop"), encoding="utf-8")
    assert any("cell 3 is markdown, the source makes code" in f for f in builder.differences(source, notebook))
    source.write_text(original, encoding="utf-8")

    # the notebook edited: a markdown cell's text, outputs and an execution count saved, a cell id
    saved = notebook.read_text(encoding="utf-8")
    nb = json.loads(saved)
    nb["cells"][0]["source"][0] = "# Watching memory\n"
    notebook.write_text(json.dumps(nb), encoding="utf-8")
    assert builder.differences(source, notebook) == ["cell 0 (markdown) differs from the source at its line 1"]
    nb = json.loads(saved)
    nb["cells"][1]["execution_count"] = 1
    nb["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}]
    notebook.write_text(json.dumps(nb), encoding="utf-8")
    assert builder.differences(source, notebook) == ["cell 1 has outputs", "cell 1 has an execution count"]
    nb = json.loads(saved)
    nb["cells"][2]["id"] = "edited"
    notebook.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    assert builder.differences(source, notebook) == [
        "same cells, but the file is not as written from the source (cell ids or layout)"
    ]
