import math

import pytest

from torchmem_magic.core.timeline import (
    COLUMNS,
    NAN,
    DecimatingSeries,
    Timeline,
    column_index,
)


def row(t: float, step: float = 0, ram: float = 0.0, **values: float) -> dict[str, float]:
    return {"t_s": t, "step": step, "ram_bytes": ram, **values}


def test_keeps_everything_below_capacity() -> None:
    s = DecimatingSeries(capacity=8)
    for i in range(5):
        s.append(row(i, i, 10.0 * i))
    assert list(s.column("ram_bytes")) == [0, 10, 20, 30, 40]
    assert s.stride == 1 and s.count == 5


def test_bounded_and_peak_preserving_over_a_day() -> None:
    """24 h at 100 ms = 864,000 rows; the store stays at its capacity and never loses the peak."""
    s = DecimatingSeries(capacity=2000)
    spike_at = 500_123
    for i in range(864_000):
        s.append(row(i * 0.1, i, 1e9 + (5e9 if i == spike_at else 0.0)))
    assert len(s) <= 2000
    assert s.nbytes() < 2 * 2000 * len(COLUMNS) * 8  # well under a few MB
    assert max(s.column("ram_bytes")) == 6e9  # the one-sample spike survived decimation
    assert s.max("ram_bytes") == 6e9
    times = s.column("t_s")
    assert times[0] == 0.0 and list(times) == sorted(times)
    assert s.first_value("t_s") == 0.0 and s.last_value("t_s") == pytest.approx(86_399.9)


def test_x_columns_keep_first_value_when_merging() -> None:
    s = DecimatingSeries(capacity=4)
    for i in range(8):
        s.append(row(float(i), float(i), float(i)))
    steps = list(s.column("step"))
    assert steps == sorted(steps) and steps[0] == 0.0
    assert list(s.column("ram_bytes"))[-1] >= steps[-1]  # max of the merged rows


def test_nan_columns_stay_nan_and_max_ignores_nan() -> None:
    s = DecimatingSeries(capacity=4)
    for i in range(10):
        s.append(row(i, i, 1.0, heap_bytes=NAN if i % 2 else 5.0))
    assert all(math.isnan(v) for v in s.column("vram_allocated_bytes"))
    assert s.max("heap_bytes") == 5.0
    assert math.isnan(s.max("shm_used_bytes"))


def test_columns_a_row_leaves_out_are_nan() -> None:
    s = DecimatingSeries()
    s.append({"t_s": 1.0, "heap_bytes": 5.0})
    assert s.last_value("heap_bytes") == 5.0 and math.isnan(s.last_value("ram_bytes"))
    assert [math.isnan(v) for v in s.last or ()] == [name not in ("t_s", "heap_bytes") for name in COLUMNS]


def test_rejects_bad_rows_and_capacity() -> None:
    with pytest.raises(KeyError, match="unknown column.*rss"):
        DecimatingSeries().append({"t_s": 1.0, "rss": 2.0})
    with pytest.raises(ValueError, match="even"):
        DecimatingSeries(capacity=5)
    with pytest.raises(KeyError, match="known"):
        column_index("nope")


def test_epoch_markers_bounded() -> None:
    tl = Timeline()
    for i in range(Timeline.MAX_EPOCH_MARKERS + 10):
        tl.add_pass(float(i), 1 + i % 2, (i, 0, 2 * i, 0))
    assert tl.epoch_count(None) == Timeline.MAX_EPOCH_MARKERS + 10
    assert tl.epoch_count(1) == tl.epoch_count(2) == Timeline.MAX_EPOCH_MARKERS // 2 + 5
    assert len(tl.epochs) == Timeline.MAX_EPOCH_MARKERS
    assert [m.step_of("batch") for m in tl.epochs_of(2)[:2]] == [2, 6] and tl.epochs[3].step_of("time") == 0


def test_thinned_columns_keep_at_most_the_bound_with_the_first_and_last_rows() -> None:
    s = DecimatingSeries(capacity=2000)
    for i in range(1999):
        s.append(row(float(i), step=float(i)))
    for at_most in (2, 3, 160, 1998):
        steps = s.columns("step", "t_s", at_most=at_most)["step"]
        assert len(steps) <= at_most and steps[0] == 0.0 and steps[-1] == 1998.0
        gaps = {b - a for a, b in zip(steps, steps[1:])}
        assert len(gaps) <= 2  # even strides (the last one shorter)
    assert list(s.columns("step", at_most=2000)["step"]) == list(s.column("step"))  # short enough: untouched
    with pytest.raises(ValueError, match="at least 2"):
        s.columns("step", at_most=1)
