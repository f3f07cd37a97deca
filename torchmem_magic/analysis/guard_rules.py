"""The memory guard's decision (pure): which watched resource trips it, now or within the time until it
can next stop the loop, and how many steps may pass before it looks again."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: within this share of its limit below the threshold, a resource is checked at every step: a jump there
#: (a batch of segments, a burst of allocations) could pass the threshold in one step
NEAR_MARGIN = 0.05
#: a rate is projected at most this many times as far ahead as the stretch it was measured over: two
#: readings a few milliseconds apart while torch allocates at start-up say nothing of the next 10 s
MAX_EXTRAPOLATION = 4.0


@dataclass(frozen=True)
class Level:
    """One watched resource at one check."""

    resource: str  # "RAM", "/dev/shm", "VRAM cuda:0"
    used_bytes: float  # NaN: not read
    limit_bytes: float
    limit_source: str  # "cgroup v2", "system", "TORCHMEM_MAGIC_RAM_LIMIT", "its size", ...
    per_s_bytes: float | None = None  # growth over the last second; None: unknown
    per_step_bytes: float | None = None
    rate_span_s: float | None = None  # the stretch of time the rate was measured over; None: unknown

    @property
    def share(self) -> float:
        return self.used_bytes / self.limit_bytes

    def seconds_to(self, share: float) -> float | None:
        """Seconds until `share` of the limit at the current rate; None if not growing."""
        if self.per_s_bytes is None or not self.per_s_bytes > 0:
            return None
        return max(0.0, (share * self.limit_bytes - self.used_bytes) / self.per_s_bytes)


@dataclass(frozen=True)
class GuardTrip:
    """A resource at or over its threshold now (`projected` False), or within `horizon_s` at its rate."""

    level: Level
    share: float
    projected: bool
    horizon_s: float


def judged(levels: Sequence[Level]) -> list[Level]:
    """The levels a decision can rest on: a finite limit and a reading."""
    return [lv for lv in levels if lv.limit_bytes > 0 and math.isfinite(lv.limit_bytes) and not math.isnan(lv.used_bytes)]


def guard_trip(levels: Sequence[Level], share: float, horizon_s: float) -> GuardTrip | None:
    """The resource that trips the guard: one at `share` of its limit already (the fullest), else one
    its rate takes there within `horizon_s` (the time until the guard can next stop the loop). A rate
    of zero or less, or an unknown one, counts only what is used now; NaN readings are ignored."""
    checked = judged(levels)
    over = [lv for lv in checked if lv.used_bytes >= share * lv.limit_bytes]
    if over:
        return GuardTrip(max(over, key=lambda lv: lv.share), share, False, 0.0)
    if not horizon_s >= 0:
        return None

    def projected_share(level: Level) -> float:
        ahead_s = horizon_s if level.rate_span_s is None else min(horizon_s, MAX_EXTRAPOLATION * level.rate_span_s)
        return (level.used_bytes + (level.per_s_bytes or 0.0) * ahead_s) / level.limit_bytes

    soon = [lv for lv in checked if lv.per_s_bytes is not None and lv.per_s_bytes > 0 and projected_share(lv) >= share]
    if soon:
        return GuardTrip(max(soon, key=projected_share), share, True, horizon_s)
    return None


def steps_to_next_check(levels: Sequence[Level], share: float, stride_steps: int) -> int:
    """Steps that may pass before the guard next checks at a step: the sampling stride, fewer where a
    resource's growth per step takes it to `share` of its limit sooner (its level at that check stays
    under the threshold), one step once a resource is within NEAR_MARGIN of its limit below it."""
    ahead = max(1, stride_steps)
    for level in judged(levels):
        headroom_bytes = share * level.limit_bytes - level.used_bytes
        if headroom_bytes <= NEAR_MARGIN * level.limit_bytes:
            return 1
        if level.per_step_bytes is not None and level.per_step_bytes > 0:
            ahead = min(ahead, max(1, math.ceil(headroom_bytes / level.per_step_bytes) - 1))
    return ahead


def status_level(levels: Sequence[Level], share: float) -> Level | None:
    """The level the live status speaks of: the resource that reaches `share` of its limit soonest at its
    rate, else the fullest; None before a reading."""
    checked = judged(levels)
    if not checked:
        return None
    growing = [(lv.seconds_to(share), lv) for lv in checked if lv.seconds_to(share) is not None]
    return min(growing, key=lambda p: p[0] or 0.0)[1] if growing else max(checked, key=lambda lv: lv.share)
