"""The verdict's table: every rule it names can be switched off there, alone, and the verdict then is what
the other rules make of the same readings; every threshold has its reason beside it; no rule calls another
(each reads only its readings and the table)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import random
from collections.abc import Callable
from typing import Any

import pytest

from torchmem_magic.analysis import explaining_rules, shape_rules
from torchmem_magic.analysis.findings import Diagnosis, Series
from torchmem_magic.analysis.verdict import decide
from torchmem_magic.analysis.verdict_table import RULES, Thresholds, switched, table, why

MIB = 1 << 20
BASE = 600 * MIB


def _steps(n: int) -> list[float]:
    return [float(s) for s in range(1, n + 1)]


def _noisy(steps: list[float], grown: Callable[[float], float], seed: int, noise: float = 64 * 1024) -> list[float]:
    rng = random.Random(seed)
    return [BASE + grown(s) + rng.gauss(0, noise) for s in steps]


def _ran_out() -> tuple[list[Series], dict[str, Any]]:
    xs = [*_steps(16), 16.0]
    shm = [min(16.0, 16.0 * (x - 1) / 4) * MIB for x in xs]
    return [Series("shm", xs, shm, 16 * MIB), Series("heap", xs, [100 * MIB] * len(xs), 16 * 1024 * MIB)], {
        "ends_after_block": True}


def _staircase() -> tuple[list[Series], dict[str, Any]]:
    steps = _steps(180)
    return [Series("heap", steps, _noisy(steps, lambda s: ((s - 1) // 30) * 40 * MIB, 3))], {
        "epoch_steps": [1.0 + 30 * e for e in range(6)]}


def _jumps() -> tuple[list[Series], dict[str, Any]]:
    steps = _steps(200)
    return [Series("heap", steps, _noisy(steps, lambda s: (s // 40) * 50 * MIB, 4))], {}


def _one_jump() -> tuple[list[Series], dict[str, Any]]:
    steps = _steps(300)
    return [Series("heap", steps, _noisy(steps, lambda s: 50 * MIB if s > 150 else 0.0, 5))], {}


def _filled() -> tuple[list[Series], dict[str, Any]]:
    steps = _steps(400)
    return [Series("heap", steps, _noisy(steps, lambda s: 256 * 1024 * min(max(0.0, s - 120), 120), 1, 128 * 1024))], {}


def _late() -> tuple[list[Series], dict[str, Any]]:
    steps = _steps(400)
    return [Series("heap", steps, _noisy(steps, lambda s: 256 * 1024 * max(0.0, s - 200), 1, 128 * 1024))], {}


def _line() -> tuple[list[Series], dict[str, Any]]:
    steps = _steps(120)
    return [Series("heap", steps, _noisy(steps, lambda s: MIB * s, 1))], {}


def _ramp_read_thinly() -> tuple[list[Series], dict[str, Any]]:
    steps = [float(s) for s in [*range(1, 65), 88, 128, 168, 210, 238, 261, 293, 300]]
    return [Series("heap", steps, _noisy(steps, lambda s: 293 * 1024 * max(0.0, s - 180), 0))], {"ends_after_block": True}


def _reserved() -> tuple[list[Series], dict[str, Any]]:
    steps = _steps(100)
    return [Series("vram", steps, _noisy(steps, lambda s: 0.0, 7, 32 * 1024)),
            Series("vram_reserved", steps, _noisy(steps, lambda s: 2 * MIB * s, 8, 32 * 1024))], {}


def _workers_copying() -> tuple[list[Series], dict[str, Any]]:
    steps = _steps(120)
    return [Series("heap", steps, _noisy(steps, lambda s: 0.0, 19, 8 * 1024)),
            Series("workers", steps, [BASE + min(s - 1, 30) * 4 * MIB for s in steps])], {"first_pass_steps": (1, 30)}


def _rss_kept() -> tuple[list[Series], dict[str, Any]]:
    steps = _steps(100)
    return [Series("heap", steps, _noisy(steps, lambda s: 0.0, 1)),
            Series("ram", steps, _noisy(steps, lambda s: MIB * s, 2))], {}


def _said(d: Diagnosis, key: str) -> bool:
    return any(n.key == key for n in d.advice)


#: rule -> (readings it decides, what shows that it did)
CASES: dict[str, tuple[Callable[[], tuple[list[Series], dict[str, Any]]], Callable[[Diagnosis], bool]]] = {
    "ran-out": (_ran_out, lambda d: any(f.full_at_step is not None for f in d.findings)),
    "per-epoch": (_staircase, lambda d: d.leak_kind == "per-epoch"),
    "level-change": (_one_jump, lambda d: d.verdict == "clean"),
    "sporadic": (_jumps, lambda d: d.leak_kind == "sporadic"),
    "filled-then-flat": (_filled, lambda d: d.verdict == "clean"),
    "started-late": (_late, lambda d: d.findings[0].started_at_step is not None),
    "per-iteration": (_line, lambda d: (d.verdict, d.leak_kind) == ("leak", "per-iteration")),
    "ramp-read-thinly": (_ramp_read_thinly, lambda d: d.leak_kind == "sporadic"),
    "caching-allocator": (_reserved, lambda d: _said(d, "caching allocator")),
    "copy-on-access": (_workers_copying, lambda d: _said(d, "copy on access")),
    "allocator-keeps-rss": (_rss_kept, lambda d: d.verdict == "clean"),
}


def test_every_rule_of_the_table_has_a_case() -> None:
    assert sorted(CASES) == sorted(RULES)
    wired = [name for name, _ in shape_rules.SHAPE_RULES] + [name for name, _ in explaining_rules.EXPLAINING_RULES]
    assert sorted([*wired, "ran-out"]) == sorted(RULES)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_a_rule_switched_off_in_the_table_decides_nothing(rule: str) -> None:
    make, fired = CASES[rule]
    readings, options = make()
    on = decide(readings, **options)
    assert fired(on), (rule, on)
    with switched(rule):
        off = decide(readings, **options)
    assert not fired(off), (rule, off)
    assert decide(readings, **options) == on  # switched on again when the block ends


def test_a_threshold_changed_in_the_table_changes_the_verdict() -> None:
    readings, options = _line()
    assert decide(readings, **options).verdict == "leak"
    with switched(min_total_bytes=1024 * MIB):  # 120 MiB of growth is below it
        assert decide(readings, **options).verdict == "clean"


def test_an_unknown_rule_is_named_in_one_line() -> None:
    with pytest.raises(ValueError, match="no verdict rule sporadik: the rules are ran-out, per-epoch"):
        with switched("sporadik"):
            pass
    assert table().off == frozenset()


def test_every_threshold_says_why() -> None:
    for field in dataclasses.fields(Thresholds):
        assert len(why(field.name)) > 20, field.name


@pytest.mark.parametrize("module", [shape_rules, explaining_rules], ids=["shape", "explaining"])
def test_no_rule_calls_another(module: Any) -> None:
    """Each rule's body names no other rule of the table (helpers that are no rule may be shared)."""
    rules = dict(getattr(module, "SHAPE_RULES", ()) or getattr(module, "EXPLAINING_RULES", ()))
    names = {fn.__name__ for fn in rules.values()}
    for fn in rules.values():
        called = {n.id for n in ast.walk(ast.parse(inspect.getsource(fn))) if isinstance(n, ast.Name)}
        assert not (called & names) - {fn.__name__}, (fn.__name__, called & names)


def test_the_docs_show_the_table_as_it_is() -> None:
    from pathlib import Path

    from torchmem_magic.render.verdict_rules import markdown_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "verdicts.md").read_text()
    shown = page.split("<!-- verdict-table:start -->\n", 1)[1].split("<!-- verdict-table:end -->", 1)[0]
    assert shown == markdown_table(), "run `python -m torchmem_magic.render.verdict_rules` into docs/verdicts.md"
