"""Every rank's report at rank 0, for a trainer's callback under DDP with no watcher around the job.

Each rank of a DDP run watches itself; where nothing watches the job from outside (`%%memwatch` around a
notebook launch, `python -m torchmem_magic watch` around a script), the ranks' reports meet only through
the job's own process group. When the run has ended well on every rank, each sends its report (as saved,
without the timeline) to rank 0 in one `gather_object`, and rank 0's report is then every rank's, judged
as one watcher judges streamed ranks. A run that failed gathers nothing: the other ranks may never reach
the collective."""

from __future__ import annotations

import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from ..report.merge import summary_of
from ..report.saved import report_from_dict, report_of_ranks

if TYPE_CHECKING:
    from ..render.results import Report

GATHERED_NOTE = "every rank's own report, gathered to rank 0 when the run ended; the machine rows above are rank 0's"


def _process_group() -> Any:
    """torch.distributed where a process group of more than one rank is up, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist


def other_ranks_pids() -> frozenset[int]:
    """The other ranks' process ids (a collective: every rank calls it as its run starts), so that a rank
    that launched the others (Lightning's `ddp` runs the script again as children of rank 0) does not count
    their memory as its own; empty outside a process group."""
    dist = _process_group()
    if dist is None:
        return frozenset()
    pids: list[Any] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(pids, os.getpid())
    except Exception:  # the group cannot carry it: the tree is counted whole, as without a group
        return frozenset()
    return frozenset(pid for pid in pids if isinstance(pid, int) and pid != os.getpid())


def gathered_report(report: Report | None) -> Report | None:
    """Rank 0: its report with every rank's in it; another rank: its own. Every rank of the group must call
    it (it is a collective), also one whose run had no report of its own (None: it sends nothing).
    A gather that fails leaves each rank its own report, with one line on stderr."""
    dist = _process_group()
    if dist is None:
        return report
    rank = dist.get_rank()
    sent = None if report is None else {
        "report": report.to_dict(), "pid": os.getpid(), "host": socket.gethostname(),
        "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
    }
    received: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    try:
        dist.gather_object(sent, received, dst=0)
    except Exception as exc:  # a broken group must not lose the rank's own report
        line = f"torchmem_magic: the ranks' reports could not be gathered ({type(exc).__name__}: {exc})"
        print(line.splitlines()[0], file=sys.stderr)
        return report
    if rank != 0 or report is None or received is None:
        return report
    return _of_every_rank(report, received)


def _of_every_rank(own: Report, received: list[Any]) -> Report:
    """Rank 0's report (its own, with its timeline) and the others' as they came, one rank entry each."""
    reports, ranks = [own], []
    for rank, sent in enumerate(received):
        if sent is None:
            continue
        report = own if rank == 0 else report_from_dict(sent["report"])
        if rank != 0:
            reports.append(report)
        ranks.append(summary_of(report, rank=rank, pid=sent["pid"], host=sent["host"], local_rank=sent["local_rank"]))
    return report_of_ranks(reports, ranks, GATHERED_NOTE)
