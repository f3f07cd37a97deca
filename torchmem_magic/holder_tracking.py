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
import time
from collections.abc import Callable
from dataclasses import replace

from .scan.results import Budget, Root, RootStats
from .scan.plain_lists import PlainListMemo
from .scan.scanner import scan_roots
from .suspects import classify

#: Few nodes per scan: touching tens of thousands of nodes of one long autograd chain from Python
#: makes its later deletion overflow the C stack, and scans repeat, so a run touches at most
#: MAX_SCANS x 200 nodes of any chain (the end-of-cell scan adds its own 20,000).
MID_RUN_BUDGET = Budget(time_s=0.05, graph_node_cap=200, max_findings=0)


def mid_run_budget(sequence_floor: int) -> Budget:
    """The scans' limits; a chain's unwalked part is counted only down to `sequence_floor`, the autograd
    sequence number when the run began (earlier runs' nodes carry lower numbers)."""
    return replace(MID_RUN_BUDGET, sequence_floor=sequence_floor)
MAX_SCANS = 66
#: scans thin out as the run goes on (each waits a quarter of the run so far), so MAX_SCANS cover
#: the first seconds densely and still reach hours into a long run
GAP_SHARE_OF_RUN = 0.25
#: the first scans also come at steps 2, 4, 8, ... (each at twice the last scan's step), budget permitting:
#: a fast loop makes hundreds of steps within the time gaps, and a holder's growth is judged per step
STEP_PACED_SCANS = 6
CHEAP_OBJECTS = 10_000  # a name whose scan met fewer objects than this is cheap to re-measure
MAX_HOLDERS = 32
MAX_POINTS = 64
FULL_SCAN_EVERY = 5
#: `due_at` reads the clock only now and then: the steps between two readings span at most half the time
#: left to wait (at the step period the last two readings measured) and at most this share of the whole
#: wait, and never more than MAX_UNCHECKED_STEPS. Reading at most every 1/250 of a wait keeps a minute
#: of 0.2 ms steps to a reading every ~40 steps; what it costs is how late a scan can be when the steps
#: suddenly turn slower (see `due_at`)
UNCHECKED_SHARE_OF_WAIT = 0.004
MAX_UNCHECKED_STEPS = 1024
_NEVER = 1 << 62  # a step no loop reaches


class HolderTracker:
    """Each holder's retained bytes at scans during the run: `{name: [(step, bytes), ...]}`.

    Args:
        roots: where to look (the same provider the end-of-cell scan uses).
        baseline: retained bytes per name before the cell (their series start at step 0).
        cheap: names whose scan before the cell met few objects: re-measured at every scan (an empty
            list that the loop fills is one); the others only at the full scans.
        full_scan_cost_s: what a scan of everything is expected to cost (the scan before the cell
            tells), so the first full scan also waits for room in the budget.
        sequence_floor: the autograd sequence number when the run began (see `mid_run_budget`).
        budget_share: most of the run's wall time the scans may take, beyond a one-off `start_allowance_s`
            that lets the first scans come quickly (a holder is named within a few dozen steps).
        start_allowance_s: the one-off, in the training thread's CPU time: on a busy machine a scan's
            wall time stretches with the other processes' share of the core, and an allowance in wall
            time would then buy fewer of the first scans than a quiet machine gives (too few to judge a
            short loop's holder). The share above is wall time over wall time, which the load stretches
            alike.
        min_gap_s: least time between two scans.
        clock: seconds (injectable for tests).
        cpu_clock: the training thread's CPU seconds (the scans run there); by default `clock` where one
            is injected, else the thread's CPU clock.
    """

    def __init__(
        self,
        roots: Callable[[], list[Root]],
        baseline: dict[str, int] | None = None,
        cheap: set[str] | None = None,
        full_scan_cost_s: float = 0.0,
        sequence_floor: int = 0,
        budget_share: float = 0.01,
        start_allowance_s: float = 0.06,
        min_gap_s: float = 0.02,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] | None = None,
    ) -> None:
        self._roots = roots
        self._budget = mid_run_budget(sequence_floor)
        self._baseline = dict(baseline or {})
        self._cheap = set(cheap or ())
        self._budget_share = budget_share
        self._min_gap_s = min_gap_s
        self._clock = clock
        self._cpu_clock = cpu_clock or (time.thread_time if clock is time.perf_counter else clock)
        self._plain_lists = PlainListMemo()  # the records a scan checked are not checked again at the next
        self._lock = threading.Lock()  # series are written here and read by the live figure's thread
        self._series: dict[str, list[tuple[int, int]]] = {}
        self._object_ids: dict[str, int] = {}  # name -> id of the object it held at the scans (ids only)
        self.kinds: dict[str, str] = {}  # name -> suspect kind at the last scan ("autograd-graph", ...)
        self.last_stats: dict[str, RootStats] = {}  # name -> what the last scan that measured it found
        self._started_s: float | None = None  # the first step: setup before the loop does not count
        self._next_scan_s = 0.0
        self._budget_ready_s = 0.0  # when the scans so far are back within the budget
        self._next_scan_step = 0  # a step-paced scan is due at this step, time gaps aside (_NEVER: no more)
        self._paced_from = 0  # the scan count when the current step clock began
        self._check_at_step = 0  # `due` reads the clock at this step next; before it, nothing can be due
        self._wait_from_s = 0.0  # when the current wait began (the last scan's end, or the first step)
        self._read_s = 0.0  # the last clock reading and its step (_NEVER: none to measure from)
        self._read_at_step = _NEVER
        self._step_period_s = float("inf")  # measured between the last two readings (inf: not known)
        self._unnumbered_steps = 0  # the calls of `due` without a step
        self.scans = 0
        self.spent_s = 0.0
        self._allowance_left_cpu_s = start_allowance_s
        self._charged_s = 0.0  # the scans' wall time beyond what the allowance covered
        self._full_cost_s = min(full_scan_cost_s, MID_RUN_BUDGET.time_s)  # what the last scan of everything cost
        self.counted_storages: frozenset[tuple[object, ...]] = frozenset()  # what the scans reached (keys only)
        self._search_wanted: Callable[[int], list[Root]] | None = None  # a search back, run at the next scan
        self.found_roots: list[Root] = []  # holders no name reaches, found searching back: measured from then on

    def due(self, step: int | None = None) -> bool:
        """Whether a scan may run now, at `step` (see `due_at`); without `step`, only the time-paced
        scans come, each call counted as a step."""
        if step is None:
            self._unnumbered_steps += 1
            return self.due_at(self._unnumbered_steps, False)
        return self.due_at(step)

    def due_at(self, step: int, numbered: bool = True) -> bool:
        """Whether a scan may run now, at `step` (called at every step: most only compare `step` with the
        step of the next clock reading).

        The step-paced scans come at the very steps a reading at every step would give. So do the
        time-paced ones (and a step-paced one waiting for the budget) while the steps take less than
        twice the period the last two readings measured: the next reading is at most half the time
        left away. Steps that suddenly turn k times slower make a scan late by at most
        k x UNCHECKED_SHARE_OF_WAIT of its wait (tenfold: 4%; a hundredfold: 40%) and by at most
        MAX_UNCHECKED_STEPS steps; the next reading measures the new period. At a reading, each
        attribute is read once and min/max are spelled as comparisons (a builtin's call costs more
        than the arithmetic)."""
        if step < self._check_at_step:
            return False
        now = self._clock()
        if self._started_s is None:
            self._started_s = self._wait_from_s = now
        read_at_step = self._read_at_step
        if step > read_at_step:
            self._step_period_s = (now - self._read_s) / (step - read_at_step)
        self._read_s, self._read_at_step = now, step
        next_scan_step = self._next_scan_step if numbered else _NEVER
        wake_s = self._budget_ready_s if step >= next_scan_step else self._next_scan_s
        if now >= wake_s:
            self._check_at_step = 0  # read again at the next step, should no scan follow
            return True
        unread_s = UNCHECKED_SHARE_OF_WAIT * (wake_s - self._wait_from_s)
        left_s = 0.5 * (wake_s - now)
        if left_s < unread_s:
            unread_s = left_s
        period_s = self._step_period_s
        if unread_s >= MAX_UNCHECKED_STEPS * period_s:
            next_check = step + MAX_UNCHECKED_STEPS
        elif unread_s >= 2.0 * period_s:
            next_check = step + int(unread_s / period_s)
        else:
            next_check = step + 1
        if step < next_scan_step < next_check:
            next_check = next_scan_step
        self._check_at_step = next_check
        return False

    def want_search(self, search: Callable[[int], list[Root]]) -> None:
        """Run `search(step)` at the next scan (any thread may ask), as soon as the budget allows: the roots
        it returns are measured at that scan and every one after. Its time counts in `spent_s` but not
        against the budget: it is bounded by its own limit and comes once, and charged, it would hold the
        scans that show whether what it found grows back for a hundred times as long."""
        self._search_wanted = search
        self._next_scan_s = self._budget_ready_s
        self._check_at_step = 0

    def scan(self, step: int) -> None:
        """Measure the holders now, at `step`; then wait until the scans' share of the run is back
        under the budget.

        Most scans look only at the holders already tracked and the names new in the cell (cheap);
        every FULL_SCAN_EVERY-th looks at everything, when the budget has room for what the last
        full scan cost (a long session's namespace can take the whole 50 ms)."""
        search, self._search_wanted = self._search_wanted, None
        started, cpu_started = self._clock(), self._cpu_clock()
        try:
            if search is not None:
                self.found_roots.extend(search(step))
                self.spent_s += self._clock() - started
                started, cpu_started = self._clock(), self._cpu_clock()
            loop_started_s = started if self._started_s is None else self._started_s
            allowed_s = self._allowance_left_cpu_s + self._budget_share * (started - loop_started_s)
            full = self.scans % FULL_SCAN_EVERY == FULL_SCAN_EVERY - 1 and self._charged_s + self._full_cost_s <= allowed_s
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
        now, cpu_s = self._clock(), self._cpu_clock() - cpu_started
        wall_s = now - started
        self.spent_s += wall_s
        if full:
            self._full_cost_s = wall_s
        covered = 1.0 if cpu_s <= self._allowance_left_cpu_s else self._allowance_left_cpu_s / cpu_s
        self._allowance_left_cpu_s = max(0.0, self._allowance_left_cpu_s - cpu_s)
        self._charged_s += wall_s * (1.0 - covered)
        # the scans so far stay within budget_share of the run when the next one waits until then
        gap_s = max(self._min_gap_s, GAP_SHARE_OF_RUN * (now - loop_started_s))
        self._budget_ready_s = loop_started_s + self._charged_s / self._budget_share
        self._next_scan_s = max(now + gap_s, self._budget_ready_s)
        self._next_scan_step = 2 * max(step, 1) if self.scans - self._paced_from < STEP_PACED_SCANS else _NEVER
        # the next step reads the clock and measures the step period from here: the scan is no step's time
        self._read_s = self._wait_from_s = now
        self._check_at_step = 0 if self.scans < MAX_SCANS else _NEVER

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
        self._next_scan_step, self._paced_from = 0, self.scans
        # its step 1 reads the clock (the old clock's last reading was at a later step: no period is
        # measured across the two)
        self._check_at_step = 0 if self.scans < MAX_SCANS else _NEVER

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
