"""The y range rule of both figures' strips, on synthetic readings (stdlib only)."""

from __future__ import annotations

from torchmem_magic.render.axis_range import (
    AxisRange,
    fitted_range,
    min_span_bytes,
    steady_range,
    threshold_in_view,
    with_headroom,
)

MIB = float(1 << 20)
GIB = float(1 << 30)


def _fill(axis: AxisRange, low: float, high: float) -> float:
    """The share of the plot's height the readings from `low` to `high` cover."""
    return (high - low) / axis.span_bytes


def test_a_staircase_fills_the_range_instead_of_sitting_on_a_zero_based_axis() -> None:
    axis = fitted_range(150 * MIB, 190 * MIB)  # the quickstart's heap, epoch after epoch
    assert 140 * MIB < axis.low_bytes < 150 * MIB and 190 * MIB < axis.high_bytes < 200 * MIB
    assert _fill(axis, 150 * MIB, 190 * MIB) > 0.8


def test_a_flat_curve_stays_flat() -> None:
    heap = fitted_range(100 * MIB, 100 * MIB + 64 * 1024)  # 64 KiB of noise on 100 MiB
    assert heap.span_bytes >= 4 * MIB and _fill(heap, 100 * MIB, 100 * MIB + 64 * 1024) < 0.02
    assert heap.low_bytes < 100 * MIB < heap.high_bytes  # centred, not at an edge
    ram = fitted_range(4 * GIB, 4 * GIB + 3 * MIB)  # a few MiB of wobble on 4 GiB: a share of the level
    assert ram.span_bytes >= 0.02 * 4 * GIB and _fill(ram, 4 * GIB, 4 * GIB + 3 * MIB) < 0.05
    assert min_span_bytes(10 * MIB) == 4 << 20 and min_span_bytes(10 * GIB) == 0.02 * 10 * GIB


def test_never_below_zero() -> None:
    assert fitted_range(0.0, 1 * MIB).low_bytes == 0.0
    assert fitted_range(0.0, 0.0) == AxisRange(0.0, fitted_range(0.0, 0.0).high_bytes)


def test_the_range_stays_put_while_the_readings_move_inside_it() -> None:
    first = steady_range(100 * MIB, 120 * MIB, None)
    assert steady_range(101 * MIB, 119 * MIB, first) is first
    assert steady_range(100 * MIB, first.high_bytes, first) is first


def test_a_climbing_curve_expands_the_range_in_steps_not_at_every_redraw() -> None:
    axis: AxisRange | None = None
    changes, fills = 0, []
    for tick in range(400):  # 0.5 MiB a redraw for 400 redraws: 100 -> 300 MiB
        high = 100 * MIB + tick * 0.5 * MIB
        new = steady_range(100 * MIB, high, axis)
        changes += new != axis
        axis = new
        fills.append(_fill(axis, 100 * MIB, high))
    assert changes < 25  # a few expansions, each with room ahead
    assert min(fills[20:]) > 0.6  # the climb always fills most of the plot
    assert axis is not None and axis.low_bytes == steady_range(100 * MIB, 100 * MIB, None).low_bytes  # the bottom held


def test_the_side_left_moves_the_other_holds() -> None:
    first = steady_range(100 * MIB, 120 * MIB, None)
    grown = steady_range(100 * MIB, 130 * MIB, first)
    assert grown.low_bytes == first.low_bytes and grown.high_bytes > 130 * MIB
    fallen = steady_range(95 * MIB, 120 * MIB, first)
    assert fallen.high_bytes == first.high_bytes and fallen.low_bytes < 95 * MIB


def test_a_range_much_larger_than_the_readings_is_refitted() -> None:
    wide = steady_range(100 * MIB, 900 * MIB, None)  # e.g. a threshold that is no longer drawn
    narrow = steady_range(100 * MIB, 120 * MIB, wide)
    assert narrow == fitted_range(100 * MIB, 120 * MIB)
    jumped = steady_range(500 * MIB, 510 * MIB, steady_range(0.0, 8 * MIB, None))  # another x axis
    assert jumped == fitted_range(500 * MIB, 510 * MIB)


def test_a_guard_threshold_joins_the_range_once_the_curve_is_half_way_there() -> None:
    assert not threshold_in_view(300 * MIB, 900 * MIB)
    assert threshold_in_view(450 * MIB, 900 * MIB)
    assert not threshold_in_view(450 * MIB, 0.0)


def test_headroom_for_a_legend_is_added_on_top() -> None:
    axis = AxisRange(100 * MIB, 200 * MIB)
    assert with_headroom(axis, 0.25) == AxisRange(100 * MIB, 225 * MIB)
