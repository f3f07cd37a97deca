"""`make bench-check`'s judging (bench/goals.py): a figure fails past its goal, past its baseline's
tolerance, or when it was not measured; noise within the tolerance passes. Standard library only, like
the rest of tests/core; the benchmarks themselves are never run here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def goals() -> ModuleType:
    return _load("goals")


def _spec(goals: ModuleType, **entry: Any) -> Any:
    figure = {"group": "g", "unit": "ms", "tolerance": {"relative": 0.2}, **entry}
    (spec,) = goals.parse({"figures": {"a figure": figure}})
    return spec


def test_a_figure_over_its_goal_fails_even_at_its_baseline(goals: ModuleType) -> None:
    spec = _spec(goals, goal=20.0, baseline=34.0)
    row = goals.judge(spec, goals.Measured(34.0))
    assert row.status == goals.FAIL and "past its goal" in row.why
    assert goals.judge(spec, goals.Measured(19.0)).status == goals.PASS


def test_a_regression_past_the_tolerance_fails(goals: ModuleType) -> None:
    spec = _spec(goals, goal=100.0, baseline=10.0)
    row = goals.judge(spec, goals.Measured(12.5))
    assert row.status == goals.FAIL and "regressed" in row.why


def test_noise_within_the_tolerance_passes(goals: ModuleType) -> None:
    spec = _spec(goals, baseline=10.0)
    assert goals.judge(spec, goals.Measured(11.9)).status == goals.PASS
    assert goals.judge(spec, goals.Measured(8.1)).why == goals.WITHIN
    improved = goals.judge(spec, goals.Measured(5.0))
    assert improved.status == goals.PASS and "better than its baseline" in improved.why


def test_an_absolute_tolerance_is_in_the_figures_unit(goals: ModuleType) -> None:
    spec = _spec(goals, unit="%", baseline=5.0, tolerance={"absolute": 2.5})
    assert goals.judge(spec, goals.Measured(7.4)).status == goals.PASS
    assert goals.judge(spec, goals.Measured(7.6)).status == goals.FAIL


def test_a_noisy_figure_meets_its_baseline_as_a_ratio_to_its_reference(goals: ModuleType) -> None:
    spec = _spec(goals, goal=1.0, baseline=2.0, reference="gc.collect()")
    # a loaded machine: the scan took twice as long, and so did the reference timed beside it
    slow_machine = goals.judge(spec, goals.Measured(0.8, vs_reference=2.1))
    assert slow_machine.status == goals.PASS
    regressed = goals.judge(spec, goals.Measured(0.8, vs_reference=2.6))
    assert regressed.status == goals.FAIL and "regressed" in regressed.why
    no_reference = goals.judge(spec, goals.Measured(0.5))
    assert no_reference.status == goals.FAIL and "without its reference" in no_reference.why


def test_higher_is_better_turns_goal_and_tolerance_around(goals: ModuleType) -> None:
    spec = _spec(goals, better="higher", goal=1.0, baseline=10.0)
    assert goals.judge(spec, goals.Measured(0.5)).status == goals.FAIL
    assert goals.judge(spec, goals.Measured(7.0)).status == goals.FAIL
    assert goals.judge(spec, goals.Measured(9.0)).status == goals.PASS


def test_a_missing_figure_is_reported_not_passed(goals: ModuleType) -> None:
    specs = goals.parse({"figures": {
        "measured": {"group": "g", "unit": "s", "baseline": 1.0, "tolerance": {"relative": 0.1}},
        "lost": {"group": "g", "unit": "s", "baseline": 1.0, "tolerance": {"relative": 0.1}},
    }})
    rows = goals.judge_all(specs, {"measured": goals.Measured(1.0)})
    assert [row.status for row in rows] == [goals.PASS, goals.FAIL]
    assert "not measured" in rows[1].why and goals.failed(rows)
    assert "| lost | — |" in goals.table(rows) and "FAIL: not measured" in goals.table(rows)


def test_a_figure_without_a_baseline_fails(goals: ModuleType) -> None:
    row = goals.judge(_spec(goals, goal=5.0), goals.Measured(1.0))
    assert row.status == goals.FAIL and "no stored baseline" in row.why


def test_a_skipped_figure_says_why_and_does_not_fail(goals: ModuleType) -> None:
    rows = goals.judge_all([_spec(goals, baseline=1.0)], {"a figure": goals.Skipped("needs valgrind")})
    assert rows[0].status == goals.SKIP and not goals.failed(rows)
    assert "skipped: needs valgrind" in goals.table(rows)


def test_figures_that_goals_do_not_list_are_named(goals: ModuleType) -> None:
    specs = [_spec(goals, baseline=1.0)]
    assert goals.unknown(specs, {"a figure": goals.Measured(1.0), "new": goals.Measured(2.0)}) == ["new"]


def test_updating_baselines_keeps_goals_tolerances_and_unmeasured_figures(goals: ModuleType) -> None:
    document = {"about": "kept", "figures": {
        "timed": {"group": "g", "unit": "s", "goal": 1.0, "baseline": 2.0, "reference": "r",
                  "tolerance": {"relative": 0.3}, "note": "kept"},
        "counted": {"group": "g", "unit": "n", "baseline": 100.0, "tolerance": {"relative": 0.03}},
        "unmeasured": {"group": "g", "unit": "n", "baseline": 7.0, "tolerance": {"relative": 0.03}},
    }}
    specs = goals.parse(document)
    measured = {"timed": goals.Measured(0.9, vs_reference=2.4), "counted": goals.Measured(104.123456)}
    updated = goals.with_baselines(document, specs, measured)
    figures = updated["figures"]
    assert figures["timed"] == {**document["figures"]["timed"], "baseline": 2.4}  # the ratio, not the seconds
    assert figures["counted"]["baseline"] == pytest.approx(104.123)
    assert figures["unmeasured"] == document["figures"]["unmeasured"] and updated["about"] == "kept"
    assert document["figures"]["counted"]["baseline"] == 100.0  # the caller's document untouched


def test_a_malformed_tolerance_is_refused_with_the_figures_name(goals: ModuleType) -> None:
    with pytest.raises(ValueError, match="a figure"):
        _spec(goals, baseline=1.0, tolerance={"relative": 0.1, "absolute": 1.0})


def test_the_stored_goals_parse_and_every_figure_has_a_baseline(goals: ModuleType) -> None:
    document = json.loads((BENCH / "goals.json").read_text(encoding="utf-8"))
    specs = goals.parse(document)
    assert specs and all(spec.baseline is not None for spec in specs)
    # the goals the project set: a check that passes by loosening them is no check
    limits = {spec.name: spec.goal for spec in specs}
    assert limits["overhead, tiny MLP, 100 ms (default)"] == 1.0 and limits["overhead, tiny MLP, 10 ms"] == 3.0
    assert limits["fixed cost of a cell, live figure"] == 20.0 and limits["fixed cost of a cell, -q"] == 5.0


def test_every_stored_figure_belongs_to_a_group_the_check_runs(goals: ModuleType) -> None:
    path = list(sys.path)
    try:
        check = _load("check")  # its imports are the standard library's and goals; the benchmarks load per group
    finally:
        sys.path[:] = path
    specs = goals.parse(json.loads((BENCH / "goals.json").read_text(encoding="utf-8")))
    assert {spec.group for spec in specs} == set(check.MEASURERS)
