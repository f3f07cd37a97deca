"""The rules that explain growth away (pure): growth that is no retention (the caching allocator's
reserve, the allocator keeping RSS) or is the DataLoader workers' copy-on-access. Each reads only the run's
series and findings (`Evidence`) and the thresholds of the table in force; no rule calls another."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .findings import Note, ResourceFinding, Series, note, readings_of
from .verdict_table import Thresholds
from .worker_growth import FIRST_TOUCH_BYTES_PER_WORKER, copy_on_access_projection, still_copying, workers_growth


@dataclass
class Evidence:
    """What the rules that explain growth away read: each resource's series and finding, and the workers'."""

    series: dict[str, Series]
    findings: dict[str, ResourceFinding]
    worker_epochs: Sequence[float]  # where the DataLoader workers start again (none: persistent workers)
    worker_count: int
    first_pass_steps: tuple[int, int] | None

    @functools.cached_property
    def _workers_growth(self) -> float:
        """What the workers' PSS grew by (epoch by epoch where they start again): worked out once a verdict."""
        return workers_growth(self.series["workers"], self.worker_epochs)

    def grew(self, resource: str) -> float:
        """Last reading minus first of a resource, over the whole run."""
        _, ys = readings_of(self.series[resource])
        return ys[-1] - ys[0] if ys else 0.0

    def workers_added(self, t: Thresholds) -> float | None:
        """What the DataLoader workers added, where it is theirs: the kernel's heap explains little of it
        (flat, or a small fraction) and it is more than their first touches of the parent's pages."""
        workers, heap = self.findings.get("workers"), self.findings.get("heap")
        added = self._workers_growth if workers else 0.0
        heap_aside = heap is not None and (heap.verdict == "clean" or heap.net_growth_bytes < t.heap_aside_share * added)
        return added if workers and heap_aside and added >= FIRST_TOUCH_BYTES_PER_WORKER * max(1, self.worker_count) else None


@dataclass(frozen=True)
class Explained:
    """What a rule says of the run: a note for the advice, resources whose growth it explains (no leak of
    theirs), and a finding that takes a resource's place (the workers still copying: the tree's leak)."""

    note: Note | None = None
    not_leaks: frozenset[str] = frozenset()
    instead: ResourceFinding | None = None


def caching_allocator(e: Evidence, t: Thresholds) -> Explained | None:
    """CUDA reserved memory grows while allocated memory is flat: the caching allocator keeps it."""
    reserved, allocated = e.findings.get("vram_reserved"), e.findings.get("vram")
    if reserved and allocated and reserved.verdict in ("leak", "suspect") and allocated.verdict == "clean":
        return Explained(note("caching allocator"))
    return None


def copy_on_access(e: Evidence, t: Thresholds) -> Explained | None:
    """Workers copying a dataset page by page as they read it: bounded once every page was touched (the
    note says where it stays); while it still goes on, the process tree's leak (the OOM killer counts the
    workers' memory)."""
    added = e.workers_added(t)
    if added is None:
        return None
    workers = e.findings["workers"]
    # "unknown": too few PSS readings for the detector, one short epoch
    still = still_copying(e.series["workers"], e.worker_epochs) if workers.verdict != "clean" else None
    projection = copy_on_access_projection(e.series["workers"], workers, e.first_pass_steps)
    said = note("copy on access", added_bytes=added, **projection)
    return Explained(said, frozenset({"ram"}) if still is not None else frozenset(), still)


def allocator_keeps_rss(e: Evidence, t: Thresholds) -> Explained | None:
    """RSS growth that is no retention: the heap in use is flat, or is no leak (too few steps past its
    warm-up, or only suspect) and grew far less than RSS over the run (the allocator kept the rest)."""
    heap, rss = e.findings.get("heap"), e.findings.get("rss") or e.findings.get("ram")
    if heap is None or not (heap.verdict == "clean" or (
        heap.verdict != "leak" and rss is not None and e.grew("heap") < t.heap_share_of_rss * e.grew(rss.resource)
    )):
        return None
    shm = e.findings.get("shm")
    # where /dev/shm leaks, RSS grew by the segments the kernel maps (the workers' batches it keeps): no allocator's
    said = (rss is not None and rss.verdict == "leak" and e.workers_added(t) is None  # else the workers' note says it
            and (shm is None or shm.verdict not in ("leak", "suspect")))
    return Explained(note("allocator keeps RSS", heap_flat=heap.verdict == "clean") if said else None, frozenset({"ram"}))


#: the rules that explain growth away, by their name in the verdict table, in the order their notes are given
EXPLAINING_RULES: tuple[tuple[str, Callable[[Evidence, Thresholds], Explained | None]], ...] = (
    ("caching-allocator", caching_allocator), ("copy-on-access", copy_on_access),
    ("allocator-keeps-rss", allocator_keeps_rss),
)
