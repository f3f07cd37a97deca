"""Scale, measured through the real code paths: a namespace of a million objects, an autograd graph of
100,000 nodes held by one global, 64 ranks streaming to one watcher, a day-long run.

1. A million objects (`million_namespace`): the leak finder of a cell (`LeakFinder`) scans the whole
   namespace before a new kernel's first cell (an empty memo), reuses that scan before a later cell,
   scans during the run (a full mid-run scan, with the run's memo of plain lists) and at the cell's end;
   `own_memory.scan_peak` gives what the scan itself allocates.
2. A 100,000-node graph held by one name: one loss summed from ~33,000 terms (one long chain), or a list
   of ~14,300 small losses; the scans of a cell (first, during the run, at the end) and what they report.
3. 64 ranks: 64 forked processes stream the real message format (a `RankAgent`'s outbox, sender and
   `on_tick`, rows every default interval, a message every stream period) to a real watching session
   (its `RankFeeds`, polled by its sampler thread, and the live figure); the watcher's CPU per second,
   its final report of 64 ranks, and, on 64 feeds holding a simulated hour each, the ranks' live
   verdicts, the ranks panel's update (the widget models, on the Python side), the final report.
4. A day: `live_cost.simulated_run` (the live view's redraws) and `own_memory.session_memory` (24 h).

Run: python bench/scale.py [--no-day]   (~6 min without the day, ~25 with it; `BENCH_SCALE_DAY=0 python
bench/run_all.py scale` cites the day's tables instead of running them)
"""

from __future__ import annotations

import gc
import math
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import live_cost  # noqa: E402
import own_memory  # noqa: E402

from torchmem_magic.core import resources
from torchmem_magic.agent.rank import STREAM_PERIOD_S, RankAgent  # noqa: E402
from torchmem_magic.api import _module_roots  # noqa: E402
from torchmem_magic.finder.leak_finder import END_SCAN_BUDGET, START_SCAN_BUDGET, LeakFinder, LeakSearch  # noqa: E402
from torchmem_magic.finder.holder_tracking import mid_run_budget  # noqa: E402
from torchmem_magic.session.live_view import LiveView  # noqa: E402
from torchmem_magic.report.merge import with_ranks  # noqa: E402
from torchmem_magic.core.model import Clock  # noqa: E402
from torchmem_magic.probes import process as process_probe  # noqa: E402
from torchmem_magic.core.options import DEFAULT_INTERVAL_MS, SessionOptions  # noqa: E402
from torchmem_magic.ranks.feed import RankFeeds, rank_numbers  # noqa: E402
from torchmem_magic.stream.feed import RankFeed, apply_message  # noqa: E402
from torchmem_magic.ranks.live import MAX_REJUDGED_PER_CALL, LiveRanks, worst_live  # noqa: E402
from torchmem_magic.stream.protocol import evidence_fields, events_message, row_values  # noqa: E402
from torchmem_magic.ranks.settings import RankSettings  # noqa: E402
from torchmem_magic.finder.scan.memo import ScanMemo, scan_reusing  # noqa: E402
from torchmem_magic.finder.scan.plain_lists import PlainListMemo  # noqa: E402
from torchmem_magic.finder.scan.results import Root, RootStats  # noqa: E402
from torchmem_magic.finder.scan.scanner import scan_roots  # noqa: E402
from torchmem_magic.session.run import MemwatchSession  # noqa: E402
from torchmem_magic.finder.suspects import suspects_from_scan  # noqa: E402
from torchmem_magic.widgets.live import LiveFigure  # noqa: E402
from torchmem_magic.widgets.rank_curves import rank_curves  # noqa: E402

MIB = float(1 << 20)
RECORDS = 330_000  # a dict, its str and its int (past the small-int cache) each: ~1 M objects
TENSORS = 10_000
GRAPH_NODES = 100_000
RANKS = 64
STREAM_S = 20.0  # how long the 64 ranks stream
STEPS_PER_S = 20.0  # each simulated rank's steps
STEP_ROWS_PER_S = 2.0  # the step rows a rank files a second once its stride has settled
LEAKING_RANK = 7
LEAK_BYTES_PER_STEP = 64 * 1024.0
FEED_HOURS = 1.0  # what each of the 64 full feeds holds (their timelines are at capacity long before)
REPEATS = 5


@dataclass
class Row:
    """One line of the table."""

    scale: str
    measure: str
    figure: str
    goal: str
    load: str


@dataclass
class Loads:
    """The 1-minute load average around each measurement (the machine is shared)."""

    rows: list[Row] = field(default_factory=list)

    @contextmanager
    def measuring(self) -> Iterator[Callable[[str, str, str, str], None]]:
        """`add(scale, measure, figure, goal)` within the block; each row gets the load before–after it."""
        before = os.getloadavg()[0]
        pending: list[tuple[str, str, str, str]] = []
        yield lambda *cells: pending.append(cells)
        load = f"{before:.1f}–{os.getloadavg()[0]:.1f}"
        self.rows.extend(Row(*cells, load) for cells in pending)


def _median_s(fn: Callable[[], object], repeats: int = REPEATS, before: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _roots(namespace: dict[str, Any]) -> Callable[[], list[Root]]:
    return lambda: _module_roots(namespace)


# ----------------------------------------------------------------------------- 1. a million objects


def million_namespace() -> dict[str, Any]:
    """330,000 small records (a dict, a str and an int each) and 10,000 small tensors."""
    return {
        "records": [{"i": i, "s": str(i)} for i in range(1000, 1000 + RECORDS)],
        "tensors": [torch.zeros(4) for _ in range(TENSORS)],
    }


def _objects(namespace: dict[str, Any]) -> int:
    """The Python objects the namespace holds: the lists, the records and their values, the tensors."""
    return 2 + 3 * len(namespace["records"]) + len(namespace["tensors"])


def namespace_rows(loads: Loads) -> None:
    namespace = million_namespace()
    objects = _objects(namespace)
    roots = _roots(namespace)
    memo = ScanMemo()
    scale = f"{objects / 1e6:.2f} M objects"
    with loads.measuring() as add:
        first_s = _median_s(lambda: LeakFinder(LeakSearch(roots), memo, False).start(), before=memo.clear)
        memo.clear()
        first = scan_reusing(memo, roots(), START_SCAN_BUDGET)
        truncated = "truncated" if first.truncated else "complete"
        add(scale, "first cell's whole-namespace scan (a new kernel: empty memo)",
            f"{_ms(first_s)} ({first.objects:,} containers reached, {truncated})", "≤ 0.3 s (first cell)")
        later_s = _median_s(lambda: LeakFinder(LeakSearch(roots), memo, False).start())
        add(scale, "a later cell's scan before it (the memo's names reused)", _ms(later_s), "≤ 5 ms (a `-q` cell)")
    with loads.measuring() as add:
        budget = mid_run_budget(0)
        plain_lists = PlainListMemo()
        mid_first = scan_roots(roots(), budget, plain_lists=plain_lists)
        mid_later_s = _median_s(lambda: scan_roots(roots(), budget, plain_lists=plain_lists))
        mid_later = scan_roots(roots(), budget, plain_lists=plain_lists)
        add(scale, "a full holder scan during the run: the first / the next ones (plain lists known)",
            f"{_ms(mid_first.elapsed_s)} / {_ms(mid_later_s)} "
            f"({'truncated' if mid_first.truncated or mid_later.truncated else 'complete'})",
            f"≤ {budget.time_s * 1e3:.0f} ms a scan, 1% of the run")
        finder = LeakFinder(LeakSearch(roots), memo, False)
        finder.start()
        end_started = time.perf_counter()
        finder.finish()
        end_s = time.perf_counter() - end_started
        add(scale, "the scan at the cell's end (unchanged names reused)", _ms(end_s), "≤ 5 ms (a `-q` cell)")
    with loads.measuring() as add:
        peak = own_memory.scan_peak(namespace)
        add(scale, "memwatch's own memory: the scan's peak / the memo kept for the next cell",
            f"{peak['peak_mib']:.1f} MiB / {peak['memo_kib']:.1f} KiB", "bounded; nothing of the user's kept")


# ----------------------------------------------------------------------------- 2. a 100k-node graph


def chain_loss(nodes: int = GRAPH_NODES) -> tuple[torch.Tensor, int]:
    """One loss summed from ~nodes/3 terms (each a mul, a sum, an add): one long chain; (loss, its nodes)."""
    weight = torch.randn(8, requires_grad=True)
    total = (weight * 0.0).sum()
    made = 3  # the mul, the sum and the weight's AccumulateGrad
    while made < nodes:
        total = total + (weight * float(made)).sum()
        made += 3
    return total, made


def loss_list(nodes: int = GRAPH_NODES) -> tuple[list[torch.Tensor], int]:
    """Small MLP losses kept with their graphs (7 nodes each, beside the 4 shared by the parameters)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    count = math.ceil((nodes - 4) / 7)
    return [model(torch.randn(8, 32)).square().mean() for _ in range(count)], 7 * count + 4


def _stats(result_roots: list[RootStats], name: str) -> RootStats:
    return next(s for s in result_roots if s.name == name)


def _nodes(stats: RootStats) -> str:
    marks = [word for word, on in (("estimated", stats.graph_estimated), ("truncated", stats.truncated)) if on]
    return f"{stats.graph_nodes:,} nodes" + (f", {' and '.join(marks)}" if marks else ", walked whole")


def graph_rows(loads: Loads) -> None:
    for label, build in (("one loss of", chain_loss), ("a list of losses, in all", loss_list)):
        torch.set_grad_enabled(True)
        held, true_nodes = build()
        namespace: dict[str, Any] = {"loss": held}
        roots = _roots(namespace)
        scale = f"{label} {true_nodes:,} graph nodes"
        with loads.measuring() as add:
            end = scan_roots(roots(), END_SCAN_BUDGET)
            end_s = _median_s(lambda: suspects_from_scan(scan_roots(roots(), END_SCAN_BUDGET), []))
            top = suspects_from_scan(end, [])[0]
            add(scale, "the leak finder's scan (`%memcheck`, a cell's end) and what it reports",
                f"{_ms(end_s)}: {_nodes(_stats(end.roots, 'loss'))}; {top.kind}",
                f"< 1 s; {true_nodes:,} nodes")
            finder = LeakFinder(LeakSearch(roots), ScanMemo(), False)
            first_started = time.perf_counter()
            finder.start()
            first_s = time.perf_counter() - first_started
            before = scan_reusing(ScanMemo(), roots(), START_SCAN_BUDGET)
            add(scale, "the first cell's scan before it (a new kernel)",
                f"{_ms(first_s)} ({'truncated' if before.truncated else 'complete'})", "≤ 0.3 s")
            tracker = finder._tracker
            assert tracker is not None
            full = scan_roots(roots(), tracker._budget, plain_lists=PlainListMemo())
            costs = []
            for step in range(1, 21):  # forced: what the tracker's own pacing would spread over the run
                started = time.perf_counter()
                finder.scan(step)
                costs.append(time.perf_counter() - started)
            measured = tracker.last_stats.get("loss")
            tracked = ("the holder is re-measured at every scan: " + _ms(statistics.median(costs)) if measured is not None
                       else "a name this big is measured only at the full scans")
            add(scale, "a full holder scan during the run (nodes counted from the run's start); the other scans",
                f"{_ms(full.elapsed_s)} ({_nodes(_stats(full.roots, 'loss'))}); {tracked}",
                f"≤ {tracker._budget.time_s * 1e3:.0f} ms a scan")
            finder.finish()
        del namespace, held, roots, end, top
        gc.collect()


# ----------------------------------------------------------------------------- 3. 64 ranks


def _template_row() -> dict[str, float]:
    """A real background row (this machine's probes), the shape every simulated rank's rows take."""
    session = MemwatchSession(SessionOptions(DEFAULT_INTERVAL_MS, watch_ranks=False, train_hooks=False))
    session.start()
    try:
        assert session.background is not None
        return session.background.row()
    finally:
        session.stop()


def _final_evidence() -> dict[str, Any]:
    """A real run's evidence fields (a short session with steps), as a rank's final message carries them."""
    session = MemwatchSession(SessionOptions(DEFAULT_INTERVAL_MS, watch_ranks=False, train_hooks=False))
    session.start()
    for _ in range(200):
        session.tick("optimizer")
    session.stop()
    assert session.evidence is not None
    return evidence_fields(session.evidence)


def rank_row(template: dict[str, float], rank: int, t_s: float, rng: random.Random) -> dict[str, float]:
    """Rank `rank`'s reading at its second `t_s`: flat with noise, but for LEAKING_RANK."""
    steps = t_s * STEPS_PER_S
    heap = 300 * MIB + rng.gauss(0.0, 128 * 1024) + (LEAK_BYTES_PER_STEP * steps if rank == LEAKING_RANK else 0.0)
    row = dict(template)
    row.update({"t_s": t_s, "step": steps, resources.HEAP.column: heap, resources.RSS.column: heap + 200 * MIB,
                resources.RAM.column: heap + 250 * MIB})
    return row


def rank_events(template: dict[str, float], rank: int, from_s: float, to_s: float, rng: random.Random) -> list[Any]:
    """The timeline events a rank makes between its seconds `from_s` and `to_s`: a row every default
    interval, a step row STEP_ROWS_PER_S times a second, and a loader pass every 500 steps."""
    interval_s = DEFAULT_INTERVAL_MS / 1e3
    events: list[Any] = []
    tick = math.floor(from_s / interval_s) + 1
    while tick * interval_s <= to_s:
        t_s = tick * interval_s
        if round(t_s * 1e3) % round(1e3 / STEP_ROWS_PER_S) == 0:
            events.append(["s", row_values(rank_row(template, rank, t_s, rng))])
        if round(t_s * STEPS_PER_S) % 500 == 0:
            events.append(["p", t_s, 1, [500]])
        events.append(["t", row_values(rank_row(template, rank, t_s, rng))])
        tick += 1
    return events


def _counts(t_s: float) -> dict[Clock, int]:
    steps = int(t_s * STEPS_PER_S)
    return {"optimizer": steps, "backward": steps, "batch": steps, "forward": steps}


def _holder_series(rank: int, t_s: float) -> dict[str, list[list[int]]]:
    """The holders' series a rank's mid-run scans made: a growing list on the leaking rank."""
    if rank != LEAKING_RANK:
        return {}
    points = max(2, int(t_s))
    return {"kept": [[int(i * STEPS_PER_S), int(i * STEPS_PER_S * LEAK_BYTES_PER_STEP)] for i in range(points)]}


class StreamView:
    """What a `RankAgent`'s `on_tick` reads of its session, for a simulated rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.started_s = time.perf_counter()
        self.clock = "optimizer"

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started_s

    @property
    def clock_counts(self) -> dict[Clock, int]:
        return _counts(self.elapsed_s)

    @property
    def holder_scans_so_far(self) -> int:
        return int(self.elapsed_s // 5)  # a holder scan every 5 s, as a long run's thin out

    def holders_so_far(self) -> tuple[dict[str, list[list[int]]], tuple[()]]:
        return _holder_series(self.rank, self.elapsed_s), ()

    def device_uuids(self) -> list[str]:
        return []


def stream_rank(rank: int, address: str, seconds: float, template: dict[str, float], final: dict[str, Any]) -> None:
    """A forked rank: its agent's outbox filled at the default interval, sent every stream period
    through the agent's own `on_tick`, then its final message."""
    os.environ["RANK"], os.environ["LOCAL_RANK"] = str(rank), str(rank)
    agent = RankAgent(RankSettings(address, DEFAULT_INTERVAL_MS))
    view = StreamView(rank)
    rng = random.Random(rank)
    agent._offer({"k": "hello", "pid": os.getpid(), "host": "bench", "rank": rank, "local_rank": rank,
                  "started_wall_s": time.time(), "interval_s": DEFAULT_INTERVAL_MS / 1e3,
                  "ram_limit_bytes": 64 << 30, "ram_limit_source": "system", "heap_available": True})
    sent_to_s = 0.0
    while sent_to_s < seconds:
        time.sleep(max(0.0, sent_to_s + STREAM_PERIOD_S - view.elapsed_s))
        now_s = view.elapsed_s
        for event in rank_events(template, rank, sent_to_s, now_s, rng):
            agent.outbox.append(event)
        sent_to_s = now_s
        agent.on_tick(view)  # type: ignore[arg-type]  # the agent reads only what StreamView has
    agent._send_offered(patiently=True)
    while len(agent.outbox):
        agent.sender.send_patiently(agent._events_message(view, agent.outbox.take()))  # type: ignore[arg-type]
    steps = int(sent_to_s * STEPS_PER_S)
    evidence = {**final, "steps": steps, "optimizer_steps": steps, "wall_s": sent_to_s,
                "holder_series": _holder_series(rank, sent_to_s)}
    agent.sender.send_patiently({"k": "final", "pid": os.getpid(), "rank": rank, "local_rank": rank,
                                 "evidence": evidence, "dropped": agent.outbox.dropped})
    agent.sender.close()


class CostedFigure(LiveFigure):
    """The live figure, with the CPU time of each redraw."""

    def __init__(self) -> None:
        super().__init__()
        self.costs_s: list[float] = []

    def on_tick(self, view: LiveView) -> None:
        started = time.thread_time()
        super().on_tick(view)
        self.costs_s.append(time.thread_time() - started)


def watch_ranks(ranks: int, seconds: float, figure: bool, template: dict[str, float],
                final: dict[str, Any]) -> dict[str, Any]:
    """A watching session (its sampler thread polling the ranks' socket, the live figure drawing if
    `figure`) while `ranks` forked processes stream for `seconds`; the watcher's CPU per second (all
    its threads), its polls' share, and its final report's cost."""
    listener = CostedFigure() if figure else None
    session = MemwatchSession(SessionOptions(DEFAULT_INTERVAL_MS, train_hooks=False), listener=listener)
    pipes = []
    pids = []
    for rank in range(ranks):  # forked before the session starts its thread; the address comes by pipe
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write_end)
            address = os.read(read_end, 4096).decode()
            try:
                stream_rank(rank, address, seconds, template, final)
            finally:
                os._exit(0)
        os.close(read_end)
        pipes.append(write_end)
        pids.append(pid)
    session.start()
    feeds = session.ranks
    assert feeds is not None
    poll_cpu_s = [0.0]
    real_poll = feeds.poll

    def poll(force: bool = False) -> None:
        started = time.thread_time()
        real_poll(force)
        poll_cpu_s[0] += time.thread_time() - started

    setattr(feeds, "poll", poll)
    pss_cpu_s = [0.0]
    real_pss = process_probe.read_proportional_memory

    def read_pss(pid: int) -> Any:
        started = time.thread_time()
        try:
            return real_pss(pid)
        finally:
            pss_cpu_s[0] += time.thread_time() - started

    setattr(process_probe, "read_proportional_memory", read_pss)  # the ranks are the watcher's children
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    for write_end in pipes:
        os.write(write_end, feeds.address.encode())
        os.close(write_end)
    for pid in pids:
        os.waitpid(pid, 0)
    time.sleep(max(0.0, seconds - (time.perf_counter() - wall_started)) + 0.5)  # the last messages read
    cpu_s, wall_s = time.process_time() - cpu_started, time.perf_counter() - wall_started
    poll_s, pss_s = poll_cpu_s[0], pss_cpu_s[0]
    setattr(process_probe, "read_proportional_memory", real_pss)
    summaries_s = _median_s(lambda: feeds.summaries(), repeats=3) if ranks else 0.0
    stop_started = time.perf_counter()
    report = session.stop()
    stop_s = time.perf_counter() - stop_started
    ranked = report.ranks or ()
    return {
        "ranks": ranks, "cpu_per_s": cpu_s / wall_s, "poll_per_s": poll_s / wall_s, "pss_per_s": pss_s / wall_s, "summaries_s": summaries_s,
        "stop_s": stop_s, "reported": len(ranked), "finished": sum(r.status == "finished" for r in ranked),
        "worst": report.worst_rank, "verdict": report.verdict, "dropped": sum(r.dropped_messages for r in ranked),
        "redraws": None if listener is None else listener.costs_s,
    }


def full_feeds(template: dict[str, float], final: dict[str, Any], hours: float = FEED_HOURS) -> list[RankFeed]:
    """64 feeds, each holding `hours` of a rank's stream (applied as the watcher applies messages)."""
    feeds = []
    for rank in range(RANKS):
        feed = RankFeed(pid=10_000 + rank)
        rng = random.Random(rank)
        apply_message(feed, {"k": "hello", "pid": feed.pid, "rank": rank, "local_rank": rank, "host": "bench",
                             "started_wall_s": 0.0, "interval_s": 0.1, "heap_available": True}, 0.0, 0.0)
        chunk_s = 20.0  # ~200 rows: a full message's worth
        t_s = 0.0
        while t_s < hours * 3600:
            events = rank_events(template, rank, t_s, t_s + chunk_s, rng)
            t_s += chunk_s
            apply_message(feed, events_message(feed.pid, "optimizer", _counts(t_s), t_s, 0, events, rank=rank), t_s, 0.0)
        apply_message(feed, {"k": "holders", "pid": feed.pid, "series": _holder_series(rank, t_s), "suspects": []}, t_s, 0.0)
        steps = int(t_s * STEPS_PER_S)
        apply_message(feed, {"k": "final", "pid": feed.pid, "evidence": {
            **final, "steps": steps, "optimizer_steps": steps, "wall_s": t_s, "holder_series": _holder_series(rank, t_s),
        }}, t_s, 0.0)
        feeds.append(feed)
    return feeds


def rank_rows(loads: Loads) -> None:
    template, final = _template_row(), _final_evidence()
    scale = f"{RANKS} ranks"
    with loads.measuring() as add:
        idle = watch_ranks(0, STREAM_S, True, template, final)
        quiet = watch_ranks(RANKS, STREAM_S, False, template, final)
        live = watch_ranks(RANKS, STREAM_S, True, template, final)
        add(scale, f"the watcher's CPU while {RANKS} ranks stream ({STREAM_S:.0f} s; `-q` / with the live figure; "
            "no ranks)",
            f"{quiet['cpu_per_s'] * 100:.1f}% / {live['cpu_per_s'] * 100:.1f}% / {idle['cpu_per_s'] * 100:.1f}% of a core "
            f"(of the `-q` watcher's: reading the socket {quiet['poll_per_s'] * 100:.1f}%, the ranks' PSS "
            f"{quiet['pss_per_s'] * 100:.1f}%)",
            "a few % of one core")
        redraws = live["redraws"] or [0.0]
        add(scale, "the live figure's redraws meanwhile (status line, ranks' verdicts, ranks panel)",
            f"{len(redraws)} in {STREAM_S:.0f} s, {_ms(statistics.median(redraws))} each (median)",
            "≤ 0.4% of the time between two, one every 2 s at least")
        add(scale, f"the final report of {RANKS} short ranks (the ranks' summaries / the whole stop)",
            f"{_ms(quiet['summaries_s'])} / {_ms(quiet['stop_s'])}; {quiet['reported']} ranks reported, "
            f"worst rank {quiet['worst']} ({quiet['verdict']}), {quiet['dropped']} messages dropped",
            f"every rank; worst rank {LEAKING_RANK}")
    with loads.measuring() as add:
        tracemalloc.start()
        feeds = full_feeds(template, final)
        alive_bytes = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        rows = len(feeds[0].timeline.by_time) + len(feeds[0].timeline.by_step)
        full_scale = f"{RANKS} ranks, {FEED_HOURS:g} h each"
        add(full_scale, "what the watcher keeps of them (timelines at capacity: a day keeps as much)",
            f"{alive_bytes / MIB:.1f} MiB ({rows:,} rows a rank)", "bounded")
        judge_s = _median_s(lambda: LiveRanks(time.perf_counter, period_s=0.0).judge(feeds))
        now = [0.0]
        capped = LiveRanks(lambda: now[0])
        capped.judge(feeds)

        def rejudge() -> None:
            now[0] += 1.0
            capped.judge(feeds)

        capped_s = _median_s(rejudge)
        add(full_scale, f"the ranks' live verdicts: all {RANKS} at once / a call, {MAX_REJUDGED_PER_CALL} "
            "rejudged (the stalest; two calls a redraw)",
            f"{_ms(judge_s)} / {_ms(capped_s)}", "a redraw within the figure's 0.4% share, one every 2 s at least")
        numbers = rank_numbers(feeds)
        worst = worst_live(LiveRanks(time.perf_counter, period_s=0.0).judge(feeds))
        worst_pid = None if worst is None else worst.pid
        figure = LiveFigure()
        worst_feed = next(f for f in feeds if f.pid == worst_pid)
        curves_s = _median_s(lambda: rank_curves(feeds, numbers, worst_pid, False))
        curves = rank_curves(feeds, numbers, worst_pid, False)
        draw_s = _median_s(lambda: figure._draw_ranks(curves, False, worst_feed))
        add(full_scale, "the ranks panel: its curves (worst rank and the spread of all) / the widget models' update",
            f"{_ms(curves_s)} / {_ms(draw_s)}", "within the redraw's 0.4% share")
        watcher = RankFeeds()
        try:
            watcher.feeds = {feed.pid: feed for feed in feeds}
            summaries = watcher.summaries()
            assert summaries is not None
            summaries_s = _median_s(lambda: watcher.summaries(), repeats=3)
        finally:
            watcher.close()
        own = MemwatchSession(SessionOptions(DEFAULT_INTERVAL_MS, watch_ranks=False, train_hooks=False))
        own.start()
        report = own.stop()
        merge_s = _median_s(lambda: with_ranks(report, summaries))
        merged = with_ranks(report, summaries)
        text_s = _median_s(lambda: str(merged))
        add(full_scale, "the final report: the ranks' summaries / their merge / its text",
            f"{_ms(summaries_s)} / {_ms(merge_s)} / {_ms(text_s)}; worst rank {merged.worst_rank} ({merged.verdict})",
            f"a second or two at a cell's end; worst rank {LEAKING_RANK}")


# ----------------------------------------------------------------------------- 4. a day


def day_rows(loads: Loads) -> None:
    with loads.measuring() as add:
        run = live_cost.simulated_run(24.0, 1000.0)
        gaps = run["gaps_s"]
        add("24 h (simulated)", "the live figure's redraws at 1 s (gap median / longest, last hour; CPU each)",
            f"{statistics.median(gaps):.2f} s / {max(run['late_gaps_s']):.2f} s; "
            f"{_ms(statistics.median(run['costs_s']))}", "≤ 2 s between two, all day")
    with loads.measuring() as add:
        day = own_memory.session_memory(24.0)
        add("24 h (simulated)", f"memwatch's own memory after a day at {day['interval_ms']:.0f} ms "
            f"({day['rows_fed']:,} rows fed)",
            f"{day['kept_kib']:.0f} KiB alive ({day['rows_kept']:,} rows kept), peak {day['traced_peak_kib']:.0f} KiB",
            "bounded: as after 1 h")


def cited_day_rows(loads: Loads) -> None:
    """Without the day's ~20 minutes: where the tables above give its figures."""
    with loads.measuring() as add:
        add("24 h (simulated)", "the live figure's redraws over a day at 1 s", "see *The live view over long runs*",
            "≤ 2 s between two, all day")
        add("24 h (simulated)", "memwatch's own memory after a day at 10 ms", "see the memory table's 24 h row",
            "bounded: as after 1 h")


def render(day: bool | None = None) -> str:
    """The table; the day's rows are run unless `day` is False (or BENCH_SCALE_DAY=0), else cited."""
    if day is None:
        day = os.environ.get("BENCH_SCALE_DAY", "1") != "0"
    torch.set_num_threads(1)
    loads = Loads()
    for part in (namespace_rows, graph_rows, rank_rows, day_rows if day else cited_day_rows):
        part(loads)
        print(f"{part.__name__} done ({len(loads.rows)} rows): {loads.rows[-1]}", file=sys.stderr, flush=True)
    lines = [
        f"Machine: {os.cpu_count()} cores, shared (the load column: the 1-minute load average before and after "
        f"each group of rows). Times are medians of {REPEATS} (wall time, the scans run on the training thread), "
        "CPU shares are CPU time over wall time. Produced by `python bench/run_all.py scale`.",
        "",
        "| scale | what | measured | compared with | load |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r.scale} | {r.measure} | {r.figure} | {r.goal} | {r.load} |" for r in loads.rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(day="--no-day" not in sys.argv[1:]))
