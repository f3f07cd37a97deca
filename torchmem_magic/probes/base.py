"""The one protocol every probe follows, and the reader that keeps a failing probe out of the loop.

A reading is a partial row: column name -> value, for the probe's own columns. A value the source
cannot give now is NaN (a float column stays a float column); nothing else means "missing".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..core.model import SourceErrors

NAN = math.nan

Reading = dict[str, float]


class Probe(Protocol):
    """A memory counter readable many times a second from any thread."""

    name: str  # what a user calls it ("heap", "process tree"), used in error reports
    columns: tuple[str, ...]  # the timeline columns its readings fill

    def read(self) -> Reading: ...

    def close(self) -> None: ...


@dataclass
class ErrorCount:
    """How often one source of figures failed, and the last failure; the report lists each one."""

    source: str
    count: int = 0
    last: str = ""
    cost: str | None = None  # what its failures cost, where it is not gaps in the report's figures

    def record(self, exc: BaseException) -> None:
        self.count += 1
        self.last = f"{type(exc).__name__}: {exc}"

    def summary(self) -> SourceErrors | None:
        return SourceErrors(self.source, self.count, self.last, self.cost) if self.count else None


def merged_errors(counts: Sequence[ErrorCount]) -> tuple[SourceErrors, ...]:
    """One summary per source, however many readers counted its failures."""
    merged: dict[str, SourceErrors] = {}
    for summary in (count.summary() for count in counts):
        if summary is None:
            continue
        seen = merged.get(summary.source)
        merged[summary.source] = summary if seen is None else SourceErrors(
            summary.source, seen.count + summary.count, summary.last or seen.last, summary.cost or seen.cost
        )
    return tuple(merged.values())


class ProbeReader:
    """Reads several probes into one partial row. A probe that raises gives NaN for its columns and
    its failure is counted, so one broken source costs its curve, never the run."""

    def __init__(self, probes: Iterable[Probe]) -> None:
        self.probes = tuple(probes)
        self.errors = {probe.name: ErrorCount(f"{probe.name} probe") for probe in self.probes}
        self.reads = 0

    def read(self) -> Reading:
        self.reads += 1
        row: Reading = {}
        for probe in self.probes:
            try:
                row.update(probe.read())
            except Exception as exc:  # noqa: BLE001 - any failure of a counter is counted, not raised
                self.errors[probe.name].record(exc)
                row.update(dict.fromkeys(probe.columns, NAN))
        return row

    def close(self) -> None:
        for probe in self.probes:
            probe.close()
