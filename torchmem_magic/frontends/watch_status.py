"""The watcher's live status in a terminal: a line per rank of the job, the worst first, every node's
ranks included (the other nodes' from the job's store).

On a terminal the block stays at the bottom of the screen and is redrawn in place about once a
second: the rows under a scroll region are kept for it, so the command's own output (it writes to
the same terminal) scrolls above it untouched. Elsewhere (a batch job's log) the block is printed as
plain lines every PLAIN_PERIOD_S. It goes to stderr, so that stdout holds the command's output and
the report alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from ..core.model import LiveStatus
from ..report.merge import max_attempt
from ..core.model import earlier_processes
from ..ranks.live import RankLive, worst_first
from ..core.units import format_bytes, format_duration, rate_unit

if TYPE_CHECKING:
    from ..session.live_view import LiveView
    from ..render.results import Report

TERMINAL_PERIOD_S = 1.0
PLAIN_PERIOD_S = 10.0
RANK_LINES = 8  # the worst ranks listed; the rest are counted in one line
ESC = "\x1b"


def rank_line(rank: RankLive, earlier: bool = False) -> str:
    """'rank 1 @host-b (node 1): leak +64.0 KiB/step in heap · kept_outputs · 130 steps · peak 1.2 GiB';
    a rank of an attempt before torchrun's last restart says which."""
    where = f" @{rank.host}" if rank.host else ""
    where += f" (node {rank.node})" if rank.node is not None else ""
    where += f" (attempt {rank.attempt})" if earlier else ""
    unit = rate_unit(rank.clock)
    if rank.died is not None:
        state = f"stopped ({rank.died})"
    elif rank.stale:
        state = "stale: its summaries stopped coming"
    elif rank.verdict == "unknown":
        state = "judging"
    else:
        state = rank.verdict
        if rank.verdict in ("leak", "suspect") and rank.per_step_bytes is not None:
            state += f" {format_bytes(rank.per_step_bytes, signed=True)}/{unit}"
            if rank.resource:
                state += f" in {rank.resource}"
    parts = [f"rank {rank.rank}{where}: {state}"]
    if rank.holder and rank.died is None:
        parts.append(rank.holder)
    parts.append(f"{rank.steps:,} {unit}s")
    if rank.peak_bytes > 0:
        parts.append(f"peak {format_bytes(rank.peak_bytes)}")
    return " · ".join(parts)


def status_lines(status: LiveStatus, ranks: Sequence[RankLive], rank_lines: int = RANK_LINES) -> list[str]:
    """The block: a heading (time, ranks, nodes, the slowest and fastest rank's steps), then the ranks
    one a line, the worst first."""
    heading = f"torchmem_magic watch · {format_duration(status.elapsed_s, rough=True)}"
    if not ranks:
        return [heading + " · no rank has reported yet"]
    nodes = {r.node for r in ranks if r.node is not None}
    heading += f" · {len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
    if len(nodes) > 1:
        heading += f" on {len(nodes)} nodes"
    if status.rank_steps is not None:
        low, high = status.rank_steps
        heading += f" · {low:,} {rate_unit(status.rank_clock)}s" if low == high else f" · {low:,}–{high:,} {rate_unit(status.rank_clock)}s"
    ordered = worst_first(ranks)
    restarts = max_attempt(ranks)
    if restarts:
        heading += f" · restarted {restarts}×"  # torchrun started ranks again
    earlier = earlier_processes(ordered)
    lines = [heading, *("  " + rank_line(r, id(r) in earlier) for r in ordered[:rank_lines])]
    rest = ordered[rank_lines:]
    if rest:
        clean = sum(1 for r in rest if r.verdict == "clean" and r.died is None and not r.stale)
        lines.append(f"  … {len(rest)} more rank{'s' if len(rest) != 1 else ''} ({clean} clean so far)")
    return lines


class TerminalStatus:
    """A listener of the watcher's session that writes the status block (sampler thread)."""

    tick_cpu_share: float | None = None

    def __init__(self, stream: TextIO, period_s: float | None = None, terminal: bool | None = None) -> None:
        self._stream = stream
        self._terminal = _is_terminal(stream) if terminal is None else terminal
        self.tick_period_s = period_s if period_s is not None else (TERMINAL_PERIOD_S if self._terminal else PLAIN_PERIOD_S)
        self._reserved = 0  # rows kept at the bottom of the terminal
        self._screen_rows = 0

    def on_tick(self, view: LiveView) -> None:
        ranks = view.live_ranks()
        if not ranks and not self._terminal:
            return  # a log gets no lines before there is something to say
        lines = status_lines(view.live_status(ranks), ranks)
        try:
            if self._terminal:
                self._draw(lines)
            else:
                self._print(lines)
        except (OSError, ValueError):  # the terminal went away: the status is not worth failing the watch
            self._terminal, self.tick_period_s = False, float("inf")

    def on_finish(self, view: LiveView, report: Report) -> None:
        """Give the rows back (the report follows in the ordinary scrolling screen)."""
        if not self._reserved:
            return
        rows = self._screen_rows
        out = [f"{ESC}7"]
        out += [f"{ESC}[{rows - self._reserved + 1 + i};1H{ESC}[2K" for i in range(self._reserved)]
        out += [f"{ESC}[r", f"{ESC}8"]
        self._reserved = 0
        try:
            self._write("".join(out))
        except (OSError, ValueError):
            pass

    def _print(self, lines: list[str]) -> None:
        self._write("\n".join(lines) + "\n")

    def _draw(self, lines: list[str]) -> None:
        columns, rows = os.get_terminal_size(self._stream.fileno())
        lines = [line[: max(1, columns - 1)] for line in lines][: max(1, rows // 3)]
        out = []
        wanted = max(self._reserved, len(lines))
        if wanted != self._reserved or rows != self._screen_rows:
            more = wanted - self._reserved
            # room below the cursor for the new rows (the screen scrolls when the cursor is near its
            # bottom), then the scroll region above them; setting it homes the cursor, so it is saved
            out.append("\n" * more + (f"{ESC}[{more}A" if more else ""))
            out.append(f"{ESC}7{ESC}[1;{rows - wanted}r{ESC}8")
            self._reserved, self._screen_rows = wanted, rows
        lines += [""] * (wanted - len(lines))
        out.append(f"{ESC}7")
        out += [f"{ESC}[{rows - wanted + 1 + i};1H{ESC}[2K{line}" for i, line in enumerate(lines)]
        out.append(f"{ESC}8")
        self._write("".join(out))

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM", "dumb") != "dumb"
    except (AttributeError, ValueError):
        return False
