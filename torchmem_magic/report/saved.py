"""Saved reports: written as `.json` or as an offline `.html` page, read back, merged (stdlib only).

A saved `.json` is `Report.to_dict()`; reading it back rebuilds the same `Report` (equal to the
original but for the timeline, which is not saved), nested summaries, holders and ranks included.
The reader is driven by the dataclasses' own field types, so a field added to the model is read
back without touching this module. A multi-node run saves one file per node; `merge_reports`
joins their ranks into one report judged as if one watcher had seen them all.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import fields, is_dataclass, replace
from typing import Any, Literal, Union

from ..core import resources
from ..core.model import RankSummary, ResourceSummary
from .merge import summary_of, with_ranks
from ..render.static import report_document as report_document  # re-exported: saved pages live here too
from ..render.results import Report
from ..render.results import save_report as save_report

STATUS_SEVERITY = {"ok": 0, "interrupted": 1, "error": 2, "killed": 3}


def _schema_key(field: dataclasses.Field[Any]) -> str | None:
    """The key a field has in `to_dict()` (None: not saved)."""
    if "key" in field.metadata:
        key: str | None = field.metadata["key"]
        return key
    return field.name.removesuffix("_bytes")


def _value(kind: Any, value: Any) -> Any:
    """`value` read from JSON as a `kind` (a field's type: a summary class, a tuple, an optional)."""
    if value is None:
        return None
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union or origin is types.UnionType:
        options = [a for a in args if a is not type(None)]
        return _value(options[0], value) if len(options) == 1 else value
    if isinstance(kind, type) and is_dataclass(kind):
        return from_dict(kind, value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v) for v in value)
        return tuple(_value(a, v) for a, v in zip(args, value)) if args else tuple(value)
    if origin is dict:
        return dict(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin is Literal or kind in (int, str, bool, float) or kind is Any:
        return value
    return value


_TYPE_HINTS: dict[type[Any], dict[str, Any]] = {}  # the package's own schema classes only


def _type_hints(cls: type[Any]) -> dict[str, Any]:
    """A class's field types, resolved once: resolving them costs more than the rest of a decoding (a
    watcher of many ranks decodes every rank's summary once a second)."""
    hints = _TYPE_HINTS.get(cls)
    if hints is None:
        hints = _TYPE_HINTS[cls] = typing.get_type_hints(cls)
    return hints


def from_dict(cls: type[Any], data: dict[str, Any]) -> Any:
    """The `cls` whose `to_dict()` gave `data`; a key it lacks takes the field's default
    (ValueError when the field has none)."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    kinds = _type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.metadata.get("spread"):
            kwargs[f.name] = _spread(cls, data)
            continue
        key = _schema_key(f)
        if key is None or not f.init:
            continue
        if key in data:
            kwargs[f.name] = _value(kinds[f.name], data[key])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{cls.__name__}: the saved data has no {key!r}")
    return cls(**kwargs)


def _spread(cls: type[Any], data: dict[str, Any]) -> tuple[ResourceSummary, ...]:
    """The summaries saved under keys of their own: those of the resources table's rows that `cls` has
    no field for (keys of rows unknown here are left: a newer writer's)."""
    own = {_schema_key(f) for f in fields(cls)}
    names = dict.fromkeys(r.summary for r in resources.RESOURCES if r.summary and r.summary not in own)
    return tuple(replace(from_dict(ResourceSummary, data[name]), name=name) for name in names if name in data)


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
