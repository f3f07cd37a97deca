"""The other nodes' ranks in the live figure: each one's history as the job's store showed it (read
through the reader's own path, from a fake store), drawn with this node's ranks on the same axes,
in the spread beyond MAX_RANK_LINES, and the node that peaks above the others named (synthetic: no
store, no processes)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from idle_views import idle_view
from test_live_ranks import _draw, _feed

from torchmem_magic.core.model import HeapSummary, RamSummary, RankSummary, VramSummary
from torchmem_magic.ranks.feed import rank_numbers
from torchmem_magic.stream.feed import RankFeed
from torchmem_magic.ranks.job import JobStore, encode_summary
from torchmem_magic.ranks import live as live_module
from torchmem_magic.ranks import remote as remote_module
from torchmem_magic.ranks.remote import HISTORY_POINTS, RankHistory, RemoteRanks
from torchmem_magic.core.timeline import Timeline
from torchmem_magic.widgets.rank_curves import node_imbalance, rank_curves

MIB = float(1 << 20)
GIB = float(1 << 30)


def _summary(rank: int, node: int, steps: int, heap_bytes: float, ram_peak_bytes: float = 200 * MIB,
             vram_bytes: float | None = None, host: str = "host-b", verdict: str = "clean") -> RankSummary:
    ram = RamSummary(200 * MIB, int(ram_peak_bytes), int(ram_peak_bytes), None, 64 << 30, "system")
    vram = None if vram_bytes is None else VramSummary(0, int(vram_bytes), int(vram_bytes), int(vram_bytes),
                                                       int(vram_bytes), None, None, ("cuda:0",), None)
    return RankSummary(
        rank=rank, pid=500 + rank, host=host, ram=ram, heap=HeapSummary(0, int(heap_bytes), int(heap_bytes), None),
        vram=vram, steps=steps, verdict=verdict, leak_kind=None, resource=None,  # type: ignore[arg-type]
        steps_to_exhaustion=None, suspects=(), status="running", node=node,
    )


class _Store:
    """The job's store as the reader's client reads it: whatever keys the test set."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def read(self, keys: list[str]) -> dict[str, bytes]:
        return {key: self.values[key] for key in keys if key in self.values}


class _Job:
    """A watcher of node `node` reading a job's store at the seconds the test says."""

    def __init__(self, world_size: int = 4, node: int = 0) -> None:
        self.job = JobStore("127.0.0.1", 1, "test", 0, world_size, 2, node)
        self.now_s = 0.0
        self.store = _Store()
        self.remote = RemoteRanks(self.job, lambda: self.now_s)  # never started: the test reads for it
        self._seq: dict[int, int] = {}

    def publish(self, summary: RankSummary) -> None:
        seq = self._seq[summary.rank] = self._seq.get(summary.rank, -1) + 1
        self.store.values[self.job.summary_key(summary.rank)] = encode_summary(summary, seq, 0.0, False)

    def read(self, at_s: float) -> None:
        self.now_s = at_s
        self.remote._read(self.store, [self.job.summary_key(r) for r in range(self.job.world_size)])  # type: ignore[arg-type]


def _column(history: RankHistory, name: str) -> list[float]:
    return list(history.columns[name])


# ----------------------------------------------------------------------------- the histories


def test_each_new_summary_of_another_nodes_rank_is_one_point_and_this_nodes_ranks_have_none() -> None:
    job = _Job()
    job.publish(_summary(0, 0, 10, 40 * MIB, host="host-a"))  # this node's: its stream has every reading
    job.publish(_summary(2, 1, 10, 50 * MIB, vram_bytes=GIB))
    job.publish(_summary(3, 1, 12, 60 * MIB))
    job.read(1.0)
    job.read(1.5)  # no key changed: no point
    job.publish(_summary(2, 1, 20, 51 * MIB, ram_peak_bytes=300 * MIB, vram_bytes=2 * GIB))
    job.read(2.0)
    histories = job.remote.histories()
    assert [(h.rank, h.host, h.node) for h in histories] == [(2, "host-b", 1), (3, "host-b", 1)]
    two, three = histories
    assert _column(two, "t_s") == [1.0, 2.0] and _column(two, "step") == [10.0, 20.0]
    assert _column(two, "heap_bytes") == [50 * MIB, 51 * MIB] and _column(two, "ram_bytes") == [200 * MIB, 300 * MIB]
    assert _column(two, "vram_allocated_bytes") == [GIB, 2 * GIB] and (two.peak_bytes, two.peak_of) == (2 * GIB, "VRAM")
    assert _column(three, "t_s") == [1.0] and math.isnan(_column(three, "vram_allocated_bytes")[0])
    assert (three.peak_bytes, three.peak_of) == (200 * MIB, "RAM")
    assert [h.rank for h in job.remote.histories(skip={2})] == [3]


def test_a_history_stays_bounded_over_a_long_run_and_keeps_its_start_and_its_peak() -> None:
    job = _Job(world_size=3)
    changes = 3 * HISTORY_POINTS
    for i in range(changes):
        job.publish(_summary(2, 1, i, (90 if i == 1000 else 50) * MIB))
        job.read(float(i))
    (history,) = job.remote.histories()
    t_s = _column(history, "t_s")
    assert len(t_s) <= HISTORY_POINTS and t_s[0] == 0.0 and t_s[-1] >= changes - 4
    assert max(_column(history, "heap_bytes")) == 90 * MIB  # thinned rows keep their highest reading


# ----------------------------------------------------------------------------- the curves


def _on_node(feed: RankFeed, node: int) -> RankFeed:
    feed.job = {"node": node}
    return feed


def _job_of_two_nodes(remote_heap_per_step: float = 0.0, ram_peak_bytes: float = 200 * MIB) -> tuple[list[RankFeed], _Job]:
    """Ranks 0 and 1 on this node (node 0), ranks 2 and 3 on node 1, whose summaries came at 1..30 s."""
    feeds = [_on_node(_feed(10, 0, 0.0), 0), _on_node(_feed(11, 1, 0.0), 0)]
    job = _Job()
    for second in range(1, 31):
        steps = 4 * second
        job.publish(_summary(2, 1, steps, 50 * MIB, ram_peak_bytes))
        job.publish(_summary(3, 1, steps, 50 * MIB + remote_heap_per_step * steps, ram_peak_bytes, verdict="leak"))
        job.read(float(second))
    return feeds, job


def test_the_other_nodes_ranks_are_drawn_with_this_nodes_labelled_with_their_node_and_lighter() -> None:
    feeds, job = _job_of_two_nodes()
    numbers = rank_numbers(feeds)
    by_time = rank_curves(feeds, numbers, 10, by_steps=False, remote=job.remote.histories(skip={0, 1}))
    assert [(c.label, c.remote) for c in by_time.memory] == [
        ("rank 0", False), ("rank 1", False), ("rank 2 @host-b (node 1)", True), ("rank 3 @host-b (node 1)", True),
    ]
    remote = by_time.memory[3]
    assert list(remote.x) == [float(s) for s in range(1, 31)]  # the watcher's seconds when each summary came
    assert by_time.band is None and by_time.quantity == "heap in use"
    by_steps = rank_curves(feeds, numbers, 10, by_steps=True, remote=job.remote.histories(skip={0, 1}))
    assert list(by_steps.memory[3].x) == [4.0 * s for s in range(1, 31)]  # the steps its summaries said


def test_beyond_the_lines_the_worst_may_be_another_nodes_and_the_spread_counts_every_node() -> None:
    feeds, job = _job_of_two_nodes(remote_heap_per_step=64 * 1024.0)
    curves = rank_curves(feeds, rank_numbers(feeds), None, by_steps=False, max_lines=3,
                         remote=job.remote.histories(skip={0, 1}), worst_rank=3)
    assert [(c.label, c.remote) for c in curves.memory] == [("rank 3 @host-b (node 1) (worst)", True)]
    band = curves.band
    assert band is not None and band.ranks == 4
    top = 50 * MIB + 64 * 1024.0 * 120
    assert band.high_bytes.max() == pytest.approx(top)  # node 1's leaking rank is in the spread
    assert band.x[-1] == pytest.approx(30.0)  # ... over its span, past this node's ranks' 1.2 s


def test_the_node_peaking_well_above_the_median_node_is_named() -> None:
    feeds, job = _job_of_two_nodes(ram_peak_bytes=400 * MIB)  # this node's ranks peak at 200 MiB of RAM
    curves = rank_curves(feeds, rank_numbers(feeds), 10, by_steps=False, remote=job.remote.histories(skip={0, 1}))
    assert curves.imbalance == "imbalance: peak RAM 400.0 MiB on node 1, median of 2 nodes 300.0 MiB (+33%)"
    feeds, job = _job_of_two_nodes(ram_peak_bytes=210 * MIB)  # within 10% of the median
    assert rank_curves(feeds, rank_numbers(feeds), 10, by_steps=False, remote=job.remote.histories()).imbalance is None
    lopsided = [_on_node(_feed(10, 0, 0.0), 0), _on_node(_feed(11, 1, 0.0, vram=4 * GIB), 0)]
    assert rank_curves(lopsided, rank_numbers(lopsided), 10, by_steps=False).imbalance is None  # one node: no line


def test_a_nodes_peak_is_its_highest_rank_and_vram_counts_where_it_has_cuda() -> None:
    peaks = [(0, 1 * GIB, "VRAM"), (0, 3 * GIB, "VRAM"), (1, 1 * GIB, "VRAM"), (2, 1 * GIB, "VRAM"), (None, 9 * GIB, "RAM")]
    assert node_imbalance(peaks) == "imbalance: peak VRAM 3.0 GiB on node 0, median of 3 nodes 1.0 GiB (+200%)"
    assert node_imbalance(peaks[:2]) is None


# ----------------------------------------------------------------------------- the live figure


def test_the_live_panel_carries_the_other_nodes_curves_lighter_and_names_the_imbalance() -> None:
    feeds, job = _job_of_two_nodes(ram_peak_bytes=400 * MIB)
    figure = _draw(feeds, job.remote)
    assert list(figure.rank_lines.labels) == ["rank 0", "rank 1", "rank 2 @host-b (node 1)", "rank 3 @host-b (node 1)"]
    assert list(figure.rank_lines.opacities) == [1.0, 1.0, 0.5, 0.5]
    title = figure.rank_figure.title
    assert "other nodes' lighter" in title and "imbalance: peak RAM 400.0 MiB on node 1" in title, title
    single = _draw([replace(feeds[0]), replace(feeds[1])])
    assert list(single.rank_lines.opacities) == [] and "imbalance" not in single.rank_figure.title


def test_the_worst_rank_of_another_node_is_the_panels_worst_in_its_spread() -> None:
    feeds = [_on_node(_feed(100 + r, r, 0.0), 0) for r in range(8)]
    job = _Job(world_size=10)
    for second in range(1, 31):
        job.publish(_summary(8, 1, 4 * second, 50 * MIB))
        job.publish(replace(_summary(9, 1, 4 * second, 50 * MIB + 65536.0 * 4 * second, verdict="leak"),
                            resource="heap", per_step_bytes=65536.0))
        job.read(float(second))
    figure = _draw(feeds, job.remote)
    assert list(figure.rank_lines.labels) == ["rank 9 @host-b (node 1) (worst)"]
    assert list(figure.rank_band.labels) == ["min of 10 ranks", "max of 10 ranks"]


# ----------------------------------------------------------------------------- the live view's other-node ranks


class _NodeFeeds:
    """This node's ranks (from their stream) and the job's store; `skip`: ranks that are this node's."""

    def __init__(self, feeds: list[RankFeed], job: _Job) -> None:
        self.feeds, self.job = feeds, job
        self.skip: set[int] = set()

    def snapshot(self) -> list[RankFeed]:
        return list(self.feeds)

    def remote_summaries(self) -> tuple[RankSummary, ...]:
        return self.job.remote.summaries(skip=self.skip)


def test_another_nodes_rank_is_remade_only_when_its_message_or_status_changed_and_kept_only_while_present(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = _Job()
    job.publish(_summary(2, 1, 10, 50 * MIB))
    job.publish(_summary(3, 1, 10, 60 * MIB))
    job.read(1.0)
    built: list[int] = []  # the store reader's summaries made (a rank, its status, its attempt)
    made: list[int] = []  # the live view's rank states made from them
    real_replace, real_from_summary = remote_module.replace, live_module.from_summary
    monkeypatch.setattr(remote_module, "replace", lambda summary, **changes: built.append(summary.rank) or real_replace(summary, **changes))
    monkeypatch.setattr(live_module, "from_summary", lambda summary: made.append(summary.rank) or real_from_summary(summary))
    feeds = _NodeFeeds([_feed(10, 0, 0.0), _feed(11, 1, 0.0)], job)
    view = idle_view(Timeline(), feeds)

    assert [r.rank for r in view.live_ranks()] == [0, 1, 2, 3]
    assert built == made == [2, 3]
    job.read(1.5)  # both keys unchanged: the same seq
    view.live_ranks()
    view.live_ranks()
    assert built == made == [2, 3]
    job.publish(_summary(3, 1, 20, 61 * MIB))  # rank 3's next message: a new seq, all else alike but its steps
    job.now_s = 1.0  # ... and the same second of its last change (the seq alone tells)
    job.remote._changed_s[3] = 1.0
    job.remote._read(job.store, [job.job.summary_key(r) for r in range(job.job.world_size)])  # type: ignore[arg-type]
    assert next(r for r in view.live_ranks() if r.rank == 3).steps == 20
    assert built == made == [2, 3, 3]
    job.publish(_summary(3, 1, 30, 62 * MIB))
    job.read(3.0)
    view.live_ranks()
    assert built == made == [2, 3, 3, 3]
    job.read(5.0)  # rank 2 silent 4 s: stale now, a status change with the same seq
    ranks = {r.rank: r for r in view.live_ranks()}
    assert ranks[2].stale and not ranks[3].stale
    assert built == made == [2, 3, 3, 3, 2]
    feeds.skip = {3}  # rank 3 is no longer another node's: nothing of it is kept
    assert [r.rank for r in view.live_ranks()] == [0, 1, 2]
    assert set(view._remote_live) == set(job.remote._built) == {(2, None)}
    assert built == made == [2, 3, 3, 3, 2]
