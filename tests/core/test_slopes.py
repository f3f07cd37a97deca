import random

import pytest

from torchmem_magic.core.slopes import robust_slope


def test_exact_line() -> None:
    xs = list(range(100))
    assert robust_slope(xs, [3.0 * x + 7 for x in xs]) == pytest.approx(3.0)


def test_robust_to_first_step_jump_and_outliers() -> None:
    """An optimizer's first-step state (one jump) and a few spikes do not bend the slope."""
    rng = random.Random(1)
    xs = list(range(1, 201))
    ys = [1e6 * x + (50e6 if x > 1 else 0) + rng.gauss(0, 2e5) for x in xs]
    for i in (40, 90, 150):
        ys[i] += 80e6
    assert robust_slope(xs, ys) == pytest.approx(1e6, rel=0.05)


def test_flat_noise_is_near_zero() -> None:
    rng = random.Random(2)
    xs = list(range(300))
    assert abs(robust_slope(xs, [1e9 + rng.gauss(0, 1e6) for _ in xs])) < 2e4


def test_too_few_points_and_nans() -> None:
    assert robust_slope([1, 2], [1, 2]) is None
    assert robust_slope([1, 2, 3, 4], [float("nan")] * 4) is None
    assert robust_slope([1, 2, 3, 4, 5], [1, float("nan"), 3, 4, 5]) == pytest.approx(1.0)


def test_subsampling_keeps_slope() -> None:
    xs = list(range(10_000))
    assert robust_slope(xs, [2.0 * x for x in xs], max_points=128) == pytest.approx(2.0)
