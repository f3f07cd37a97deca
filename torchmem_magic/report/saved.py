"""Saved reports: written as `.json` or as an offline `.html` page, read back, merged (stdlib only).

A saved `.json` is `Report.to_dict()`; reading it back rebuilds the same `Report` (equal to the
original but for the timeline, which is not saved), nested summaries, holders and ranks included.
The reader is `core.schema`'s, driven by the dataclasses' own field types, so a field added to the
model is read back without touching this module. A multi-node run saves one file per node; `merge_reports`
joins their ranks into one report judged as if one watcher had seen them all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..core.model import RankSummary
from ..core.schema import from_dict
from .merge import summary_of, with_ranks
from ..render.static import report_document as report_document  # re-exported: saved pages live here too
from ..render.results import Report
from ..render.results import save_report as save_report

STATUS_SEVERITY = {"ok": 0, "interrupted": 1, "error": 2, "killed": 3}


def report_from_dict(data: dict[str, Any]) -> Report:
    """The `Report` whose `to_dict()` gave `data` (its timeline is not saved: None)."""
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, int) or schema < 1:
        raise ValueError("not a torchmem_magic report (no schema version)")
    report: Report = from_dict(Report, data)
    return report


def load_report(path: str | os.PathLike[str]) -> Report:
    """Read a report saved as `.json` (`--save x.json`, or `json.dump(report.to_dict(), f)`)."""
    with open(path, encoding="utf-8") as file:
        return report_from_dict(json.load(file))


def _as_ranks(report: Report, first_rank: int) -> tuple[RankSummary, ...]:
    """A saved report's ranks; a single-process report counts as one rank."""
    if report.ranks is not None:
        return report.ranks
    return (summary_of(report, rank=first_rank, pid=0, host=""),)


def _one_each(ranks: Sequence[RankSummary]) -> tuple[RankSummary, ...]:
    """One entry per rank number: every node's watcher of a multi-node job lists every rank, its own
    from their stream (every reading) and the others' from the job's store (a summary), so the
    stream's entry wins, then the one that saw the rank finish, then the later one."""
    best: dict[int, RankSummary] = {}
    for rank in ranks:
        kept = best.get(rank.rank)
        if kept is None or _detail(rank) > _detail(kept):
            best[rank.rank] = rank
    return tuple(best[n] for n in sorted(best))


def _detail(rank: RankSummary) -> tuple[bool, bool, float]:
    return rank.via == "stream", rank.status not in ("running", "stale"), rank.last_seen_s


def merge_reports(reports: Sequence[Report]) -> Report:
    """One report from several watchers' reports of the same run (one per node): every rank, the
    worst one and the verdict decided again over all of them. The machine-wide rows (RAM, heap,
    shm) are the first report's."""
    if not reports:
        raise ValueError("no report to merge")
    if len(reports) == 1:
        return reports[0]
    ranks: list[RankSummary] = []
    for report in reports:
        ranks.extend(_as_ranks(report, first_rank=len(ranks)))
    note = f"merged from {len(reports)} saved reports; the machine rows above are the first report's"
    return report_of_ranks(reports, _one_each(ranks), note)


def report_of_ranks(reports: Sequence[Report], ranks: Sequence[RankSummary], note: str) -> Report:
    """One report of `ranks`, judged as if one watcher had seen them all, from the reports they came in
    (several nodes' watchers, or every rank's own): the machine-wide rows are the first report's, `note`
    says so."""
    first = reports[0]
    watcher = replace(  # what the first watcher saw of its own tree, before its ranks were merged in
        first, verdict="unknown", leak_kind=None, resource=None, steps_to_exhaustion=None, suspects=(), advice=(),
        steps=0, clock="time", ranks=None, worst_rank=None,
        status=max((r.status for r in reports), key=lambda s: STATUS_SEVERITY.get(s, 0)),
        wall_s=max(r.wall_s for r in reports), samples=sum(r.samples for r in reports),
        source_errors=tuple(e for r in reports for e in r.source_errors),
    )
    merged = with_ranks(watcher, tuple(ranks))
    return replace(merged, advice=(*merged.advice, note))
