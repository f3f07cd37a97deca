"""Holders' own growth, the verdict fused from curves and holders, and the scans that measure them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from torchmem_magic.finder.holder_tracking import MAX_POINTS, HolderTracker
from torchmem_magic.render.advice import advice_lines
from torchmem_magic.finder.scan_schedule import MAX_SCANS
from torchmem_magic.analysis.holders import fuse
from torchmem_magic.analysis.holder_trends import first_named_step, holder_trend, with_trends
from torchmem_magic.render.advice.holders import live_holder_line
from torchmem_magic.core.model import Suspect
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.analysis.findings import Diagnosis, Note, note

KIB, MIB = 1 << 10, 1 << 20


def points(sizes: list[float], every: int = 10) -> list[tuple[int, int]]:
    return [(i * every, int(size)) for i, size in enumerate(sizes)]


def suspect(name: str, series: list[tuple[int, int]], kind: str = "autograd-graph", new: bool = True) -> Suspect:
    last = series[-1][1] if series else 0
    return Suspect(name, f"{name}[0]", kind, 10, 100, last, new, f"fix {name}", series=tuple(series))


#: the curves' own headline of a 1 MiB/step heap leak
HEADLINE = note("leak", leak_kind="per-iteration", resource="heap", per_step_bytes=MIB, error_bytes=None,
                per_epoch_bytes=None, sporadic_steps=(), clock="optimizer")


def diagnosis(verdict: str = "clean", per_step: float | None = None, advice: tuple[Note, ...] = ()) -> Diagnosis:
    kind = "per-iteration" if verdict == "leak" else None
    return Diagnosis(verdict, kind, "heap" if kind else None, per_step, None, None, None, advice)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- one holder's trend


def test_a_steadily_growing_holder_grows_at_its_rate() -> None:
    trend = holder_trend("total", points([i * 55 * KIB for i in range(12)]))  # 5.5 KiB a step
    assert trend.growing and not trend.bounded
    assert trend.growth_per_step == pytest.approx(5.5 * KIB)


def test_flat_filled_then_flat_and_shrinking_holders_are_bounded() -> None:
    assert holder_trend("last", points([7_000] * 10)).bounded
    warmup = [min(i, 5) * MIB for i in range(20)]  # fills for 5 scans, then 15 flat
    assert holder_trend("cache", points(warmup)).bounded
    assert holder_trend("shrinking", points([(20 - i) * MIB for i in range(20)])).bounded


def test_too_few_scans_say_nothing_and_noise_is_not_growth() -> None:
    few = holder_trend("x", points([0, MIB, 2 * MIB]))
    assert few.growth_per_step is None and not few.growing and not few.bounded
    wobble = [10 * MIB + (64 * KIB if i % 2 else 0) for i in range(16)]
    assert holder_trend("x", points(wobble)).bounded


def test_the_step_a_holder_is_first_clearly_growing() -> None:
    series = {"idle": points([MIB] * 10), "val_outputs": points([0, 0, 0, 2 * MIB, 4 * MIB, 6 * MIB, 8 * MIB, 10 * MIB])}
    assert first_named_step(series) == 40  # the second rise: one jump is not a trend
    assert first_named_step({"idle": points([MIB] * 10)}) is None


def test_the_live_line_names_the_fastest_growing_holder() -> None:
    trends = [holder_trend("slow", points([i * 100 * KIB for i in range(10)])), holder_trend("fast", points([i * 30 * MIB for i in range(10)]))]
    assert live_holder_line(trends, {"fast": "autograd-graph"}, "optimizer") == "fast +3.0 MiB/step, autograd graphs"
    assert live_holder_line(trends[:1], {}, "batch") == "slow +10.0 KiB/batch, tensors"
    assert live_holder_line([holder_trend("flat", points([MIB] * 10))], {}, "optimizer") is None


def test_suspects_get_their_series_rate_and_first_scan() -> None:
    plain = suspect("history", [])
    filled = with_trends([plain], {"history": [(0, 0), (10, MIB), (20, 2 * MIB), (30, 3 * MIB)]})[0]
    assert filled.series == ((0, 0), (10, MIB), (20, 2 * MIB), (30, 3 * MIB)) and filled.first_seen_step == 0
    assert filled.growth_per_step == pytest.approx(MIB / 10)
    assert with_trends([plain], {})[0] == plain


# ----------------------------------------------------------------------------- one verdict from both


def test_a_growing_holder_is_a_leak_no_curve_shows() -> None:
    total = suspect("total", points([i * 55 * KIB for i in range(12)]))
    fused = fuse(diagnosis("clean"), [total], "optimizer", headroom_bytes=11 * MIB, steps_per_s=100.0)
    assert (fused.verdict, fused.leak_kind, fused.resource) == ("leak", "per-iteration", "heap")
    assert fused.per_step_bytes == pytest.approx(5.5 * KIB)
    assert fused.steps_to_exhaustion == pytest.approx(11 * MIB / (5.5 * KIB)) and fused.seconds_to_exhaustion == pytest.approx(20.48, rel=0.01)
    assert advice_lines(fused.advice)[0] == "per-iteration leak: total grows +5.5 KiB/step, too little for the curves to show yet"
    assert advice_lines(fused.advice)[1].startswith("at +5.5 KiB/step this kernel is OOM-killed in ~2,048 steps")


def test_agreement_and_disagreement_are_said() -> None:
    outputs = suspect("val_outputs", points([i * 10 * MIB for i in range(10)]))  # 1 MiB a step
    agree = fuse(diagnosis("leak", MIB, (HEADLINE,)), [outputs], "optimizer", None, None)
    assert advice_lines(agree.advice)[1] == "heap +1.0 MiB/step, and val_outputs grows +1.0 MiB/step: that is where it goes"
    flat = suspect("cache", points([5 * MIB] * 10), kind="tensor-cache")
    alone = fuse(diagnosis("leak", MIB, (HEADLINE,)), [flat], "optimizer", None, None)
    assert alone.verdict == "leak" and advice_lines(alone.advice)[-2].startswith("no variable in the namespace grows with the steps")
    assert advice_lines(alone.advice)[-1] == "cache holds 5.0 MiB (bounded: it did not grow over the run)"
    untracked = fuse(diagnosis("leak", MIB, (HEADLINE,)), [], "optimizer", None, None, tracked=False)
    assert advice_lines(untracked.advice) == ("per-iteration leak in heap: 1.0 MiB/step",)


def test_graphs_new_in_the_cell_that_do_not_grow_are_not_a_leak() -> None:
    last = suspect("last", points([9_800] * 12))  # the last step's 14-node graph, kept
    assert fuse(diagnosis("clean"), [last], "optimizer", None, None).verdict == "clean"
    too_short = diagnosis("unknown", advice=(note("too few steps", needs=12, clock="optimizer"),))
    assert advice_lines(too_short.advice) == ("too few steps for a verdict: needs at least 12 sampled steps",)
    assert fuse(too_short, [last], "optimizer", None, None) == replace(too_short, verdict="clean", advice=())
    unjudged = suspect("last", points([9_800] * 2))
    for curves in (diagnosis("clean"), too_short):
        still = fuse(curves, [unjudged], "optimizer", None, None)
        assert still.verdict == "suspect" and advice_lines(still.advice) == (
            "last holds autograd graphs new in this run; too few scans to tell whether they grow",
        )
    old = replace(unjudged, new_in_cell=False)  # graphs that were there before the cell are not evidence
    assert fuse(diagnosis("clean"), [old], "optimizer", None, None).verdict == "clean"


# ----------------------------------------------------------------------------- the scans during the run


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_scans_record_sizes_from_the_baseline_and_stay_within_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchmem_magic.finder.holder_tracking as tracking

    # the schedule runs on the fake clock; a scan's own time limit is real time, which a busy machine can
    # exceed (a cut-short scan is left out, by design): not what this test is about
    monkeypatch.setattr(tracking, "MID_RUN_BUDGET", replace(tracking.MID_RUN_BUDGET, time_s=60.0))
    clock = FakeClock()
    cache: list[torch.Tensor] = []
    tracker = HolderTracker(lambda: [Root("cache", "user", "cache", cache)], {"cache": 0}, {"cache"}, clock=clock)
    scanned_at = []
    for step in range(1, 2001):
        cache.append(torch.ones(1024))  # 4 KiB a step
        clock.now += 0.001  # a 1 ms step
        if tracker.due():
            scanned_at.append(step)
            tracker.scan(step)
            clock.now += 0.005  # each scan "costs" 5 ms
    series = tracker.snapshot()["cache"]
    assert series[0] == (0, 0) and series[1][0] == scanned_at[0]
    assert [s for s, _ in series[1:]] == scanned_at[: len(series) - 1] or len(scanned_at) > MAX_POINTS
    assert all(b > a for (_, a), (_, b) in zip(series, series[1:]))
    run_s = clock.now
    assert tracker.spent_s <= 0.06 + 0.01 * run_s + 0.005  # the one-off allowance, 1 % of the run, one scan over
    assert tracker.kinds["cache"] == "tensor-cache"
    assert holder_trend("cache", series).growing


def test_scans_are_bounded_in_number_points_and_restart_with_a_new_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchmem_magic.finder.scan_schedule

    monkeypatch.setattr(torchmem_magic.finder.scan_schedule, "GAP_SHARE_OF_RUN", 0.0)  # a scan at every step
    clock = FakeClock()
    kept: list[torch.Tensor] = []
    tracker = HolderTracker(lambda: [Root("kept", "user", "kept", kept)], budget_share=1.0, min_gap_s=0.0, clock=clock)
    for step in range(1, 500):
        kept.append(torch.ones(16))
        clock.now += 1.0
        if tracker.due():
            tracker.scan(step)
    assert tracker.scans == MAX_SCANS and len(tracker.snapshot()["kept"]) <= MAX_POINTS
    tracker.restart()
    assert tracker.snapshot() == {}


def test_scans_thin_out_as_the_run_goes_on() -> None:
    clock = FakeClock()
    kept: list[torch.Tensor] = [torch.ones(16)]
    tracker = HolderTracker(lambda: [Root("kept", "user", "kept", kept)], budget_share=1.0, clock=clock)
    at = []
    for step in range(1, 40_001):
        clock.now += 0.1  # a 100 ms step: 4,000 s in all
        if tracker.due():
            at.append(clock.now)
            tracker.scan(step)
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert at[0] == pytest.approx(0.1) and gaps[0] == pytest.approx(0.1)  # dense at first
    assert all(b >= a - 0.1 - 1e-9 for a, b in zip(gaps, gaps[1:]))  # then further apart (to a step)
    assert at[-1] > 3000 and tracker.scans < MAX_SCANS  # still measuring near the end of a long run


def test_a_fast_loop_is_also_scanned_at_doubling_steps_within_the_budget() -> None:
    """A loop of 0.1 ms steps makes hundreds of steps between two time-paced scans: the first scans come
    at steps 1, 2, 4, ... so a holder's growth per step is measured within a few dozen steps."""
    clock = FakeClock()
    kept: list[torch.Tensor] = []

    def roots() -> list[Root]:
        clock.now += 0.0005  # each scan "costs" 0.5 ms
        return [Root("kept", "user", "kept", kept)]

    tracker = HolderTracker(roots, {"kept": 0}, {"kept"}, clock=clock)
    scanned_at = []
    for step in range(1, 301):
        kept.append(torch.ones(1024))  # 4 KiB a step
        clock.now += 0.0001
        if tracker.due(step):
            scanned_at.append(step)
            tracker.scan(step)
    assert scanned_at[:6] == [1, 2, 4, 8, 16, 32], scanned_at
    assert len(scanned_at) <= 6 + 3  # then the time gaps again (20 ms at least)
    assert holder_trend("kept", tracker.snapshot()["kept"]).growing
    slow = HolderTracker(lambda: [Root("kept", "user", "kept", kept)], clock=clock)
    slow_at = []
    for step in range(1, 301):
        clock.now += 0.0001
        if slow.due():  # without the step: time-paced only
            slow_at.append(step)
            slow.scan(step)
    assert len(slow_at) <= 3, slow_at


def test_step_paced_scans_wait_for_the_budget() -> None:
    clock = FakeClock()
    kept: list[torch.Tensor] = [torch.ones(16)]

    def roots() -> list[Root]:
        clock.now += 0.01  # a 10 ms scan: 1 % of the run allows the next one a second later
        return [Root("kept", "user", "kept", kept)]

    tracker = HolderTracker(roots, clock=clock, start_allowance_s=0.0)
    scanned_at = []
    for step in range(1, 201):
        clock.now += 0.0001
        if tracker.due(step):
            scanned_at.append(step)
            tracker.scan(step)
    assert scanned_at == [1], scanned_at


def test_a_busy_machine_gets_as_many_first_scans_as_a_quiet_one() -> None:
    """Other processes on the core stretch a scan's wall time and the loop's steps alike, not the scan's CPU
    time: the one-off allowance is CPU time, so a short loop on a busy machine is scanned as often as on a
    quiet one (a holder whose trend needs four scans is judged there too)."""

    def scans_made(load: float) -> list[int]:
        wall, cpu = FakeClock(), FakeClock()
        kept: list[torch.Tensor] = []

        def roots() -> list[Root]:
            cpu.now += 0.008  # an 8 ms scan ...
            wall.now += 0.008 * load  # ... that the other processes' share of the core stretches
            return [Root("kept", "user", "kept", kept)]

        tracker = HolderTracker(roots, {"kept": 0}, {"kept"}, clock=wall, cpu_clock=cpu)
        scanned_at = []
        for step in range(1, 61):  # a short loop of 50 ms steps, stretched alike
            kept.append(torch.ones(1024))
            wall.now += 0.05 * load
            cpu.now += 0.05
            if tracker.due(step):
                scanned_at.append(step)
                tracker.scan(step)
        return scanned_at

    quiet, busy = scans_made(1.0), scans_made(3.0)
    assert len(quiet) >= 4, quiet
    assert busy == quiet


def test_the_end_scan_is_the_last_point_of_a_holder_whose_scans_stopped_early() -> None:
    """A short loop's scans thin out: a holder measured up to step 50 of 240 grew less there than a leak's
    minimum, and more by the end. The end-of-cell scan's figure ends its series, so its trend covers the run;
    a name the run did not measure, a figure cut short and a holder without tensors get no point."""
    from torchmem_magic.analysis.holder_trends import MIN_GROWTH_BYTES
    from torchmem_magic.finder.leak_finder import with_end_points
    from torchmem_magic.finder.scan.results import RootStats

    def stats(name: str, tensor_bytes: int, **more: Any) -> RootStats:
        return RootStats(name, "user", name, "list", tensors=more.pop("tensors", 1), tensor_bytes=tensor_bytes, **more)

    during = {"outputs": [(s, 769_568 + 4_904 * (s - 1)) for s in (1, 2, 4, 8, 16, 32, 50)], "flat": [(1, 10), (9, 10)]}
    assert not holder_trend("outputs", during["outputs"]).growing  # 235 KiB over its scans: under the minimum
    end = with_end_points(during, [stats("outputs", 1_941_624), stats("flat", 10 << 20, truncated=True),
                                   stats("new", 1 << 20), stats("empty", 0, tensors=0)], last_step=240)
    assert end["outputs"][-1] == (240, 1_941_624) and end["outputs"][:-1] == during["outputs"]
    assert holder_trend("outputs", end["outputs"]).growing
    assert 4_904 * 239 >= MIN_GROWTH_BYTES
    assert end["flat"] == during["flat"] and "new" not in end and "empty" not in end
    assert with_end_points(during, [stats("outputs", 1)], last_step=50) == during  # no step after the last scan
    jumps = {"kept": [(s, (s // 40) * (20 << 20)) for s in (41, 60, 81, 100, 121, 140, 161)]}
    assert holder_trend("kept", jumps["kept"]).growing  # its own scans say where it jumped: no point added
    assert with_end_points(jumps, [stats("kept", 100 << 20)], last_step=200) == jumps


def test_a_holder_its_scans_cannot_judge_yet_is_named_by_the_container_that_filled() -> None:
    """A short run's scans: the baseline, one scan, then the end's figure (a step clock that changed, a quarter
    of the run between scans). Three points are too few to call a trend either way, so the holder is judged as
    one the scans did not measure: a container inside it filled with >= 1 MiB of tensors during the run."""
    from torchmem_magic.finder.leak_finder import LeakFinder, LeakSearch
    from torchmem_magic.finder.scan.memo import ScanMemo

    class Trainer:
        def __init__(self) -> None:
            self.model = torch.nn.Linear(64, 64)
            self.kept_logits: list[torch.Tensor] = []

    trainer = Trainer()
    finder = LeakFinder(LeakSearch(lambda: [Root("trainer", "user", "trainer", trainer)]), ScanMemo(), True)
    finder.start()
    trainer.kept_logits.append(torch.ones(25_600))  # 100 KiB at the first step
    finder.scan(1)
    trainer.kept_logits.extend(torch.ones(25_600) for _ in range(159))  # 16 MiB by the end, step 160
    found = finder.finish(True, last_step=160)
    finder.close()
    assert [s.name for s in found] == ["trainer"] and found[0].path.startswith("trainer.kept_logits"), found
