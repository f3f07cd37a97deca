"""Ranks while the run goes: each rank's live verdict, the worst rank, its status line, its curves
(synthetic feeds: no processes)."""

from __future__ import annotations

from dataclasses import replace

import math

import numpy as np
import pytest

from torchmem_magic.analysis.forensics import WorkerExit
from torchmem_magic.core.model import LiveStatus
from torchmem_magic.stream.feed import RankFeed
from torchmem_magic.ranks.feed import rank_numbers
from torchmem_magic.ranks.live import LiveRanks, RankLive, judge_rank, worst_line, worst_live
from torchmem_magic.render.text import status_line
from torchmem_magic.core.timeline import COLUMNS, Timeline
from torchmem_magic.widgets.live import LiveFigure
from torchmem_magic.widgets.rank_curves import padded, rank_curves, steps_of_time

from idle_views import idle_view

KIB, MIB = 1024.0, float(1 << 20)
NAN = float("nan")


def _feed(pid: int, rank: int | None, heap_per_step: float, steps: int = 120, offset_s: float = 0.5,
          step_s: float = 0.01, heap: bool = True, vram: float | None = None) -> RankFeed:
    """A rank that made `steps` optimizer steps, its heap growing `heap_per_step` a step (plus a little noise)."""
    feed = RankFeed(pid, rank=rank, offset_s=offset_s, ram_limit_bytes=64 << 30, heap_available=heap,
                    clock="optimizer", counts={"optimizer": steps}, elapsed_s=steps * step_s)
    rng = np.random.default_rng(pid)
    for step in range(1, steps + 1):
        row = dict.fromkeys(COLUMNS, NAN)
        row["t_s"], row["step"] = step * step_s, float(step)
        heap_bytes = 50 * MIB + heap_per_step * step + float(rng.integers(0, 4096))
        row["heap_bytes"] = heap_bytes if heap else NAN
        row["ram_bytes"] = row["rss_bytes"] = 200 * MIB + heap_per_step * step
        if vram is not None:
            row["vram_allocated_bytes"] = row["vram_reserved_bytes"] = vram
        feed.timeline.by_step.append(row)
        feed.timeline.by_time.append(row)
    return feed


# ----------------------------------------------------------------------------- verdicts and the worst rank


def test_the_leaking_rank_is_judged_a_leak_at_its_rate_and_a_flat_one_clean() -> None:
    leaking = judge_rank(_feed(11, 1, 64 * KIB), 1)
    assert (leaking.verdict, leaking.resource) == ("leak", "heap")
    assert leaking.per_step_bytes == pytest.approx(64 * KIB, rel=0.1)
    clean = judge_rank(_feed(10, 0, 0.0), 0)
    assert clean.verdict == "clean" and clean.per_step_bytes is None


def test_too_few_steps_is_no_verdict_yet() -> None:
    assert judge_rank(_feed(10, 0, 64 * KIB, steps=10), 0).verdict == "unknown"
    assert worst_line([judge_rank(_feed(10, 0, 64 * KIB, steps=10), 0)]) is None


def test_the_growing_holder_is_named() -> None:
    feed = _feed(11, 1, 64 * KIB)
    feed.holder_series = {"outputs": [(s, s * 65536) for s in range(10, 130, 10)], "model": [(s, 1 << 20) for s in range(10, 130, 10)]}
    live = judge_rank(feed, 1)
    assert live.holder == "outputs"
    assert worst_line([judge_rank(_feed(10, 0, 0.0), 0), live]) == "worst rank 1: leak +64.0 KiB/step in heap (outputs)"


def test_worst_is_the_leak_then_the_faster_leak_then_a_death_beats_both() -> None:
    clean = RankLive(0, 10, "clean", peak_bytes=900.0)
    slow = RankLive(1, 11, "leak", "heap", 1 * KIB)
    fast = RankLive(2, 12, "leak", "heap", 9 * KIB)
    assert worst_live([clean, slow, fast]) is fast
    assert worst_live([clean, RankLive(1, 11, "suspect", "heap", 90 * KIB), slow]) is slow  # severity first
    stopped = RankLive(3, 13, "clean", died="SIGTERM", last_seen_s=2.0)
    killed = RankLive(4, 14, "unknown", died="SIGKILL", last_seen_s=3.0)
    assert worst_live([clean, fast, stopped, killed]) is killed  # not the launcher's stop signal
    assert worst_line([clean, fast, stopped, killed]) == "rank 4 stopped (SIGKILL) at 0 steps"
    # two deaths of unknown cause: the one whose process was seen to end first, whatever the streams say
    silent_first = RankLive(5, 15, "clean", died="stopped", last_seen_s=1.0, exited_s=3.4)
    ended_first = RankLive(6, 16, "clean", died="stopped", last_seen_s=1.2, exited_s=3.3)
    assert worst_live([silent_first, ended_first]) is ended_first
    assert worst_live([replace(silent_first, exited_s=None), replace(ended_first, exited_s=None)]).rank == 5
    assert worst_live([]) is None


def test_all_clean_says_so() -> None:
    ranks = [RankLive(0, 10, "clean"), RankLive(1, 11, "clean")]
    assert worst_line(ranks) == "ranks clean so far"


def test_a_rank_killed_is_seen_from_its_exit_status() -> None:
    feed = _feed(11, 1, 0.0)
    feed.exit = WorkerExit(11, 9, None)
    assert judge_rank(feed, 1).died == "SIGKILL"
    feed.exit = WorkerExit(11, None, 0)  # exited normally, its final message not read yet: not a death
    assert judge_rank(feed, 1).died is None


def test_ranks_are_rejudged_at_most_once_a_period_each() -> None:
    now = [0.0]
    live = LiveRanks(lambda: now[0], period_s=1.0)
    feeds = [_feed(10, 0, 0.0), _feed(11, 1, 64 * KIB)]
    live.judge(feeds)
    assert live.judged == 2
    for t in (0.25, 0.5, 0.99):
        now[0] = t
        assert [r.rank for r in live.judge(feeds)] == [0, 1]
    assert live.judged == 2
    now[0] = 1.0
    live.judge(feeds)
    assert live.judged == 4


def test_ranks_without_a_number_yet_get_the_free_ones() -> None:
    feeds = [RankFeed(30, rank=None), RankFeed(31, rank=0), RankFeed(32, rank=None)]
    assert rank_numbers(feeds) == {30: 1, 31: 0, 32: 2}


# ----------------------------------------------------------------------------- the status line


def _status(**ranks: object) -> LiveStatus:
    return LiveStatus(
        elapsed_s=6.3, steps=0, epochs=0, ram_bytes=600 * MIB, heap_bytes=100 * MIB, vram_allocated_bytes=NAN,
        vram_reserved_bytes=NAN, shm_used_bytes=NAN, workers=0, ram_per_step=None, heap_per_step=None,
        vram_per_step=None, clock="time", **ranks,  # type: ignore[arg-type]
    )


def test_status_line_names_the_worst_rank_and_how_far_the_ranks_are() -> None:
    line = status_line(_status(ranks=2, rank_steps=(51, 54), worst_rank="worst rank 1: leak +67.9 KiB/step in heap (outputs)"))
    assert line == "6.3 s · 2 ranks at step 51–54 · RAM 600.0 MiB (—) · worst rank 1: leak +67.9 KiB/step in heap (outputs)"
    assert status_line(_status(ranks=4, rank_steps=(150, 150))).startswith("6.3 s · 4 ranks at step 150 · RAM")
    # without ranks, nothing changes
    assert status_line(_status()) == "6.3 s · epoch 0 · RAM 600.0 MiB (—) · heap 100.0 MiB (—)"


# ----------------------------------------------------------------------------- the curves


def test_one_curve_per_rank_on_the_watchers_time_axis_and_on_each_ranks_steps() -> None:
    feeds = [_feed(10, 0, 0.0, offset_s=0.5), _feed(11, 1, 64 * KIB, offset_s=0.7, steps=100)]
    numbers = rank_numbers(feeds)
    by_time = rank_curves(feeds, numbers, 11, by_steps=False)
    assert by_time.quantity == "heap in use" and [c.label for c in by_time.memory] == ["rank 0", "rank 1"]
    assert by_time.memory[0].x[0] == pytest.approx(0.51) and by_time.memory[1].x[0] == pytest.approx(0.71)
    assert by_time.memory[1].y_bytes[-1] - by_time.memory[1].y_bytes[0] == pytest.approx(99 * 64 * KIB, rel=0.01)
    assert not by_time.vram and by_time.band is None
    by_steps = rank_curves(feeds, numbers, 11, by_steps=True)
    assert by_steps.memory[0].x[-1] == 120 and by_steps.memory[1].x[-1] == 100
    x, y = padded(by_steps.memory)  # one Lines mark: equal lengths, the shorter one holds its last point
    assert x.shape == y.shape == (2, 120) and x[1, -1] == 100 and y[1, -1] == y[1, 99]


def test_ram_when_a_rank_has_no_heap_and_vram_when_it_has_cuda() -> None:
    feeds = [_feed(10, 0, 0.0), _feed(11, 1, 0.0, heap=False, vram=2 * MIB)]
    curves = rank_curves(feeds, rank_numbers(feeds), None, by_steps=False)
    assert curves.quantity == "RAM" and curves.memory[0].y_bytes[0] == pytest.approx(200 * MIB)
    assert [c.label for c in curves.vram] == ["rank 1 VRAM"]


def test_many_ranks_show_the_worst_and_the_spread() -> None:
    feeds = [_feed(100 + r, r, (64 * KIB if r == 7 else 0.0), offset_s=0.1 * r) for r in range(12)]
    curves = rank_curves(feeds, rank_numbers(feeds), 107, by_steps=False)
    assert [c.label for c in curves.memory] == ["rank 7 (worst)"]
    band = curves.band
    assert band is not None and band.ranks == 12
    assert np.all(band.low_bytes <= band.high_bytes)
    assert band.high_bytes.max() == pytest.approx(50 * MIB + 120 * 64 * KIB, rel=0.01)  # the worst rank at its end
    assert band.low_bytes.max() < 50 * MIB + 8 * KIB  # the flat ones (noise aside)
    assert band.x[0] == pytest.approx(0.01) and band.x[-1] == pytest.approx(1.1 + 1.2)


def test_the_watchers_seconds_on_a_ranks_steps() -> None:
    feed = _feed(10, 0, 0.0, offset_s=1.0, step_s=0.1, steps=50)  # steps 1..50 at 1.1..6.0 s
    steps = steps_of_time(np.array([0.5, 1.1, 2.05, 6.0, 7.0]), feed)
    assert math.isnan(steps[0]) and math.isnan(steps[-1])
    assert list(steps[1:4]) == pytest.approx([1.0, 10.5, 50.0])


# ----------------------------------------------------------------------------- the live figure's widgets


class _Feeds:
    """The RankFeeds' side the live view reads; `remote`: the other nodes' ranks (none: a single-node run)."""

    def __init__(self, feeds: list[RankFeed], remote: object = None) -> None:
        self.feeds = feeds
        self.remote = remote

    def snapshot(self) -> list[RankFeed]:
        return list(self.feeds)

    def remote_summaries(self) -> tuple[object, ...]:
        return () if self.remote is None else self.remote.summaries()  # type: ignore[attr-defined]

    def remote_histories(self, skip: object) -> tuple[object, ...]:
        return () if self.remote is None else self.remote.histories(skip=skip)  # type: ignore[attr-defined]


def _draw(feeds: list[RankFeed] | None, remote: object = None) -> LiveFigure:
    timeline = Timeline()
    row = dict.fromkeys(COLUMNS, 100 * MIB)
    for i in range(20):
        row["t_s"] = i * 0.1
        timeline.by_time.append(row)
    figure = LiveFigure()
    figure.draw(idle_view(timeline, None if feeds is None else _Feeds(feeds, remote)).snapshot())
    return figure


def test_without_ranks_the_ranks_panel_stays_hidden_and_the_kernels_curves_stay() -> None:
    figure = _draw(None)
    assert figure.rank_figure not in figure.widget.children
    assert "heap in use" in figure.labels


def test_two_ranks_one_line_each_and_no_legend_rows_for_empty_marks() -> None:
    figure = _draw([_feed(10, 0, 0.0), _feed(11, 1, 64 * KIB)])
    assert figure.widget.children[2] is figure.rank_figure and figure.rank_figure.title == "ranks: heap in use"
    assert list(figure.rank_lines.labels) == ["rank 0", "rank 1"] and np.asarray(figure.rank_lines.y).shape == (2, 120)
    assert figure.rank_lines.display_legend
    assert not figure.rank_band.display_legend and not figure.rank_vram_lines.display_legend
    # the launcher idles: its own heap and RSS are left out, the tree's RAM (which sums the ranks) stays
    assert figure.labels == ["RAM (process tree)", "workers (PSS)", "VRAM allocated", "VRAM reserved", "/dev/shm used"]
    assert len(figure.shown) == 4  # the reserved VRAM on the allocated one's strip, to be read against it
    # zoomed to the ranks' span, with room above for the legend
    y = np.asarray(figure.rank_lines.y)
    assert 40 < figure.rank_y_scale.min < y.min() and figure.rank_y_scale.max > y.max()
    assert "worst rank 1: leak +" in figure.status.value.replace("&nbsp;", " ")


def test_many_ranks_the_worst_line_and_the_band() -> None:
    figure = _draw([_feed(100 + r, r, (64 * KIB if r == 7 else 0.0)) for r in range(12)])
    assert list(figure.rank_lines.labels) == ["rank 7 (worst)"]
    assert figure.rank_band.visible and figure.rank_band.display_legend
    assert list(figure.rank_band.labels) == ["min of 12 ranks", "max of 12 ranks"]


def test_many_ranks_are_rejudged_a_few_a_call_the_stalest_first() -> None:
    now = [0.0]
    live = LiveRanks(lambda: now[0], period_s=1.0, max_per_call=3)
    feeds = [_feed(100 + r, r, 0.0, steps=40) for r in range(8)]
    live.judge(feeds)
    assert live.judged == 8  # every rank new: each judged at once
    now[0] = 1.0
    live.judge(feeds)
    assert live.judged == 11  # all stale: only the cap's worth
    now[0] = 1.1
    live.judge(feeds)
    assert live.judged == 14  # the next three: the stalest, not the ones just judged
    now[0] = 1.2
    assert [r.rank for r in live.judge(feeds)] == list(range(8))
    assert live.judged == 16  # the last two; every rank was rejudged once
    now[0] = 1.3
    live.judge(feeds)
    assert live.judged == 16  # none stale
