"""Writes each teaching notebook notebooks/NN_name.ipynb from its source notebooks/NN_name.py.

The sources are jupytext percent-format scripts (`# %%` starts a code cell, `# %% [markdown]` a markdown
cell); their header keeps IPython magics as they are (`comment_magics: false`), so a `%%memwatch` cell of the
notebook is a `%%memwatch` line in its source. Edit the `.py`, then run `make notebooks` (or
`.venv/bin/python tools/build_notebooks.py`); `--check` writes nothing and says which notebooks differ from
their sources, and how.

The notebooks are written without outputs or execution counts, and each cell's id comes from its type and
text, so rebuilding unchanged sources rewrites identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import jupytext
import nbformat

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def sources(folder: Path = NOTEBOOKS) -> list[Path]:
    """The notebooks' sources in `folder`, in their order."""
    return sorted(folder.glob("[0-9][0-9]_*.py"))


def build(source: Path) -> nbformat.NotebookNode:
    """The notebook that `source` describes: its cells and metadata, no outputs, ids from the cells' text."""
    nb = jupytext.read(source, as_version=4, fmt="py:percent")
    # how the source is written (format, jupytext's version) is no part of the notebook
    options = nb.metadata.get("jupytext", {})
    options.pop("text_representation", None)
    if not options:
        nb.metadata.pop("jupytext", None)
    seen: dict[str, int] = {}
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        digest = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:12]
        repeat = seen.get(digest, 0)
        seen[digest] = repeat + 1
        cell.id = digest if repeat == 0 else f"{digest}-{repeat}"
    nbformat.validate(nb)
    return nb


def render(source: Path) -> str:
    """The `.ipynb` file's text for `source`."""
    text: str = jupytext.writes(build(source), fmt="ipynb")
    return text if text.endswith("\n") else text + "\n"


def differences(source: Path, target: Path) -> list[str]:
    """How the notebook file `target` differs from what `source` makes (empty: it is exactly that)."""
    if not target.exists():
        return [f"{target.name} is missing"]
    expected, text = build(source), target.read_text(encoding="utf-8")
    actual = nbformat.reads(text, as_version=4)
    found = []
    for i, cell in enumerate(actual.cells):
        if cell.get("outputs"):
            found.append(f"cell {i} has outputs")
        if cell.get("execution_count") is not None:
            found.append(f"cell {i} has an execution count")
    if len(actual.cells) != len(expected.cells):
        found.append(f"{len(actual.cells)} cells, the source makes {len(expected.cells)}")
    for i, (got, want) in enumerate(zip(actual.cells, expected.cells)):
        if got.cell_type != want.cell_type:
            found.append(f"cell {i} is {got.cell_type}, the source makes {want.cell_type}")
        elif got.source != want.source:
            first = next(
                (n for n, (a, b) in enumerate(zip(got.source.splitlines(), want.source.splitlines())) if a != b),
                min(len(got.source.splitlines()), len(want.source.splitlines())),
            )
            found.append(f"cell {i} ({got.cell_type}) differs from the source at its line {first + 1}")
        elif got.metadata != want.metadata:
            found.append(f"cell {i}'s metadata {dict(got.metadata)} != the source's {dict(want.metadata)}")
    if actual.metadata != expected.metadata:
        found.append(f"notebook metadata {dict(actual.metadata)} != the source's {dict(expected.metadata)}")
    if not found and text != render(source):
        found.append("same cells, but the file is not as written from the source (cell ids or layout)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; fail if a notebook differs from its source")
    args = parser.parse_args(argv)
    failed = False
    orphans = sorted({p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")} - {p.stem for p in sources()})
    for orphan in orphans:
        print(f"notebooks/{orphan}.ipynb has no source notebooks/{orphan}.py", file=sys.stderr)
        failed = True
    for source in sources():
        target = source.with_suffix(".ipynb")
        if args.check:
            for difference in differences(source, target):
                print(f"notebooks/{target.name}: {difference}", file=sys.stderr)
                failed = True
            continue
        text = render(source)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            print(f"wrote notebooks/{target.name}")
    if failed and args.check:
        print("run `make notebooks` to write the notebooks from their sources", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
