"""The lines a report of many ranks gives: each rank's verdict, deaths, restarts, silence, imbalance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...analysis.holder_trends import grows, top_holder
from ...core.model import RankSummary
from ...core.units import format_bytes, format_duration, rate_unit


def _holder(rank: RankSummary) -> str:
    top = top_holder(rank.suspects, or_largest=rank.verdict == "leak")
    if top is None:
        return ""
    if grows(top):
        return f"; {top.name} grows {format_bytes(top.growth_per_step or 0.0, signed=True)}/{rate_unit(rank.clock)}"
    return f"; held by {top.name}"


def ranks_word(numbers: Sequence[int]) -> str:
    return ("rank " if len(numbers) == 1 else "ranks ") + ", ".join(str(n) for n in numbers)


def rank_line(rank: RankSummary) -> str:
    """'rank 1: leak (per-iteration), heap +1.0 MiB/step; history grows +1.0 MiB/step'."""
    line = f"rank {rank.rank}: {rank.verdict}"
    if rank.leak_kind:
        line += f" ({rank.leak_kind})"
    if rank.resource and rank.per_step_bytes is not None:
        line += f", {rank.resource} {format_bytes(rank.per_step_bytes, signed=True)}/{rate_unit(rank.clock)}"
    line += _holder(rank)
    return line


def death_line(rank: RankSummary, culprit: bool, ram_full: bool) -> str:
    """A rank that stopped without finishing: how, its last readings, and (for the rank whose death ended the
    run) what most likely killed it (`ram_full`: its RAM was at its limit)."""
    how = f" ({rank.ended})" if rank.ended else ""
    last = f"last readings: RAM {format_bytes(rank.ram.end_bytes)} of {format_bytes(rank.ram.limit_bytes)}"
    if rank.heap is not None:
        last += f", heap {format_bytes(rank.heap.end_bytes)}"
    if rank.vram is not None:
        last += f", VRAM {format_bytes(rank.vram.allocated_end_bytes)}"
    line = f"rank {rank.rank} (pid {rank.pid}) stopped without finishing{how} at {format_duration(rank.last_seen_s)}; {last}"
    if not culprit:
        return line + " (after another rank died: launchers stop the rest)"
    if ram_full:
        line += "; RAM was at its limit: most likely the OOM killer"
    elif rank.ended is None:
        line += "; what killed it cannot be known from here (no exit status reached this watcher)"
    return line


def stale_line(rank: RankSummary) -> str:
    """Another node's rank whose summaries stopped arriving: where it was, its last figures."""
    where = f" on {rank.host}" if rank.host else ""
    where += f", node {rank.node}" if rank.node is not None else ""
    last = f"RAM {format_bytes(rank.ram.end_bytes)} of {format_bytes(rank.ram.limit_bytes)}"
    if rank.heap is not None:
        last += f", heap {format_bytes(rank.heap.end_bytes)}"
    return (
        f"rank {rank.rank} (pid {rank.pid}{where}) went silent: its last summary came at "
        f"{format_duration(rank.last_seen_s)}, at {rank.steps:,} {rate_unit(rank.clock)}s; last readings: {last}; "
        "what became of it cannot be known from here"
    )


def imbalance_line(what: str, peak_bytes: float, where: str, median_bytes: float, of: str = "") -> str:
    """'imbalance: peak RAM 2.0 GiB on rank 2, median 1.0 GiB (+100%)'; `of` names what the median
    is over where that is not the ranks ("of 2 nodes")."""
    median = f"median{' ' + of if of else ''}"
    return (
        f"imbalance: peak {what} {format_bytes(peak_bytes)} on {where}, {median} {format_bytes(median_bytes)} "
        f"(+{(peak_bytes / median_bytes - 1) * 100:.0f}%)"
    )


def of_rank(rank: int, advice: str) -> str:
    """A rank's advice in the report of all: it speaks of "this kernel" (the single-process wording);
    here it is that rank."""
    return f"rank {rank}: " + advice.replace("this kernel", "this rank")


def attempt_line(attempt: int, died: RankSummary | None, again: Sequence[int]) -> str:
    """'attempt 0 ended: rank 1 stopped (SIGKILL) at 120 steps; torchrun started ranks 0, 1 again'."""
    how = "" if died is None else (
        f": rank {died.rank} stopped{f' ({died.ended})' if died.ended else ''} at {died.steps:,} {rate_unit(died.clock)}s"
    )
    return f"attempt {attempt} ended{how}; torchrun started {ranks_word(again)} again"


def stopped_by_line(rank: RankSummary, max_chars: int) -> str:
    """A rank an exception stopped, quoting at most `max_chars` of it."""
    ended = rank.ended or ""
    what = ended if len(ended) <= max_chars else ended[: max_chars - 1] + "…"
    return f"rank {rank.rank} stopped at {rank.steps:,} {rate_unit(rank.clock)}s by {what}"


def foreign_context_line(rank: int, context: dict[str, Any]) -> str:
    """A rank holding a CUDA context on a device its tensors are not on."""
    return (
        f"rank {rank} holds a CUDA context on GPU-{str(context['device'])[:8]} "
        f"({format_bytes(int(context.get('used', 0)))}), a device its own tensors are not on: it "
        "touched CUDA before torch.cuda.set_device(local_rank) (call that first in each rank)"
    )


def clean_line(ranks: Sequence[int]) -> str:
    return f"{ranks_word(ranks)}: clean"
