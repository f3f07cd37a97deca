"""The results users hold: a run's Report and a MemcheckResult, each printing as the text report and
displaying as the HTML one (stdlib only).

The data and its `to_dict()` live in `model.py`; the forms people read live in `render/text.py`.
This module joins the two, so the dependencies point one way: results → render.text → model.
"""

from __future__ import annotations

from typing import Any

from .model import MemcheckData, ReportData
from .render.text import memcheck_html, memcheck_text, report_html, report_text


class Report(ReportData):
    """What one `%%memwatch` cell (or `with memwatch():` block) measured; `print()` shows the table."""

    def __str__(self) -> str:
        return report_text(self)

    def __repr__(self) -> str:
        return report_text(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's terminal display: the text report, not the dataclass fields."""
        printer.text(report_text(self))

    def _repr_html_(self) -> str:
        return report_html(self)


class MemcheckResult(MemcheckData):
    """What `%memcheck EXPR` / `memcheck(obj)` found; `print()` shows the grouped findings."""

    def __str__(self) -> str:
        return memcheck_text(self)

    def __repr__(self) -> str:
        return memcheck_text(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's terminal display: the text form, not the dataclass fields."""
        printer.text(memcheck_text(self))

    def _repr_html_(self) -> str:
        return memcheck_html(self)
