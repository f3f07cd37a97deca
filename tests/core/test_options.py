"""The options every front end builds once: checked when built, frozen after."""

from __future__ import annotations

import dataclasses

import pytest

from torchmem_magic.core.options import SessionOptions


def test_options_are_frozen_and_keep_the_guard_as_a_share() -> None:
    options = SessionOptions(10, guard="90%")
    assert options.interval_s == pytest.approx(0.01) and options.guard_share == pytest.approx(0.9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.interval_ms = 20  # type: ignore[misc]


@pytest.mark.parametrize("interval_ms", [0, 0.5, 10_001, float("nan"), "10"])
def test_a_bad_interval_fails_where_the_options_are_written(interval_ms: object) -> None:
    with pytest.raises(ValueError, match="interval must be between 1 and 10000 ms"):
        SessionOptions(interval_ms)  # type: ignore[arg-type]


@pytest.mark.parametrize("guard", ["most", 0, 150, "-5%", True])
def test_a_bad_guard_fails_where_the_options_are_written(guard: object) -> None:
    with pytest.raises(ValueError, match="guard takes a share of the limit"):
        SessionOptions(guard=guard)  # type: ignore[arg-type]
