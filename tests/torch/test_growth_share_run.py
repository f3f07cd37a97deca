"""A real run's holders, each with its share of the growth: the list that keeps the leak explains most of it
and is named; a list of scalars that grows beside it explains next to nothing and is never the answer, also
where the real holder is one only a search finds (a library's module global)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
import torch

from torchmem_magic import last_report, memwatch
from torchmem_magic.analysis.holder_trends import MIN_HOLDER_SHARE, top_holder

STEPS = 400
outputs: list[torch.Tensor] = []  # the leak: 256 KiB a step
step_times: list[torch.Tensor] = []  # a bystander: one 0-dim tensor a step


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    outputs.clear()
    step_times.clear()
    sys.modules.pop("featurestore", None)


def _train(into_library: bool = False) -> None:
    """No local holds what is kept: a library's global is reached by no frame, only by a search back."""
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        loss = model(torch.randn(32, 64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        (sys.modules["featurestore"].CACHE if into_library else outputs).append(torch.randn(256, 256))  # 256 KiB
        step_times.append(torch.tensor(float(step)))


def _shares() -> dict[str, float | None]:
    report = last_report()
    assert report is not None and report.verdict == "leak", None if report is None else report.advice
    return {s.name: s.growth_share for s in report.suspects}


def test_the_list_that_keeps_the_leak_explains_it_and_the_bystander_does_not() -> None:
    with memwatch(20, quiet=True):
        _train()
    shares, report = _shares(), last_report()
    assert report is not None
    assert (shares.get("outputs") or 0.0) >= 0.5, (shares, report.advice)
    assert shares.get("step_times") is None or shares["step_times"] < MIN_HOLDER_SHARE, shares
    top = top_holder(report.suspects, or_largest=True)
    assert top is not None and top.name == "outputs"


def test_a_bystander_is_not_the_answer_when_the_holder_is_one_only_a_search_finds() -> None:
    library = types.ModuleType("featurestore")
    library.CACHE = []  # type: ignore[attr-defined]
    sys.modules["featurestore"] = library
    with memwatch(20, quiet=True):
        _train(into_library=True)
    del library
    shares, report = _shares(), last_report()
    assert report is not None
    top = top_holder(report.suspects, or_largest=True)
    assert top is None or top.name != "step_times", (shares, report.advice)
    assert shares.get("step_times") is None or shares["step_times"] < MIN_HOLDER_SHARE, shares
    assert any("partial candidates" in a or "featurestore" in a for a in report.advice), report.advice
