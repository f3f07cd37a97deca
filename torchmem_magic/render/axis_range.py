"""A curve's y range fitted to its readings, and kept steady from one redraw to the next (stdlib only).

Drawn from zero, a heap climbing from 150 to 190 MiB is a nearly flat line while the verdict says
"leak": both figures give each curve a scale of its own, fitted to its readings. The live figure
redraws about once a second, so its range is also carried from one redraw to the next: it grows in
steps with room ahead of the curve and shrinks only once the curve uses a small part of it, so the
axis does not twitch at every tick. A flat curve keeps a minimum span, so that its noise is not blown
up to the plot's height.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SPAN_BYTES = 4 << 20  # a flat heap of 100 MiB stays flat: its noise is well under this
MIN_SPAN_SHARE = 0.02  # of the level: a flat 4 GiB of RAM wobbling by a few MiB stays flat too
MARGIN_SHARE = 0.1  # of the drawn span, below and above the readings
GROWTH_ROOM_SHARE = 0.3  # extra room ahead of a curve that left its range: the next steps fit without a change
SHRINK_BELOW_SHARE = 0.4  # a range is refitted once the readings' own fit needs less than this share of it
#: a guard's threshold joins its curve's range once the curve reaches this share of it: before, the
#: threshold would squash the curve to a line at the bottom (its label still says where it is)
GUARD_LINE_FROM = 0.5


@dataclass(frozen=True)
class AxisRange:
    """A y scale's bounds in bytes (the figure divides by its unit).

    Attributes:
        low_bytes: the bottom of the plot, never below zero.
        high_bytes: the top of the plot.
    """

    low_bytes: float
    high_bytes: float

    @property
    def span_bytes(self) -> float:
        return self.high_bytes - self.low_bytes

    def holds(self, low_bytes: float, high_bytes: float) -> bool:
        """Whether readings from `low_bytes` to `high_bytes` are all inside."""
        return self.low_bytes <= low_bytes and high_bytes <= self.high_bytes


def min_span_bytes(level_bytes: float) -> float:
    """The least span a curve at `level_bytes` is drawn over: a few MiB, or a small share of its level."""
    return max(float(MIN_SPAN_BYTES), MIN_SPAN_SHARE * abs(level_bytes))


def fitted_range(low_bytes: float, high_bytes: float) -> AxisRange:
    """The readings' own range with a margin on each side, not from zero.

    Args:
        low_bytes: the lowest reading.
        high_bytes: the highest reading (a guard's threshold included when it is drawn).

    Returns:
        At least `min_span_bytes` of the level, the readings centred in it when they span less;
        a margin of `MARGIN_SHARE` of that span below and above; never below zero.
    """
    spread = max(high_bytes - low_bytes, 0.0)
    drawn = max(spread, min_span_bytes(high_bytes))
    bottom = max(0.0, low_bytes - (drawn - spread) / 2 - MARGIN_SHARE * drawn)
    top = max(bottom + (1 + 2 * MARGIN_SHARE) * drawn, high_bytes + MARGIN_SHARE * drawn)
    return AxisRange(bottom, top)


def steady_range(low_bytes: float, high_bytes: float, previous: AxisRange | None) -> AxisRange:
    """The range to draw now, given the one drawn last time (None: the first draw).

    The previous range stays while it holds the readings and they use enough of it; a curve that
    left it moves only the side it left by, with `GROWTH_ROOM_SHARE` of its span as room ahead (a
    leak's climb expands the axis every so often, not at every redraw); when the readings need much
    less than the range (another x axis, a threshold no longer drawn), it is fitted afresh.

    Args:
        low_bytes: the lowest reading.
        high_bytes: the highest reading (a drawn threshold included).
        previous: the range drawn last time, or None.
    """
    target = fitted_range(low_bytes, high_bytes)
    if previous is None:
        return target
    candidate = previous
    if not previous.holds(low_bytes, high_bytes):
        room = GROWTH_ROOM_SHARE * target.span_bytes
        bottom = previous.low_bytes if low_bytes >= previous.low_bytes else max(0.0, target.low_bytes - room)
        top = previous.high_bytes if high_bytes <= previous.high_bytes else target.high_bytes + room
        candidate = AxisRange(bottom, top)
    if target.span_bytes < SHRINK_BELOW_SHARE * candidate.span_bytes:
        return target
    return candidate


def with_headroom(axis: AxisRange, share: float) -> AxisRange:
    """`axis` with `share` of its span added on top (rows of a legend drawn over the plot's top)."""
    return AxisRange(axis.low_bytes, axis.high_bytes + share * axis.span_bytes)


def threshold_in_view(high_bytes: float, threshold_bytes: float) -> bool:
    """Whether a guard's threshold is drawn in its curve's range: once the curve reached `GUARD_LINE_FROM` of it."""
    return threshold_bytes > 0 and high_bytes >= GUARD_LINE_FROM * threshold_bytes
