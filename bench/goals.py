"""Judging benchmark figures against their goals and stored baselines (`bench/goals.json`).

Pure: the standard library only, so the judging is tested on every supported Python without torch
(tests/core/test_bench_check.py); `bench/check.py` measures the figures and hands them here.

A figure *fails* when it passes its goal (a hard limit in its unit), when it is worse than its stored
baseline by more than the baseline's tolerance (a regression), or when it was not measured at all.
The quantity compared with the baseline is the figure itself, or, for a figure whose absolute value
the machine's load moves, its ratio to a reference timed interleaved with it (`Measured.vs_reference`),
so that the baseline of a noisy figure is a ratio, which the load mostly cancels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GOALS_PATH = Path(__file__).resolve().parent / "goals.json"

PASS, FAIL, SKIP = "ok", "FAIL", "skipped"
WITHIN = "within goal and baseline"


@dataclass(frozen=True)
class Measured:
    """One figure as a benchmark run produced it."""

    value: float  # in the figure's unit: what the goal limits
    vs_reference: float | None = None  # the figure over a reference timed interleaved with it (noisy figures)
    detail: str = ""  # quartiles, raw timings: printed beside the value


@dataclass(frozen=True)
class Skipped:
    """A figure that cannot be measured on this machine (a missing tool), said in one line."""

    reason: str


@dataclass(frozen=True)
class Spec:
    """What `goals.json` says of one figure."""

    name: str
    group: str  # the benchmark that measures it (`check.py --only GROUP`)
    unit: str
    better: str  # "lower" or "higher"
    goal: float | None  # the hard limit (a maximum when lower is better, a minimum when higher is)
    baseline: float | None  # of the compared quantity: the figure, or its ratio to the reference
    tolerance: float  # how far worse than the baseline still counts as noise
    tolerance_is_relative: bool  # a share of the baseline, or an amount in the compared quantity's unit
    reference: str | None  # what the figure is divided by before it meets the baseline (None: nothing)

    def worse(self, a: float, b: float) -> bool:
        """Whether `a` is worse than `b` for this figure."""
        return a > b if self.better == "lower" else a < b

    def allowed(self) -> float | None:
        """The worst compared quantity that still counts as the baseline's noise."""
        if self.baseline is None:
            return None
        margin = abs(self.baseline) * self.tolerance if self.tolerance_is_relative else self.tolerance
        return self.baseline + margin if self.better == "lower" else self.baseline - margin


@dataclass(frozen=True)
class Row:
    """One line of the check's table."""

    spec: Spec
    measured: Measured | Skipped | None
    status: str  # PASS, FAIL or SKIP
    why: str  # what passed or failed, in words


def parse(document: dict[str, Any]) -> list[Spec]:
    """The figures of a `goals.json` document, in its order; a malformed entry stops with its name."""
    specs = []
    for name, entry in document["figures"].items():
        better = entry.get("better", "lower")
        if better not in ("lower", "higher"):
            raise ValueError(f"{name}: 'better' is {better!r}, not 'lower' or 'higher'")
        tolerance = entry.get("tolerance", {})
        if set(tolerance) - {"relative", "absolute"} or len(tolerance) != 1:
            raise ValueError(f"{name}: the tolerance is one of {{'relative': share}} or {{'absolute': amount}}")
        kind, amount = next(iter(tolerance.items()))
        goal, baseline = entry.get("goal"), entry.get("baseline")
        specs.append(Spec(
            name=name, group=entry["group"], unit=entry["unit"], better=better,
            goal=None if goal is None else float(goal), baseline=None if baseline is None else float(baseline),
            tolerance=float(amount), tolerance_is_relative=kind == "relative", reference=entry.get("reference"),
        ))
    return specs


def load(path: Path = GOALS_PATH) -> tuple[dict[str, Any], list[Spec]]:
    """The document (kept whole, so that rewriting baselines keeps its notes) and its figures."""
    document = json.loads(path.read_text(encoding="utf-8"))
    return document, parse(document)


def compared(spec: Spec, measured: Measured) -> float | None:
    """The quantity set against the baseline: the ratio to the reference where the figure has one."""
    return measured.value if spec.reference is None else measured.vs_reference


def judge(spec: Spec, measured: Measured | Skipped | None) -> Row:
    """Pass or fail one figure: its goal first, then its baseline; an unmeasured figure fails."""
    if isinstance(measured, Skipped):
        return Row(spec, measured, SKIP, measured.reason)
    if measured is None:
        return Row(spec, None, FAIL, "not measured: the benchmark produced no such figure")
    problems = []
    if spec.goal is not None and spec.worse(measured.value, spec.goal):
        problems.append(f"past its goal ({'max' if spec.better == 'lower' else 'min'} {_number(spec.goal)} {spec.unit})")
    quantity, allowed = compared(spec, measured), spec.allowed()
    if allowed is None:
        problems.append("no stored baseline (run with --update-baselines)")
    elif quantity is None:
        problems.append(f"measured without its reference ({spec.reference})")
    elif spec.worse(quantity, allowed):
        problems.append(f"regressed past its baseline's tolerance (worst allowed {_number(allowed)})")
    if problems:
        return Row(spec, measured, FAIL, "; ".join(problems))
    assert spec.baseline is not None and quantity is not None
    if spec.worse(spec.baseline, quantity) and _beyond_noise(spec, quantity):
        return Row(spec, measured, PASS, "better than its baseline beyond the noise (--update-baselines keeps it)")
    return Row(spec, measured, PASS, WITHIN)


def _beyond_noise(spec: Spec, quantity: float) -> bool:
    """Whether `quantity` is better than the baseline by more than the tolerance."""
    assert spec.baseline is not None
    gap = abs(quantity - spec.baseline)
    return gap > (abs(spec.baseline) * spec.tolerance if spec.tolerance_is_relative else spec.tolerance)


def judge_all(specs: list[Spec], measured: dict[str, Measured | Skipped]) -> list[Row]:
    """A row per figure of `specs` (a figure absent from `measured` fails as not measured)."""
    return [judge(spec, measured.get(spec.name)) for spec in specs]


def unknown(specs: list[Spec], measured: dict[str, Measured | Skipped]) -> list[str]:
    """Figures a benchmark produced that goals.json does not list (nothing would check them)."""
    known = {spec.name for spec in specs}
    return [name for name in measured if name not in known]


def failed(rows: list[Row]) -> bool:
    return any(row.status == FAIL for row in rows)


def with_baselines(document: dict[str, Any], specs: list[Spec], measured: dict[str, Measured | Skipped]) -> dict[str, Any]:
    """The document with each measured figure's baseline replaced by this run's compared quantity
    (goals and tolerances untouched; figures not measured keep theirs)."""
    figures = {name: dict(entry) for name, entry in document["figures"].items()}
    for spec in specs:
        result = measured.get(spec.name)
        if isinstance(result, Measured):
            quantity = compared(spec, result)
            if quantity is not None:
                figures[spec.name]["baseline"] = float(f"{quantity:.6g}")
    return {**document, "figures": figures}


def save(document: dict[str, Any], path: Path = GOALS_PATH) -> None:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _baseline_text(spec: Spec) -> str:
    if spec.baseline is None:
        return "—"
    tolerance = f"{spec.tolerance:.0%}" if spec.tolerance_is_relative else f"{_number(spec.tolerance)}"
    quantity = _number(spec.baseline) + ("" if spec.reference else f" {spec.unit}")
    return f"{quantity} ± {tolerance}" + (f" (ratio to {spec.reference})" if spec.reference else "")


def _measured_text(spec: Spec, measured: Measured | Skipped | None) -> str:
    if measured is None:
        return "—"
    if isinstance(measured, Skipped):
        return "skipped"
    text = f"{_number(measured.value)} {spec.unit}"
    if spec.reference is not None and measured.vs_reference is not None:
        text += f", ratio {_number(measured.vs_reference)}"
    return text + (f" ({measured.detail})" if measured.detail else "")


def table(rows: list[Row]) -> str:
    """The check's table, in Markdown: figure, measured, baseline, goal, status."""
    lines = ["| figure | measured | baseline (tolerance) | goal | status |", "|---|---|---|---|---|"]
    for row in rows:
        spec = row.spec
        goal = "—" if spec.goal is None else f"{'≤' if spec.better == 'lower' else '≥'} {_number(spec.goal)} {spec.unit}"
        status = row.status if row.why == WITHIN else f"{row.status}: {row.why}"
        lines.append(f"| {spec.name} | {_measured_text(spec, row.measured)} | {_baseline_text(spec)} | {goal} | {status} |")
    return "\n".join(lines)
