"""Each holder's share of the leak's growth, and the rule that a holder explaining too little of it is no
answer: a bystander found beside a leak (a tiny constant, a bounded buffer) is listed as a partial candidate
at most, never named as the holder, whatever found it."""

from __future__ import annotations

import pytest
from test_report import MIB, evidence, timeline

from torchmem_magic.analysis.holder_trends import MIN_HOLDER_SHARE, top_holder
from torchmem_magic.analysis.holders import HolderSearch
from torchmem_magic.core.model import Suspect
from torchmem_magic.report.assemble import assemble_report

STEPS = 200
SCANS = (0, 25, 50, 75, 100, 125, 150, 175, 200)


def grown(name: str, per_step: float, start: int = 0, kind: str = "autograd-graph") -> tuple[Suspect, list[tuple[int, int]]]:
    series = [(s, int(start + per_step * s)) for s in SCANS]
    return Suspect(name, f"{name}[0]", kind, 10, 10, series[-1][1], True, f"fix {name}"), series


def leak_report(*holders: tuple[Suspect, list[tuple[int, int]]], found: tuple[Suspect, ...] = ()):  # type: ignore[no-untyped-def]
    search = None if not found else HolderSearch(found, 2, 64, 900, False, 0.1)
    return assemble_report(evidence(
        timeline(STEPS, heap_per_step=MIB), STEPS, suspects=tuple(s for s, _ in holders),
        holder_series={s.name: points for s, points in holders}, holder_search=search,
    ))


def test_the_holder_that_carries_the_leak_explains_it_and_is_named() -> None:
    report = leak_report(grown("history", 0.97 * MIB))
    (history,) = report.suspects
    assert history.growth_share == pytest.approx(0.97, abs=0.03)
    assert history.to_dict()["growth_share"] == history.growth_share
    assert top_holder(report.suspects, or_largest=True) is history
    assert any("that is where it goes (97% of it)" in line for line in report.advice), report.advice
    assert "explains 97% of the growth" in str(report)


def test_a_holder_that_grows_once_an_epoch_is_measured_by_its_net_growth_not_a_slope_of_its_flats() -> None:
    """Scans come often early and seldom late: a holder kept at each epoch's end (100 MiB at steps 100 and 200)
    has most of its scans on its first flat, where a robust slope of the scans reads no growth at all."""
    scans = (0, 1, 2, 4, 8, 16, 27, 43, 64, 92, 103, 151, 200)
    series = [(s, 100 * MIB * (s // 100)) for s in scans]
    val_outputs = Suspect("val_outputs", "val_outputs[0]", "tensor-cache", 10, 10, series[-1][1], True, "fix it")
    report = leak_report((val_outputs, series))
    (held,) = report.suspects
    assert held.growth_share == pytest.approx(1.0, abs=0.02), (held.growth_share, held.growth_per_step)
    assert top_holder(report.suspects, or_largest=True) is held
    # the rate said beside the curve's is the same net growth: the two agree, and say where the leak goes
    assert any("and val_outputs grows +1.0 MiB/step: that is where it goes" in line for line in report.advice), report.advice


def test_holders_that_grow_with_too_small_a_share_are_partial_candidates_not_the_holder() -> None:
    report = leak_report(grown("log_buffer", 0.05 * MIB), grown("stats", 0.02 * MIB))
    shares = {s.name: s.growth_share for s in report.suspects}
    assert shares["log_buffer"] == pytest.approx(0.05, abs=0.01) and shares["stats"] == pytest.approx(0.02, abs=0.01)
    assert top_holder(report.suspects, or_largest=True) is None  # no holder stands as the answer
    [line] = [a for a in report.advice if "partial candidates" in a]
    assert line.startswith("the holders that grow explain only 7% of the heap's") and "log_buffer (5%), stats (2%)" in line
    assert not any("that is where it goes" in a for a in report.advice)


def test_a_tiny_constant_the_search_found_is_never_the_holder_of_a_large_leak() -> None:
    constant = Suspect("config.EPS", "config.EPS", "tensor-cache", 1, 0, 4, False, "fix config.EPS")
    report = leak_report(found=(constant,))
    [found] = [s for s in report.suspects if s.name == "config.EPS"]
    assert found.growth_share is not None and found.growth_share < 0.001
    assert top_holder(report.suspects, or_largest=True) is None
    assert any(a.startswith("no holder found explains the growth: the closest, config.EPS") for a in report.advice)
    assert not any("that is where the memory goes" in a for a in report.advice)


def test_a_holder_the_search_found_that_holds_the_growth_is_named() -> None:
    store = Suspect("featurestore.CACHE", "featurestore.CACHE[0]", "tensor-cache", 200, 0, 190 * MIB, False, "fix it")
    report = leak_report(found=(store,))
    [found] = [s for s in report.suspects if s.name == "featurestore.CACHE"]
    assert found.growth_share is not None and found.growth_share >= MIN_HOLDER_SHARE
    assert any("that is where the memory goes" in a for a in report.advice), report.advice


def test_a_bounded_bystander_is_not_named_when_nothing_grows() -> None:
    model, series = grown("model", 0.0, start=300 * MIB, kind="tensor-cache")
    report = leak_report((model, series))
    assert all(s.growth_share == 0.0 for s in report.suspects if s.name == "model")
    assert top_holder(report.suspects, or_largest=True) is None


def test_no_leak_no_share() -> None:
    bystander = Suspect("model", "model.weight", "tensor-cache", 1, 0, 300 * MIB, False, "fix model")
    report = assemble_report(evidence(timeline(STEPS), STEPS, suspects=(bystander,)))
    assert report.verdict == "clean" and all(s.growth_share is None for s in report.suspects)
