"""The results users hold: a run's Report and a MemcheckResult, following IPython's conventions
(stdlib only): a one-line repr like `%timeit -o`'s `<TimeitResult : …>`, the long text under
`print()` and IPython's pretty display, HTML (with the static figure) in notebooks.

The data and its `to_dict()` live in `model.py`; the forms people read live in `render/`.
This module joins the two, so the dependencies point one way: results → render → model.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..core.model import MemcheckData, ReportData
from .static import report_document, report_figure_html, sparkline_lines
from .text import memcheck_html, memcheck_oneline, memcheck_text, report_oneline, report_text


def report_long_text(report: ReportData) -> str:
    """The text report, with a sparkline of each main curve where the run's timeline is known."""
    curves = sparkline_lines(report)
    text = report_text(report)
    if not curves:
        return text
    head, _, rest = text.partition("\n")
    return "\n".join([head, *(f"  {line}" for line in curves), rest]) if rest else "\n".join([head, *curves])


def save_report(report: ReportData, path: str | os.PathLike[str]) -> None:
    """Write `report` as `.json` (`to_dict()`) or `.html` (an offline page), by the path's suffix."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix == ".json":
        text = json.dumps(report.to_dict(), indent=1) + "\n"
    elif suffix in (".html", ".htm"):
        text = report_document(report)
    else:
        raise ValueError(
            f"cannot save a report as {suffix or 'a file without a suffix'!r}: use .json or .html"
        )
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)


class Report(ReportData):
    """What one `%%memwatch` cell (or `with memwatch():` block) measured; `print()` shows the table."""

    def __str__(self) -> str:
        """The text report, the same before saving and after loading (which has no curves)."""
        return report_text(self)

    def __repr__(self) -> str:
        return report_oneline(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's terminal display: the text report with a sparkline of each curve."""
        printer.text(report_long_text(self))

    def _repr_html_(self) -> str:
        return report_figure_html(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write this report as `.json` (`to_dict()`, read back by `load_report`) or `.html` (an
        offline page: the static figure, the table, the holders); any other suffix: ValueError."""
        save_report(self, path)


class MemcheckResult(MemcheckData):
    """What `%memcheck EXPR` / `memcheck(obj)` found; `print()` shows the grouped findings."""

    def __str__(self) -> str:
        return memcheck_text(self)

    def __repr__(self) -> str:
        return memcheck_oneline(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's terminal display: the long text, not the one-line repr."""
        printer.text(memcheck_text(self))

    def _repr_html_(self) -> str:
        return memcheck_html(self)
