"""What the live verdict costs on a full timeline, counted in points rather than timed: it is recomputed
every second on the sampler thread, so what it reads must not grow with the run."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from torchmem_magic.report import assemble as report
from torchmem_magic.core import resources
from torchmem_magic.report.assemble import diagnose
from torchmem_magic.report.live_status import LIVE_VERDICT_ROWS
from torchmem_magic.core.timeline import Timeline

from idle_views import idle_view

MIB = 1 << 20
JUDGED = [r.column for r in resources.RESOURCES if r.judged]


def _full_timeline(epochs: int = 400) -> Timeline:
    """Every judged column at one row short of the capacity, a leak in the heap, hundreds of epochs."""
    rng = random.Random(5)
    timeline = Timeline(2000)
    for i in range(timeline.capacity - 1):
        step = 1.0 + 50 * i
        noisy = {column: 100 * MIB + rng.gauss(0, 64 * 1024) for column in JUDGED}
        timeline.by_step.append({**noisy, "t_s": step / 20, "step": step, resources.HEAP.column: 400 * MIB + 2048 * step})
    for k in range(epochs):
        timeline.add_pass(k * 12.5, 1, (250 * k, 0, 0, 0))
    return timeline


def _series_judged(monkeypatch: pytest.MonkeyPatch) -> list[Sequence[Any]]:
    """Each call of the detector (via report.decide): the series it was handed."""
    calls: list[Sequence[Any]] = []
    decide = report.decide

    def spy(series: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        calls.append(series)
        return decide(series, *args, **kwargs)

    monkeypatch.setattr(report, "decide", spy)
    return calls


def test_the_live_recompute_on_a_full_timeline_judges_a_bounded_number_of_points(monkeypatch: pytest.MonkeyPatch) -> None:
    timeline = _full_timeline()
    view = idle_view(timeline)
    view._steps.carried_by(1)
    for _ in range(100_000):
        view._steps.count("optimizer")
    view._runtime.start()
    calls = _series_judged(monkeypatch)
    live = view.live_verdict()
    assert live is not None and (live.verdict, live.resource) == ("leak", "heap")
    (series,) = calls
    assert len(series) == len(JUDGED)  # every resource still judged ...
    assert all(len(s.steps) == len(s.values) <= LIVE_VERDICT_ROWS for s in series)  # ... on a bounded share of it
    assert sum(len(s.steps) for s in series) <= LIVE_VERDICT_ROWS * len(JUDGED) < len(JUDGED) * (timeline.capacity - 1)
    # the final report's verdict reads every row, and agrees
    calls.clear()
    final = diagnose(timeline, view.steps, 5000.0, 64.0 * (1 << 30), loader=1)
    assert max(len(s.steps) for s in calls[0]) == timeline.capacity - 1
    assert (final.verdict, final.leak_kind, final.resource) == (live.verdict, live.leak_kind, live.resource)
    assert live.per_step_bytes == pytest.approx(final.per_step_bytes, rel=0.05)
