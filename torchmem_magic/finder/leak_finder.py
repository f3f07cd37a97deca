"""The leak finder of one run: what each name held before it (the baseline), the bounded scans between
steps during it (`HolderTracker`), and the suspects at its end. It owns the user's roots provider and
lets go of it when the run ends, so nothing of the user's is kept."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .holder_tracking import CHEAP_OBJECTS, HolderTracker
from .scan_schedule import FULL_SCAN_EVERY, NEVER
from ..analysis.holders import HolderSearch
from ..analysis.holder_trends import (
    MIN_GROWTH_BYTES, at_its_last_level, first_named_step, holder_trend, rose_in_few_scans, with_trends,
)
from ..render.advice.holders import live_holder_line
from ..core.model import Suspect
from .scan.memo import ScanMemo, scan_reusing
from .scan.referrers import (
    BackSearch, HeldElsewhere, by_size_class, live_storages, named_roots, opaque_registry_sizes, search_back,
)
from .scan.introspect import boundary_types, is_boundary
from .scan.results import Budget, Root, RootStats, StartScan, mostly
from .scan.scanner import scan_roots
from .suspects import baseline_of, fix_elsewhere, growing_suspect, suspects_from_scan, suspects_from_stats

START_SCAN_BUDGET = Budget(time_s=0.3)  # before the cell: only per-name totals are needed
END_SCAN_BUDGET = Budget(time_s=1.0)
#: where no holder grew: the search back from live tensors, and the measure of each root it finds
SEARCH_BACK_S = 1.0
#: entries a registry in C (atexit's callbacks) must gain in a run to be said where a search found nothing
OPAQUE_MIN_ENTRIES = 10
#: a root found searching back holds at least this share of what the run grew (a library's constants do not)
FOUND_SHARE_OF_GROWTH = 0.1
HELD_ELSEWHERE_BUDGET = Budget(time_s=0.2, max_findings=0)
#: the same search mid-run (the live verdict sees growth no holder's scans show), on the training thread
#: between two steps, in this much CPU time; one that finds nothing a scan can follow is tried again once the
#: run has gone on as long again, with twice the time, MID_RUN_SEARCHES in all
MID_RUN_SEARCH_S = 0.25
MID_RUN_SEARCHES = 3
#: it searches from this many storages, up to MID_RUN_STORAGES_PER_SIZE of each size (see `by_size_class`)
MID_RUN_STORAGES = 48
MID_RUN_STORAGES_PER_SIZE = 8
MID_RUN_MEASURE_BUDGET = Budget(time_s=0.05, max_findings=0)
#: the end-of-cell scan reuses the last scan of a name unchanged since only when scanning it again would
#: meet this many objects or more (a few milliseconds); smaller ones are scanned again in any case
REUSE_MIN_OBJECTS = 2_000

HolderSeries = dict[str, list[tuple[int, int]]]


@dataclass(frozen=True)
class LeakSearch:
    """Where a run's leak finder looks, and in which code a holder's fix line is looked for.

    Args:
        roots: the places to scan (called before, during and at the end of the run).
        sources: code that may hold the fix line; the list itself is kept, so a roots provider can
            add the source of functions it finds running during the run.
        inherited: the scan before the run of the watcher this process was forked from (a rank then
            neither collects garbage nor scans again what that scan saw).
    """

    roots: Callable[[], list[Root]]
    sources: list[str] = field(default_factory=list)
    inherited: StartScan | None = None


def _autograd_sequence_nr() -> int:
    """The number autograd gives the next node made on this thread (nodes are numbered as created)."""
    import torch

    with torch.enable_grad():
        node = (torch.zeros(1, requires_grad=True) * 1).grad_fn
    try:
        return int(node._sequence_nr()) if node is not None else 0
    except Exception:
        return 0


def with_end_points(series: HolderSeries, measured: list[RootStats], last_step: int) -> HolderSeries:
    """The holders' series with what the end-of-cell scan measured of each, at the run's last step, where
    the scans during the run did not show it growing. They thin out (each waits a quarter of the run so
    far, and for the budget), so a short loop's series can stop long before its end: a holder whose growth
    over the scans fell short of a leak's minimum, or that too few scans measured, had grown by the end.
    A series that shows growth already keeps its own points (its rises say between which steps it grew;
    one from its last scan to the end would span the run's last part), unless the end found it where its
    last scan did: then its growth stopped there, which only that point tells (a cache filled early on,
    whose scans thinned out before the run's flat rest). Only holders the run measured get a point, and
    only a whole figure (a scan cut short reads as a fall)."""
    out = dict(series)
    for stats in measured:
        points = out.get(stats.name)
        if (points and last_step > points[-1][0] and not stats.truncated and stats.tensors
                and (not holder_trend(stats.name, points).growing or at_its_last_level(points, stats.retained_bytes))):
            out[stats.name] = [*points, (last_step, stats.retained_bytes)]
    return out


def _big_enough(held: HeldElsewhere, back: BackSearch, grown_bytes: float) -> bool:
    """Whether a root found searching back holds enough to be where the growth went: FOUND_SHARE_OF_GROWTH of
    it, or of the bytes searched where the search covered less than the run grew (the largest storages only)."""
    return held.tensor_bytes >= FOUND_SHARE_OF_GROWTH * min(grown_bytes, back.bytes_searched)


def _never(step: int) -> bool:
    return False


def _nothing() -> None:
    pass


class LeakFinder:
    """One run's scans (see the module's docstring); `memo` carries names' scans from run to run."""

    def __init__(self, search: LeakSearch, memo: ScanMemo, keep_scanned_holders: bool) -> None:
        self._search = search
        self._roots: Callable[[], list[Root]] | None = search.roots
        self.sources = search.sources
        self._inherited = search.inherited
        self._memo = memo
        self._keep_scanned = keep_scanned_holders
        self.start_scan: StartScan | None = None
        self._baseline: dict[str, int] = {}
        self._places_before: dict[str, dict[str, int]] = {}  # where each name kept its tensors before the run
        self._tracker: HolderTracker | None = None
        #: whether a scan is due at a step: the tracker's own check once started (the session calls it at
        #: every step, so it is the tracker's bound method itself, not a method of ours in between)
        self.scan_due: Callable[[int], bool] = _never
        #: opens the step gate: a scan asked for from another thread comes at the next step
        self.wake_steps: Callable[[], None] = _nothing
        self._final_series: HolderSeries = {}
        self.first_named_step: int | None = None  # when the live status line first named a holder
        self.on_accelerator: frozenset[str] = frozenset()  # holders whose tensors are mostly on a device
        self.in_shared_memory: frozenset[str] = frozenset()  # ... mostly in shared-memory segments
        self._scans, self._spent_s = 0, 0.0  # kept once the tracker is let go
        self._end_storages: frozenset[tuple[object, ...]] = frozenset()  # what the end scan counted
        self._end_reused: frozenset[str] = frozenset()  # the names whose end figures a memo gave
        self._live_line: tuple[int, str | None] = (-1, None)  # (scans it was computed at, the line)
        self._searches = 0  # mid-run searches back asked for
        self._next_search_s = 0.0  # (monotonic) the next may be asked for from then on
        self._started_s = 0.0  # (monotonic) when the run began
        self._growing_at: tuple[int, bool] = (-1, False)  # (scans, whether a holder grew in them)
        self._found_mid_run: dict[str, HeldElsewhere] = {}  # holders it found (their objects let go: `obj=None`)
        self._mid_run_covered: BackSearch | None = None  # what the last mid-run search that found some covered
        self._registries_before: dict[str, int] = {}  # the sizes of the registries in C when the run began

    @property
    def inherits_scan(self) -> bool:
        return self._inherited is not None

    def start(self) -> None:
        """What each name holds before the run; with an inherited scan, only the names that scan did
        not see (a rank's training function's locals)."""
        assert self._roots is not None
        self._started_s = time.monotonic()
        self._registries_before = opaque_registry_sizes()
        inherited = self._inherited
        roots = self._roots()
        if inherited is None:
            before = scan_reusing(self._memo, roots, START_SCAN_BUDGET)
            cost_s = max(before.elapsed_s, self._memo.full_scan_cost_s)
        else:
            before = scan_roots([r for r in roots if r.name not in inherited.baseline], START_SCAN_BUDGET)
        del roots
        self._places_before = {s.name: dict(s.places) for s in before.roots if s.places}
        cheap = frozenset(
            s.name for s in before.roots if s.objects + s.plain_objects < CHEAP_OBJECTS and not s.truncated
        )
        if inherited is None:
            self.start_scan = StartScan(baseline_of(before), cheap, cost_s)
        else:
            self.start_scan = StartScan(
                {**inherited.baseline, **baseline_of(before)}, inherited.cheap | cheap, inherited.cost_s
            )
        self._baseline = dict(self.start_scan.baseline)
        self._tracker = HolderTracker(
            self._roots, self._baseline, set(self.start_scan.cheap), self.start_scan.cost_s,
            sequence_floor=_autograd_sequence_nr(),
        )
        self.scan_due = self._tracker.due_at

    def forked_search(self) -> dict[str, Any]:
        """What a rank forked from this process looks for (RankSettings' fields): the same roots, the
        sources known so far, and this scan before the run, so that it is not made again there."""
        return {"roots": self._search.roots, "sources": tuple(self.sources), "inherited_scan": self.start_scan}

    # ---------------------------------------------------------------- during the run (training thread)
    def at_step(self, step: int) -> None:
        """Cheap unless a scan is due: then the holders are measured now, between two steps."""
        if self.scan_due(step):
            self.scan(step)

    def scan(self, step: int) -> None:
        """Measure the holders now, at `step` (when `scan_due(step)` said so)."""
        if self._tracker is not None:
            self._tracker.scan(step)

    def restart(self) -> None:
        """A better step clock replaced the current one: the steps recorded so far mean something else."""
        if self._tracker is not None:
            self._tracker.restart()

    def wake_if_scan_due(self) -> None:
        """Sampler thread: a scan whose time has come is looked at by the loop's next step."""
        if self._tracker is not None and self._tracker.schedule.due_by_time():
            self.wake_steps()

    @property
    def next_check_step(self) -> int:
        """No scan can be due before this step (the steps before it need not ask)."""
        return self._tracker.schedule.check_at_step if self._tracker is not None else NEVER

    def want_search(self, grown_bytes: float) -> None:
        """The live verdict sees `grown_bytes` of growth that no holder's scans show: search back from the
        live tensors once, at the next scan, for holders no name reaches; the scans measure them from then
        on, so their growth is shown as any holder's is. Any thread may ask; the training thread searches."""
        tracker = self._tracker
        if tracker is None or not self.search_possible() or self._a_holder_grows(tracker):
            return
        self._searches += 1
        self._next_search_s = math.inf  # until this one has run
        tracker.want_search(functools.partial(self._found_now, grown_bytes))
        self.wake_steps()

    def search_possible(self) -> bool:
        """Whether `want_search` could ask for a search now (cheap: no verdict is worth working out
        for it otherwise): scans enough to judge, a search left, and its time come."""
        tracker = self._tracker
        if tracker is None or self._searches >= MID_RUN_SEARCHES or tracker.scans < FULL_SCAN_EVERY:
            return False
        return time.monotonic() >= self._next_search_s

    @property
    def searches_spent(self) -> bool:
        """Whether every mid-run search back was asked for and has run (no more will come)."""
        return self._searches >= MID_RUN_SEARCHES and self._next_search_s != math.inf

    def _a_holder_grows(self, tracker: HolderTracker) -> bool:
        """Whether some holder's scans show it growing; judged again only after a new scan (asked every
        second while the live verdict says leak)."""
        scans, grows = self._growing_at
        if scans != tracker.scans:
            scans = tracker.scans
            grows = any(holder_trend(name, points).growing for name, points in tracker.snapshot().items())
            self._growing_at = (scans, grows)
        return grows

    def _found_now(self, grown_bytes: float) -> list[Root]:
        """The holders a search back finds now that no name reaches (each big enough to be where
        `grown_bytes` went), as roots for the scans; the training thread calls it, between two steps."""
        tracker, roots = self._tracker, self._roots() if self._roots is not None else []
        try:
            if tracker is None:
                return []
            storages = by_size_class(live_storages(tracker.counted_storages), MID_RUN_STORAGES, MID_RUN_STORAGES_PER_SIZE)
            cpu_s = MID_RUN_SEARCH_S * 2 ** (self._searches - 1)
            back = search_back(storages, named_roots(roots), cpu_s)
            del storages
            names, machinery = {r.name for r in roots}, boundary_types()
            # a registry's object (a logging handler) is left to the search at the end: the scans read into the
            # process' machinery only where a notebook name keeps it
            found = [Root(h.name, "user", h.obj_path, h.obj) for h in back.held
                     if h.name not in names and _big_enough(h, back, grown_bytes)
                     and not is_boundary(type(h.obj), machinery)]
            # only what a scan measures can be followed (a C object's cache, such as a partial's, is not)
            measured = {s.name: s.retained_bytes for s in scan_roots(found, MID_RUN_MEASURE_BUDGET).roots if not s.truncated}
            held = {h.name: h for h in back.held}
            found = [r for r in found if 2 * measured.get(r.name, 0) >= held[r.name].tensor_bytes]
            self._found_mid_run.update((r.name, replace(held[r.name], obj=None)) for r in found)
            if found:
                self._mid_run_covered = replace(back, held=())
            return found
        finally:
            del roots  # the user's objects: not kept by the traceback of an interrupt in the search
            now = time.monotonic()
            self._next_search_s = now + (now - self._started_s)

    # ---------------------------------------------------------------- the end
    def finish(self, scan: bool = True, last_step: int = 0) -> tuple[Suspect, ...]:
        """The suspects at the end; `scan=False` (an interrupt while the end scan ran): none. `last_step`:
        the run's steps (0: none); the end scan's figure of each holder measured during the run is the
        last point of its series. The roots are kept for `search_unheld` until `close()`."""
        tracker = self._tracker
        roots = self._roots() if scan and self._roots is not None else None
        if roots is not None and tracker is not None:
            roots += tracker.found_roots
        try:
            if tracker is not None:
                if roots is not None:
                    tracker.follow_renamed(roots)
                self._final_series = tracker.snapshot()
                self.first_named_step = first_named_step(self._final_series)
            if roots is None:
                return ()
            tracked = tracker.tracked() if tracker is not None else set()
            # the names cheap to scan are scanned again, whatever their fingerprint says
            result = scan_reusing(self._memo, roots, END_SCAN_BUDGET, rescan=tracked, min_objects=REUSE_MIN_OBJECTS)
            self._end_storages, self._end_reused = result.storages, result.reused
            self._final_series = with_end_points(self._final_series, result.roots, last_step)
            latest = {s.name: s for s in (tracker.measured() if tracker is not None else [])}
            latest.update((s.name, s) for s in result.roots)
            self.on_accelerator = frozenset(name for name, s in latest.items() if mostly(s.accelerator_bytes, s))
            self.in_shared_memory = frozenset(name for name, s in latest.items() if mostly(s.shared_bytes, s))
            found = suspects_from_scan(result, self.sources, self._baseline)
            found.extend(self._growing_holders(result.roots, {s.name for s in found}))
            if self._keep_scanned and tracker is not None:
                names = {s.name for s in found}
                gone = [stats for stats in tracker.measured() if stats.name not in names]
                found = [*found, *suspects_from_stats(gone, self.sources, self._baseline)]  # the Report orders them
            return tuple(self._as_found_elsewhere(s) for s in found)
        finally:
            roots = None  # the user's objects: not kept by the traceback of an interrupt in the scan
            if not scan:
                self.close()

    def found_mid_run(self, suspects: Sequence[Suspect]) -> HolderSearch | None:
        """The holders a search back found mid-run that the report has as new in the run with too few scans
        since for a trend of their own: said as what the search found (as at the end), since no line on a
        trend can say where the memory went."""
        covered = self._mid_run_covered
        found = tuple(s for s in suspects if s.name in self._found_mid_run and s.new_in_cell
                      and holder_trend(s.name, s.series).growth_per_step is None)
        if covered is None or not found:
            return None
        return HolderSearch(found, 0, covered.storages_searched, covered.storages_live, covered.cut_short,
                            covered.elapsed_s)

    def search_unheld(self, last_step: int, grown_bytes: float) -> HolderSearch | None:
        """Where the memory is when no holder grew in the scans (see `HolderSearch`): the names a memo gave
        the end scan's figures for, scanned afresh and compared with their size before the run; where none
        grew, a search back from the live tensors no scan reached, whose holders come first the closer they
        are to what the run grew (`grown_bytes`: they have no size before the run to compare with). None
        once the roots were let go."""
        if self._roots is None:
            return None
        roots = self._roots()
        try:
            fresh = scan_roots([r for r in roots if r.name in self._end_reused], END_SCAN_BUDGET)
            grown = [s for s in fresh.roots if s.retained_bytes - self._baseline.get(s.name, 0) >= MIN_GROWTH_BYTES]
            found = [self._grown_suspect(s, last_step) for s in grown]
            if found:
                return HolderSearch(tuple(found), len(fresh.roots), 0, 0, fresh.truncated, fresh.elapsed_s)
            storages = live_storages(self._end_storages | fresh.storages)
            back = search_back(storages, named_roots(roots), SEARCH_BACK_S)
            del storages
            big = [h for h in back.held if _big_enough(h, back, grown_bytes)]
            held = tuple(sorted((self._held_suspect(h) for h in big),
                                key=lambda s: abs(math.log(max(s.retained_bytes, 1) / max(grown_bytes, 1.0)))))
            return HolderSearch(held, len(fresh.roots), back.storages_searched, back.storages_live, back.cut_short,
                                fresh.elapsed_s + back.elapsed_s, self._opaque_grown())
        finally:
            del roots  # the user's objects: not kept by the traceback of an interrupt in the search

    def _opaque_grown(self) -> tuple[tuple[str, int], ...]:
        """The registries in C that gained at least OPAQUE_MIN_ENTRIES entries since the run began."""
        before = self._registries_before
        return tuple((name, size - before.get(name, size)) for name, size in opaque_registry_sizes().items()
                     if size - before.get(name, size) >= OPAQUE_MIN_ENTRIES)

    def _as_found_elsewhere(self, suspect: Suspect) -> Suspect:
        """A holder the mid-run search found is named for what it is, with its way down and its fix (a
        rule's fix speaks of a notebook name); its size before the run is not known, so it holds memory new
        in the run where its scans since the search saw it grow."""
        held = self._found_mid_run.get(suspect.name)
        if held is None:
            return suspect
        series = self._final_series.get(suspect.name, [])
        trend = holder_trend(suspect.name, series)
        grew = trend.growing or (trend.growth_per_step is None and rose_in_few_scans(series))
        return replace(suspect, path=held.path, new_in_cell=grew, fix=fix_elsewhere(held.name, held.path, held.kind))

    def _grown_suspect(self, stats: RootStats, last_step: int) -> Suspect:
        """A name the memo stood in for that grew since before the run: the suspect its own scan makes."""
        growth = stats.retained_bytes - self._baseline.get(stats.name, 0)
        classified = suspects_from_stats([stats], self.sources)
        suspect = classified[0] if classified else growing_suspect(
            stats, self.sources, self._baseline, self._places_before.get(stats.name), growing=False
        )
        if suspect is None:
            suspect = Suspect(
                stats.name, stats.path, "tensor-cache", stats.tensors, stats.graph_nodes, stats.retained_bytes, True,
                fix_elsewhere(stats.name, stats.path, "notebook"),
            )
        return replace(suspect, growth_per_step=growth / last_step if last_step else None)

    def _held_suspect(self, held: HeldElsewhere) -> Suspect:
        """A holder found searching back: its retained bytes as a scan of it measures them (at least what
        the search found it the nearest root of)."""
        scanned = scan_roots([Root(held.name, "user", held.path, held.obj)], HELD_ELSEWHERE_BUDGET).roots
        retained = max([held.tensor_bytes, *(s.retained_bytes for s in scanned)])
        nodes = sum(s.graph_nodes for s in scanned)
        kind = "autograd-graph" if nodes else "tensor-cache"
        return Suspect(held.name, held.path, kind, held.tensors, nodes, retained, True,
                       fix_elsewhere(held.name, held.path, held.kind))

    def _growing_holders(self, measured: list[RootStats], named: set[str]) -> list[Suspect]:
        """The holders no rule on a single scan names that grew: with the steps in the scans during the
        run, or, for a name too big for them, inside one of its containers (`growing_suspect`)."""
        series = self._final_series
        found = []
        for stats in measured:
            if stats.name in named or stats.kind != "user":
                continue
            # a series too short to judge (the baseline, a scan, the end) is no "bounded": judged as unmeasured
            trend = holder_trend(stats.name, series.get(stats.name, []))
            if trend.bounded:
                continue
            before = self._places_before.get(stats.name)
            suspect = growing_suspect(stats, self.sources, self._baseline, before, growing=trend.growing)
            if suspect is not None:
                found.append(suspect)
        return found

    def close(self) -> None:
        """Let go of the roots provider (it may reference the user's namespace); idempotent."""
        if self._tracker is not None:
            self._scans, self._spent_s = self._tracker.scans, self._tracker.spent_s
            if not self._final_series:
                self._final_series = self._tracker.snapshot()
            self._tracker.let_go()
        self._roots = self._tracker = None
        self.scan_due = _never

    # ---------------------------------------------------------------- what observers read (any thread)
    @property
    def scans(self) -> int:
        """Scans during the run so far."""
        return self._tracker.scans if self._tracker is not None else self._scans

    @property
    def spent_s(self) -> float:
        """Wall time those scans took (on the training thread)."""
        return self._tracker.spent_s if self._tracker is not None else self._spent_s

    def evidence_fields(self) -> dict[str, Any]:
        """The run's evidence that the leak finder gathered (fields of RunEvidence), once it finished."""
        return {"holder_series": self.series(), "live_suspects_at_step": self.first_named_step,
                "holders_on_accelerator": self.on_accelerator, "holders_in_shared_memory": self.in_shared_memory}

    def series(self) -> HolderSeries:
        """Each holder's (step, retained bytes) points so far; once finished, with the end scan's points."""
        if self._final_series or self._tracker is None:
            return dict(self._final_series)
        return self._tracker.snapshot()

    def holders_so_far(self) -> tuple[HolderSeries, tuple[Suspect, ...]]:
        """The holders' series and, as suspects, what the last mid-run scan saw of each."""
        tracker = self._tracker
        if tracker is None:
            return {}, ()
        series, stats = tracker.snapshot(), tracker.measured()
        return series, with_trends(tuple(suspects_from_stats(stats, self.sources, self._baseline)), series)

    def live_holder(self, clock: str) -> str | None:
        """The fastest-growing holder so far ('val_outputs +2.9 MiB/step, autograd graphs'), from the
        scans during the run; recomputed only after a new scan."""
        tracker = self._tracker
        if tracker is None:
            return self._live_line[1]
        if tracker.scans != self._live_line[0]:
            series = tracker.snapshot()
            trends = [holder_trend(name, points) for name, points in series.items()]
            self._live_line = (tracker.scans, live_holder_line(trends, tracker.kinds, clock))
        return self._live_line[1]
