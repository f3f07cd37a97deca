"""Text and HTML forms of a report, of a memcheck and of the live status line (stdlib only).

Every function takes the plain data of `model.py` and returns a string; none imports the session or
the result classes, which call these (results → render.text → model).
"""

from __future__ import annotations

import html
import math
import re
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

from ..analysis.holder_trends import top_holder
from ..core.model import (
    LiveStatus,
    MemcheckData,
    RankSummary,
    ReportData,
    Suspect,
    TensorFinding,
    earlier_processes,
    leak_summary,
    resource_summary,
)
from ..core.resources import Resource, report_rows
from .table import format_per_step, report_table_rows
from ..core.units import count_noun, format_bytes, format_duration, plural_noun, rate_unit


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _headline(report: ReportData) -> str:
    status = {"ok": "ok", "error": "failed", "interrupted": "interrupted", "killed": "killed"}[report.status]
    parts = [
        f"memwatch: {status}",
        count_noun(report.steps, report.clock) if report.clock != "time" else "no step clock",
        _count(report.epochs, "epoch"),
        format_duration(report.wall_s),
        f"{report.samples:,} samples every {report.interval_s * 1000:g} ms",
    ]
    return " · ".join(parts)


def report_text(report: ReportData) -> str:
    """A concise multi-line summary for terminals and `print()`."""
    lines = [_headline(report)]
    if report.error and report.status != "ok":
        lines.append(f"  stopped by {report.error}")
    rows = report_table_rows(report)
    header = ("", "start", "end", "peak", "growth", "")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    lines.append("  " + "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths))).rstrip())
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:5], widths[1:])]
        lines.append(("  " + "  ".join(cells) + "  " + row[5]).rstrip())
    if report.steps < 3 and report.clock != "time":
        lines.append(f"  growth per {rate_unit(report.clock)} needs at least 3 {plural_noun(report.clock)}")
    lines += ranks_text(report.ranks)
    worst = f" (worst rank: {report.worst_rank})" if report.worst_rank is not None and report.verdict != "clean" else ""
    lines.append(f"  verdict: {report.verdict}{worst}")
    lines += [f"  → {advice}" for advice in report.advice]
    lines += suspects_text(report.suspects)
    return "\n".join(lines)


def report_html(report: ReportData) -> str:
    """The same summary as a small self-contained HTML table (no scripts, no CDN)."""
    esc = html.escape
    head = "".join(f"<th style='text-align:right;padding:0 .6em'>{h}</th>" for h in ("start", "end", "peak", "growth"))
    body = "".join(
        "<tr><td style='text-align:left;padding-right:.6em'>"
        + esc(r[0])
        + "</td>"
        + "".join(f"<td style='text-align:right;padding:0 .6em'>{esc(c)}</td>" for c in r[1:5])
        + f"<td style='text-align:left;color:#666'>{esc(r[5])}</td></tr>"
        for r in report_table_rows(report)
    )
    error = (
        f"<div style='color:#b00'>stopped by {esc(report.error)}</div>" if report.error and report.status != "ok" else ""
    )
    advice = "".join(f"<li>{esc(a)}</li>" for a in report.advice)
    colour = {"leak": "#b00", "suspect": "#b60", "clean": "#070"}.get(report.verdict, "#666")
    return (
        "<div class='torchmem-report'>"
        f"<b>{esc(_headline(report))}</b>{error}"
        f"<table><thead><tr><th></th>{head}<th></th></tr></thead><tbody>{body}</tbody></table>"
        f"<div class='torchmem-verdict'>verdict: <b style='color:{colour}'>{esc(report.verdict)}</b>"
        + (f"<ul>{advice}</ul>" if advice else "")
        + "</div>"
        + ranks_html(report.ranks)
        + suspects_html(report.suspects)
        + "</div>"
    )


def status_line(status: LiveStatus) -> str:
    """The one-line live status under the figure."""
    clock = status.clock
    unit = rate_unit(clock)
    progress = [f"{unit} {status.steps:,}", f"{status.steps_per_s:.1f} {plural_noun(clock)}/s"]
    ranks_only = bool(status.ranks) and clock == "time"  # the ranks train, this process only launched them
    parts = [
        *(progress if clock != "time" else [format_duration(status.elapsed_s)]),
        *([_rank_progress(status)] if status.ranks else []),
        *([] if ranks_only and not status.epochs else [f"epoch {status.epochs}"]),
        f"RAM {format_bytes(status.ram_bytes)} ({format_per_step(status.ram_per_step, clock)})",
    ]
    if not math.isnan(status.heap_bytes) and not ranks_only:  # the launcher's heap says nothing of the ranks'
        parts.append(f"heap {format_bytes(status.heap_bytes)} ({format_per_step(status.heap_per_step, clock)})")
    if not math.isnan(status.vram_allocated_bytes):
        parts.append(
            f"VRAM {format_bytes(status.vram_allocated_bytes)} / {format_bytes(status.vram_reserved_bytes)} reserved"
            f" ({format_per_step(status.vram_per_step, clock)})"
        )
    if not math.isnan(status.shm_used_bytes):
        parts.append(f"shm {format_bytes(status.shm_used_bytes)}")
    if status.workers:
        parts.append(f"{status.workers} workers")
    if status.guard:
        parts.append(status.guard)
    if status.verdict:
        parts.append(f"verdict so far: {status.verdict}")
    if status.holder:
        parts.append(f"growing: {status.holder}")
    if status.worst_rank:
        parts.append(status.worst_rank)
    return " · ".join(parts)


def _rank_progress(status: LiveStatus) -> str:
    """'2 ranks at step 118–120': how far the slowest and the fastest rank are."""
    text = f"{status.ranks} rank{'s' if status.ranks != 1 else ''}"
    if status.rank_steps is None:
        return text
    low, high = status.rank_steps
    at = f"{low:,}" if low == high else f"{low:,}–{high:,}"
    return f"{text} at {rate_unit(status.rank_clock)} {at}"


# ----------------------------------------------------------------------------- ranks

def _peak_columns(ranks: tuple[RankSummary, ...]) -> list[Resource]:
    """The resources whose peaks the ranks' table shows, in the report table's order: each that can
    leak and that a rank's entry has a field for, and those the ranks' extra summaries carry."""
    own = {f.name for f in fields(RankSummary)}
    carried = {summary.name for rank in ranks for summary in rank.extra}
    return [r for r in report_rows() if r.leak_rank is not None and (r.summary in own or r.summary in carried)]


def _rank_header(columns: list[Resource]) -> list[str]:
    return ["rank", "pid", "steps", *(f"{r.short} peak" for r in columns), "growth", "verdict", "top holder"]


def _rank_cells(rank: RankSummary, columns: list[Resource], earlier: bool = False) -> list[str]:
    """`earlier`: a process of the rank before torchrun restarted it (labelled with its attempt)."""
    verdict = rank.verdict + (f" ({rank.leak_kind})" if rank.leak_kind else "")
    if rank.status not in ("ok", "error", "interrupted"):
        verdict += f", {rank.status}" + (f" ({rank.ended})" if rank.ended else "")
    growth = "—"
    if rank.resource and rank.per_step_bytes is not None:
        growth = f"{rank.resource} {format_per_step(rank.per_step_bytes, rank.clock)}"
    holder = top_holder(rank.suspects, or_largest=rank.verdict == "leak")
    return [
        str(rank.rank) + (f"@{rank.host}" if rank.host and rank.local_rank is not None and rank.rank != rank.local_rank else "")
        + (f" (attempt {rank.attempt})" if earlier else ""),
        str(rank.pid),
        f"{rank.steps:,}",
        *(_peak_cell(resource_summary(rank, r.summary)) for r in columns),
        growth,
        verdict,
        "" if holder is None else holder.name,
    ]


def _peak_cell(summary: Any) -> str:
    return "—" if summary is None else format_bytes(summary.peak_bytes)


def ranks_text(ranks: tuple[RankSummary, ...] | None) -> list[str]:
    """The per-rank table of a multi-process run."""
    if not ranks:
        return []
    earlier = earlier_processes(ranks)  # a restarted rank's processes before its last, labelled
    columns = _peak_columns(ranks)
    header = _rank_header(columns)
    rows = [header, *(_rank_cells(r, columns, id(r) in earlier) for r in ranks)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    numbers = 4 + len(columns)  # pid, steps, the peaks and the growth stand right-aligned
    lines = ["  ranks:"]
    for row in rows:
        cells = [c.rjust(w) if 0 < i < numbers else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(("    " + "  ".join(cells)).rstrip())
    return lines


def ranks_html(ranks: tuple[RankSummary, ...] | None) -> str:
    if not ranks:
        return ""
    earlier = earlier_processes(ranks)
    columns = _peak_columns(ranks)
    rows = [[html.escape(c) for c in _rank_cells(r, columns, id(r) in earlier)] for r in ranks]
    return "<div class='torchmem-ranks'><b>Ranks</b>" + _table(_rank_header(columns), rows) + "</div>"


# ----------------------------------------------------------------------------- suspects


def _on_rank(suspect: Suspect) -> str:
    return "" if suspect.rank is None else f"rank {suspect.rank}: "


def suspects_text(suspects: tuple[Suspect, ...] | list[Suspect], in_cell: bool = True) -> list[str]:
    """`in_cell`: the suspects come from a watched run (a cell, a block, a script), so whether each is
    new in that run means something ("new in this run": the run's own, not the notebook's before it)."""
    if not suspects:
        return []
    lines = ["  holders of tensors / autograd graphs, largest first:"]
    for s in suspects:
        new = (", new in this run" if s.new_in_cell else ", existed before") if in_cell else ""
        share = "" if s.growth_share is None else f", explains {s.growth_share:.0%} of the growth"
        lines.append(
            f"    {_on_rank(s)}{s.name} ({s.kind}): {format_bytes(s.retained_bytes)} retained, {_count(s.tensors, 'tensor')}, "
            f"{s.graph_nodes:,} graph nodes{new}{share} — e.g. {s.path}"
        )
        lines.append(f"      fix: {s.fix}")
    return lines


_CELL = "padding:.1em .6em;text-align:left;vertical-align:top"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th style='{_CELL}'>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='{_CELL}'>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def suspects_html(suspects: tuple[Suspect, ...] | list[Suspect], in_cell: bool = True) -> str:
    if not suspects:
        return ""
    shares = any(s.growth_share is not None for s in suspects)
    header = ["name", "kind", "tensors", "graph nodes", "retained", *(["of the growth"] if shares else []),
              *(["new in this run"] if in_cell else []), "fix"]
    rows = [
        [
            f"{html.escape(_on_rank(s))}<b>{html.escape(s.name)}</b><br><small>{html.escape(s.path)}</small>",
            html.escape(s.kind),
            f"{s.tensors:,}",
            f"{s.graph_nodes:,}",
            html.escape(format_bytes(s.retained_bytes)),
            *([html.escape("–" if s.growth_share is None else f"{s.growth_share:.0%}")] if shares else []),
            *(["yes" if s.new_in_cell else "no"] if in_cell else []),
            f"<code>{html.escape(s.fix)}</code>",
        ]
        for s in suspects
    ]
    return "<div class='torchmem-suspects'><b>What keeps memory alive</b>" + _table(header, rows) + "</div>"


# ----------------------------------------------------------------------------- memcheck

_INDEX = re.compile(r"\[\d+\]")


@dataclass(frozen=True)
class FindingGroup:
    """Findings whose paths differ only in list indices, summed into one row (`history[*]` x 10,000)."""

    path: str  # the shared path, indices written as [*]
    count: int
    shape: str  # the commonest shape, "64×10" ("scalar" for 0-d)
    varied_shapes: bool
    dtype: str  # the first member's dtype and device
    device: str
    bytes: int
    grad_fn: str | None  # the commonest grad_fn
    graph_nodes: int
    retained_bytes: int


def group_findings(findings: tuple[TensorFinding, ...]) -> list[FindingGroup]:
    """One row per path pattern, largest retained first, so 10,000 kept losses read as one line."""
    groups: dict[str, list[TensorFinding]] = {}
    for f in findings:
        groups.setdefault(_INDEX.sub("[*]", f.path), []).append(f)
    rows = []
    for pattern, members in groups.items():
        shapes = Counter(f.shape for f in members)
        grad_fns = Counter(f.grad_fn for f in members)
        rows.append(
            FindingGroup(
                path=pattern,
                count=len(members),
                shape="×".join(map(str, shapes.most_common(1)[0][0])) or "scalar",
                varied_shapes=len(shapes) > 1,
                dtype=members[0].dtype,
                device=members[0].device,
                bytes=sum(f.bytes for f in members),
                grad_fn=grad_fns.most_common(1)[0][0],
                graph_nodes=sum(f.graph_nodes for f in members),
                retained_bytes=sum(f.retained_bytes for f in members),
            )
        )
    return sorted(rows, key=lambda r: -r.retained_bytes)


def _memcheck_headline(result: MemcheckData) -> str:
    estimate = " (estimate)" if result.estimated else ""
    parts = [
        f"{result.expr or 'namespace'}: {_count(result.tensors, 'tensor')}",
        f"{format_bytes(result.bytes)} in storages",
        f"{result.graph_tensors:,} with autograd graphs",
        f"{result.graph_nodes:,} graph nodes{estimate}",
        f"retains {format_bytes(result.retained_bytes)}{estimate}",
    ]
    if result.devices:
        parts.append(", ".join(result.devices))
    if result.truncated:
        parts.append("truncated")
    return " · ".join(parts)


def _shape(row: FindingGroup) -> str:
    return row.shape + ("…" if row.varied_shapes else "")


def memcheck_text(result: MemcheckData) -> str:
    """The headline, up to 15 grouped findings, the holders and the advice, for terminals."""
    lines = [_memcheck_headline(result)]
    for row in group_findings(result.findings)[:15]:
        lines.append(
            f"  {row.path}  ×{row.count:,}  {_shape(row)} {row.dtype} {row.device}  {format_bytes(row.bytes)}"
            + (f"  grad_fn={row.grad_fn}, {row.graph_nodes:,} nodes" if row.grad_fn else "")
            + f"  retains {format_bytes(row.retained_bytes)}"
        )
    lines += suspects_text(result.suspects, in_cell=False)
    lines += [f"  → {a}" for a in result.advice]
    return "\n".join(lines)


def memcheck_html(result: MemcheckData) -> str:
    """The same as a self-contained HTML table (up to 50 grouped findings; no scripts)."""
    esc = html.escape
    rows = [
        [
            f"<code>{esc(r.path)}</code>",
            f"{r.count:,}",
            esc(_shape(r)),
            esc(f"{r.dtype} {r.device}"),
            esc(format_bytes(r.bytes)),
            esc(r.grad_fn or "—"),
            f"{r.graph_nodes:,}",
            esc(format_bytes(r.retained_bytes)),
        ]
        for r in group_findings(result.findings)[:50]
    ]
    table = _table(["path", "tensors", "shape", "dtype / device", "storage", "grad_fn", "graph nodes", "retains"], rows)
    advice = "".join(f"<li>{esc(a)}</li>" for a in result.advice)
    return (
        "<div class='torchmem-memcheck'>"
        f"<b>{esc(_memcheck_headline(result))}</b>"
        + (table if rows else "")
        + suspects_html(result.suspects, in_cell=False)
        + (f"<ul>{advice}</ul>" if advice else "")
        + "</div>"
    )


# ----------------------------------------------------------------------------- one-line forms

SPARK_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: tuple[float, ...] | list[float], min_span: float = 0.0) -> str:
    """'▁▂▃▅▇█': one bar per value, scaled from the lowest to the highest, over at least `min_span`
    (so a curve's noise is not drawn as a climb; flat: all '▁')."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = max(high - low, min_span)
    top = len(SPARK_BARS) - 1
    return "".join(
        " " if not math.isfinite(v) else SPARK_BARS[0 if span <= 0 else min(top, int((v - low) / span * top + 0.5))]
        for v in values
    )


def verdict_rate(report: ReportData) -> str | None:
    """'heap +1.0 MiB/step': the growth the verdict is about."""
    summary = leak_summary(report, report.resource)
    if summary is None or summary.per_step_bytes is None:
        return None
    return f"{report.resource} {format_per_step(summary.per_step_bytes, report.clock)}"


def report_oneline(report: ReportData) -> str:
    """'<Report: leak · 200 steps · heap +1.0 MiB/step>': the repr, like IPython's `<TimeitResult : …>`."""
    parts = [report.verdict + (f" ({report.status})" if report.status != "ok" else "")]
    parts.append(count_noun(report.steps, report.clock) if report.clock != "time" else format_duration(report.wall_s))
    rate = verdict_rate(report)
    if rate is not None and report.verdict in ("leak", "suspect"):
        parts.append(rate)
    if report.worst_rank is not None and report.verdict != "clean":
        parts.append(f"worst rank {report.worst_rank}")
    elif report.ranks:
        parts.append(_count(len(report.ranks), "rank"))
    return f"<Report: {' · '.join(parts)}>"


def memcheck_oneline(result: MemcheckData) -> str:
    """'<MemcheckResult: history · 188 tensors · 12.0 MiB retained>'."""
    return (
        f"<MemcheckResult: {result.expr or 'namespace'} · {_count(result.tensors, 'tensor')}"
        f" · {format_bytes(result.retained_bytes)} retained>"
    )
