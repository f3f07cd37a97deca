"""The leak finder during the run: bounded scans at step boundaries, each holder's size over the steps.

Scans walk user objects, so they run on the training thread, between two steps (never from the
sampler thread, which would race the user's code). Each scan is limited in time and in autograd
nodes, and the next one waits until the scans so far cost at most `budget_share` of the run's time.
Most scans re-measure only the holders already known and the names new in the cell (cheap); every
few scans, budget permitting, a full one looks everywhere. Only names, step numbers and byte counts
are kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .scan.results import Budget, LooseRoot, Root, RootStats
from .scan.plain_lists import PlainListMemo
from .scan.scanner import scan_roots
from .scan_schedule import ScanSchedule
from .suspects import classify

#: Few nodes per scan: touching tens of thousands of nodes of one long autograd chain from Python
#: makes its later deletion overflow the C stack, and scans repeat, so a run touches at most
#: MAX_SCANS x 200 nodes of any chain (the end-of-cell scan adds its own 20,000).
MID_RUN_BUDGET = Budget(time_s=0.05, graph_node_cap=200, max_findings=0)


def mid_run_budget(sequence_floor: int) -> Budget:
    """The scans' limits; a chain's unwalked part is counted only down to `sequence_floor`, the autograd
    sequence number when the run began (earlier runs' nodes carry lower numbers)."""
    return replace(MID_RUN_BUDGET, sequence_floor=sequence_floor)
CHEAP_OBJECTS = 10_000  # a name whose scan met fewer objects than this is cheap to re-measure
MAX_HOLDERS = 32
MAX_POINTS = 64


class HolderTracker:
    """Each holder's retained bytes at scans during the run: `{name: [(step, bytes), ...]}`; when the scans
    come is its `schedule`'s (`due_at` is the schedule's own method, called at every step).

    Args:
        roots: where to look (the same provider the end-of-cell scan uses).
        baseline: retained bytes per name before the cell (their series start at step 0).
        cheap: names whose scan before the cell met few objects: re-measured at every scan (an empty
            list that the loop fills is one); the others only at the full scans.
        full_scan_cost_s: what a scan of everything is expected to cost (the scan before the cell tells).
        sequence_floor: the autograd sequence number when the run began (see `mid_run_budget`).
        schedule: the scans' timetable's other settings (`ScanSchedule`'s arguments).
    """

    def __init__(
        self,
        roots: Callable[[], list[Root]],
        baseline: dict[str, int] | None = None,
        cheap: set[str] | None = None,
        full_scan_cost_s: float = 0.0,
        sequence_floor: int = 0,
        **schedule: Any,
    ) -> None:
        self._roots = roots
        self._budget = mid_run_budget(sequence_floor)
        self._baseline = dict(baseline or {})
        self._cheap = set(cheap or ())
        self.schedule = ScanSchedule(min(full_scan_cost_s, MID_RUN_BUDGET.time_s), **schedule)
        self.due, self.due_at = self.schedule.due, self.schedule.due_at
        self._plain_lists = PlainListMemo()  # the records a scan checked are not checked again at the next
        self._lock = threading.Lock()  # series are written here and read by the live figure's thread
        self._series: dict[str, list[tuple[int, int]]] = {}
        self._object_ids: dict[str, int] = {}  # name -> id of the object it held at the scans (ids only)
        self.kinds: dict[str, str] = {}  # name -> suspect kind at the last scan ("autograd-graph", ...)
        self.last_stats: dict[str, RootStats] = {}  # name -> what the last scan that measured it found
        self.scans = 0
        self.spent_s = 0.0
        self.counted_storages: frozenset[tuple[object, ...]] = frozenset()  # what the scans reached (keys only)
        self._search_wanted: Callable[[], list[Root]] | None = None  # a search back, run at the next scan
        self._found: list[LooseRoot] = []  # holders no name reaches, found searching back: measured from then on

    @property
    def found_roots(self) -> list[Root]:
        """The holders a search back found, those still alive (none is kept alive by this list)."""
        return [root for root in (found.root() for found in self._found) if root is not None]

    def let_go(self) -> None:
        """The run ended: nothing found is followed any more."""
        self._found = []

    def want_search(self, search: Callable[[], list[Root]]) -> None:
        """Run `search()` at the next scan (any thread may ask), as soon as the budget allows: the roots
        it returns are measured at that scan and every one after. Its time counts in `spent_s` but not
        against the budget: it is bounded by its own limit and comes once, and charged, it would hold the
        scans that show whether what it found grows back for a hundred times as long."""
        self._search_wanted = search
        self.schedule.soon()

    def scan(self, step: int) -> None:
        """Measure the holders now, at `step`; then wait until the scans' share of the run is back
        under the budget.

        Most scans look only at the holders already tracked and the names new in the cell (cheap);
        every FULL_SCAN_EVERY-th looks at everything, when the budget has room for what the last
        full scan cost (a long session's namespace can take the whole 50 ms)."""
        clock, cpu_clock = self.schedule.clock, self.schedule.cpu_clock
        search, self._search_wanted = self._search_wanted, None
        started, cpu_started = clock(), cpu_clock()
        try:
            if search is not None:
                self._found.extend(LooseRoot(root) for root in search())
                self.spent_s += clock() - started
                started, cpu_started = clock(), cpu_clock()
            full = self.schedule.full_scan_allowed(started, self.scans)
            roots = self._roots() + self.found_roots
            if not full:
                roots = [r for r in roots if r.name in self._series or r.name in self._cheap or r.name not in self._baseline]
            result = scan_roots(roots, self._budget, plain_lists=self._plain_lists) if roots else None
            if result is not None:
                self._record(step, result.roots)
                self.counted_storages = result.storages if full else self.counted_storages | result.storages
                with self._lock:
                    self._object_ids.update((r.name, id(r.obj)) for r in roots if r.name in self._series)
        except KeyboardInterrupt as interrupt:
            # a SIGINT mid-scan (it runs on the training thread), also while its results are filed: raised
            # without the scan's frames, which hold the user's objects (IPython keeps the traceback as
            # sys.last_traceback)
            roots = []
            raise interrupt.with_traceback(None) from None
        del roots
        self.scans += 1
        self.spent_s += self.schedule.scanned(step, started, cpu_started, full, self.scans)

    def _record(self, step: int, measured: list[RootStats]) -> None:
        with self._lock:
            for stats in measured:
                if stats.truncated or not stats.tensors:
                    continue  # a partial figure would read as a fall, or it holds nothing
                series = self._series.get(stats.name)
                if series is None:
                    if len(self._series) >= MAX_HOLDERS:
                        continue
                    before = self._baseline.get(stats.name)
                    series = self._series[stats.name] = [] if before is None else [(0, before)]
                self.kinds[stats.name] = classify(stats) or "tensors"
                self.last_stats[stats.name] = stats
                series.append((step, stats.retained_bytes))
                if len(series) > MAX_POINTS:
                    del series[1::2]  # keep the first point (the baseline) and every other one

    def follow_renamed(self, roots: list[Root]) -> None:
        """A holder measured under a name that is gone and now held under another (a helper's local
        returned to its caller, `history = train()`): its series goes on under the new name."""
        with self._lock:
            names = {root.name for root in roots}
            gone = {object_id: name for name, object_id in self._object_ids.items() if name not in names}
            for root in roots:
                old = gone.pop(id(root.obj), None)
                if old is None or root.name in self._series or old not in self._series:
                    continue
                self._series[root.name] = self._series.pop(old)
                self.kinds[root.name] = self.kinds.pop(old, "tensors")
                self.last_stats.pop(old, None)  # paths under the old name: the scan at the end measures it again
                self._object_ids[root.name] = self._object_ids.pop(old)

    def restart(self) -> None:
        """A better step clock replaced the current one: the steps recorded so far mean something else."""
        with self._lock:
            self._series.clear()
            self.last_stats.clear()
        self.schedule.restart(self.scans)

    def tracked(self) -> set[str]:
        """The names measured as holders during the run (their figures change: never reused)."""
        with self._lock:
            return set(self._series)

    def snapshot(self) -> dict[str, list[tuple[int, int]]]:
        with self._lock:
            return {name: list(points) for name, points in self._series.items()}

    def measured(self) -> list[RootStats]:
        """What the last scan that measured each holder found (any thread)."""
        with self._lock:
            return list(self.last_stats.values())
