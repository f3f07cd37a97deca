"""What changed between two saved runs of the same training (`python -m torchmem_magic compare A B`):
per rank (or for the one process) its peak, its growth per step, its verdict and its holders, and
whether memory growth regressed, so that CI can fail on it.

Growth regressed when a run that was clean (or not yet judged) now leaks or is suspect, or when a
leak's rate grew by more than the tolerance (and by more than MIN_RATE_CHANGE_BYTES a step, below
which a rate is noise). A peak that grew is said, and fails only when a peak tolerance is given; then
the peak of every resource that can leak (RAM, heap, VRAM, /dev/shm, ...) is held to it.
Rates of different step clocks (per optimizer step against per batch) are not compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.model import RankSummary, ReportData, Suspect, headline_peak, resource_summary
from ..core.resources import Resource, report_rows
from ..core.units import format_bytes, rate_unit
from .rates import leak_rate

DEFAULT_TOLERANCE = 0.20
MIN_RATE_CHANGE_BYTES = 1024.0
BAD_VERDICTS = ("leak", "suspect")
HOLDERS_SHOWN = 5


@dataclass(frozen=True)
class RunFigures:
    """What one rank (or the single process) of a saved run says, as compared."""

    label: str  # "rank 1", or "run" for a single process
    peak_bytes: float  # the peak it is ranked by: a device's where the run used one, else RAM's
    rate_bytes: float | None  # the verdict's growth per step, where it leaks or is suspect
    clock: str
    verdict: str
    holders: tuple[str, ...]  # the largest holders' names
    peaks: tuple[tuple[str, float], ...] = ()  # (short name, peak) of each resource that can leak, where measured


@dataclass(frozen=True)
class Change:
    """One rank's comparison: its figures in each run, and what regressed."""

    label: str
    base: RunFigures | None
    new: RunFigures | None
    regressions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Comparison:
    changes: tuple[Change, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def regressed(self) -> bool:
        return any(change.regressions for change in self.changes)


def _holders(suspects: Sequence[Suspect]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.name for s in suspects))[:HOLDERS_SHOWN]


def _peaks(part: ReportData | RankSummary) -> tuple[tuple[Resource, float], ...]:
    """Each resource that can leak, with its peak, in the report table's order (where measured)."""
    out = []
    for row in report_rows():
        summary = resource_summary(part, row.summary) if row.leak_rank is not None else None
        if summary is not None and summary.peak_bytes:
            out.append((row, float(summary.peak_bytes)))
    return tuple(out)


def _figures(label: str, part: ReportData | RankSummary) -> RunFigures:
    peaks = _peaks(part)
    rate = None
    if part.verdict in BAD_VERDICTS:
        rate = part.per_step_bytes if isinstance(part, RankSummary) else leak_rate(part, part.resource)
    return RunFigures(
        label=label, peak_bytes=headline_peak(part)[1], rate_bytes=rate, clock=part.clock,
        verdict=part.verdict, holders=_holders(part.suspects), peaks=tuple((row.short, peak) for row, peak in peaks),
    )


def run_figures(report: ReportData) -> dict[str, RunFigures]:
    """Each rank's figures by label; the process's own as "run" when it had no ranks."""
    if not report.ranks:
        return {"run": _figures("run", report)}
    ranks = sorted(report.ranks, key=lambda r: r.rank)
    own = {r.rank: tuple(s for s in report.suspects if s.rank == r.rank) for r in ranks}
    out = {}
    for rank in ranks:
        figures = _figures(f"rank {rank.rank}", rank)
        if not figures.holders and own[rank.rank]:  # a rank summary without its holders: the report's, by rank
            figures = RunFigures(**{**figures.__dict__, "holders": _holders(own[rank.rank])})
        out[figures.label] = figures
    return out


def _regressions(base: RunFigures, new: RunFigures, tolerance: float, peak_tolerance: float | None) -> list[str]:
    found = []
    if new.verdict in BAD_VERDICTS and base.verdict not in BAD_VERDICTS:
        rate = "" if new.rate_bytes is None else f" at {format_bytes(new.rate_bytes, signed=True)}/{rate_unit(new.clock)}"
        found.append(f"{new.label} was {base.verdict}, now {new.verdict}{rate}")
    elif (
        new.verdict in BAD_VERDICTS and base.rate_bytes is not None and new.rate_bytes is not None
        and base.clock == new.clock
        and new.rate_bytes > base.rate_bytes * (1 + tolerance)
        and new.rate_bytes - base.rate_bytes > MIN_RATE_CHANGE_BYTES
    ):
        unit = rate_unit(new.clock)
        found.append(
            f"{new.label}'s growth {format_bytes(base.rate_bytes, signed=True)} → "
            f"{format_bytes(new.rate_bytes, signed=True)}/{unit} (tolerance {tolerance:.0%})"
        )
    if peak_tolerance is not None:
        before = dict(base.peaks)
        for what, peak in new.peaks:
            if what in before and peak > before[what] * (1 + peak_tolerance):
                found.append(f"{new.label}'s {what} peak {format_bytes(before[what])} → "
                             f"{format_bytes(peak)} (tolerance {peak_tolerance:.0%})")
    return found


def compare(
    base: ReportData, new: ReportData, tolerance: float = DEFAULT_TOLERANCE, peak_tolerance: float | None = None
) -> Comparison:
    """The two runs, rank by rank (a rank in one run only is said, and is no regression)."""
    before, after = run_figures(base), run_figures(new)
    changes, notes = [], []
    for label in sorted(before.keys() | after.keys(), key=_label_order):
        a, b = before.get(label), after.get(label)
        if a is None or b is None:
            notes.append(f"{label} is only in the {'new' if a is None else 'base'} run")
            changes.append(Change(label, a, b))
            continue
        if a.clock != b.clock and (a.rate_bytes is not None or b.rate_bytes is not None):
            notes.append(f"{label}: growth per {rate_unit(a.clock)} and per {rate_unit(b.clock)} are not compared")
        changes.append(Change(label, a, b, tuple(_regressions(a, b, tolerance, peak_tolerance))))
    return Comparison(tuple(changes), tuple(notes))


def _label_order(label: str) -> tuple[int, str]:
    number = label.removeprefix("rank ")
    return (int(number), "") if number.isdigit() else (-1, label)


def _rate(figures: RunFigures | None) -> str:
    if figures is None:
        return "—"
    if figures.rate_bytes is None:
        return "flat" if figures.verdict == "clean" else "—"
    return f"{format_bytes(figures.rate_bytes, signed=True)}/{rate_unit(figures.clock)}"


def _peak(a: RunFigures | None, b: RunFigures | None) -> str:
    if a is None or b is None:
        only = a if a is not None else b
        return "—" if only is None else format_bytes(only.peak_bytes)
    change = f" ({(b.peak_bytes / a.peak_bytes - 1) * 100:+.1f}%)" if a.peak_bytes > 0 else ""
    return f"{format_bytes(a.peak_bytes)} → {format_bytes(b.peak_bytes)}{change}"


def comparison_text(comparison: Comparison, base_name: str, new_name: str) -> str:
    """A table, a rank a row, then what regressed (or that nothing did)."""
    rows = [["", "peak", "growth", "verdict", "holders"]]
    for change in comparison.changes:
        a, b = change.base, change.new
        verdict = f"{a.verdict if a else '—'} → {b.verdict if b else '—'}"
        holders = []
        if a is not None and b is not None:
            holders += [f"+{name}" for name in b.holders if name not in a.holders]
            holders += [f"−{name}" for name in a.holders if name not in b.holders]
            if not holders and b.holders:
                holders = [", ".join(b.holders)]
        rows.append([change.label, _peak(a, b), f"{_rate(a)} → {_rate(b)}", verdict, " ".join(holders)])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"compare {base_name} → {new_name}"]
    lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4] for row in rows]
    lines = [line.rstrip() for line in lines]
    lines += [f"  note: {note}" for note in comparison.notes]
    regressions = [r for change in comparison.changes for r in change.regressions]
    if regressions:
        lines += [f"  regressed: {r}" for r in regressions]
    else:
        lines.append("  memory growth did not regress")
    return "\n".join(lines)
