"""The memory guard (opt-in): stop a leaking loop with MemoryGuardError before the OOM killer does.

The OOM killer ends the kernel and every variable with it; the guard ends only the cell, between two
steps, once a watched resource reaches a share of its limit, or would reach it before the next chance
to stop (its rate times the time to the next check plus one step). It decides on the sampler thread,
over the rows the sampler reads anyway, and at the sampled steps, over their step-aligned readings: a
fill faster than a sampling interval (a small /dev/shm filled in a few steps) passes between two rows
of the sampler, but not between two checks at steps once its growth is seen, since that growth brings
the next check closer (to every step near the threshold). A fill that goes from flat to past the
threshold within one sampling stride (a few milliseconds of steps, once the stride has thinned) is
still seen too late. Either way the raise happens on the training thread at a step boundary, never in
the middle of the user's code.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..core import resources
from ..analysis.holder_trends import top_holder
from ..core.slopes import robust_slope
from ..core.step_requests import RaisedAtStep
from ..core.units import format_bytes, format_duration, rate_unit

if TYPE_CHECKING:
    from ..core.model import Suspect
    from ..probes.accelerator import AcceleratorProbe
    from ..probes.limits import MemoryLimit
    from ..probes.shm import ShmProbe

#: the growth rate is the slope over the rows of this last stretch (a leak's rate now, not the run's)
RATE_WINDOW_S = 1.0
RATE_MAX_ROWS = 64
RECENT_ROWS = 3  # ... or over the last rows (two intervals), whichever is faster
#: within this share of its limit below the threshold, a resource is checked at every step: a jump there
#: (a batch of segments, a burst of allocations) could pass the threshold in one step
NEAR_MARGIN = 0.05
#: a rate is projected at most this many times as far ahead as the stretch it was measured over: two
#: readings a few milliseconds apart while torch allocates at start-up say nothing of the next 10 s
MAX_EXTRAPOLATION = 4.0


class Watching(Protocol):
    """What the guard reads of the run it guards (the session's live view)."""

    @property
    def clock(self) -> str: ...

    @property
    def steps(self) -> int: ...

    @property
    def elapsed_s(self) -> float: ...

    def holders_so_far(self) -> tuple[dict[str, list[tuple[int, int]]], tuple[Suspect, ...]]: ...

    def live_holder(self) -> str | None: ...


class MemoryGuardError(MemoryError, RaisedAtStep):
    """The memory guard stopped the loop at a step boundary: a watched resource reached (or was about
    to reach) its share of the limit. A MemoryError, so code that handles running out of memory handles
    it; the kernel and its variables are intact. `.trip` says what tripped it (None once unpickled)."""

    __module__ = "torchmem_magic"  # tracebacks and CI logs name it where users import it from

    def __init__(self, message: str, trip: GuardTrip | None = None) -> None:
        super().__init__(message)
        self.trip = trip

    def __reduce__(self) -> tuple[Any, ...]:
        return (MemoryGuardError, (str(self),))


#: the watched resources, the host's first, then the devices' (one level per device)
_WATCHED = sorted((r for r in resources.RESOURCES if r.guard_name is not None), key=lambda r: r.kind == "device")
_AT_LIMIT = {r.guard_name: r.stopped_before for r in _WATCHED}  # what happens at its limit
_COLUMNS = {r.guard_name: r.column for r in _WATCHED}
_DEVICES = next((r.guard_name for r in _WATCHED if r.kind == "device"), None)  # the devices' levels' prefix


class MemoryGuard:
    """Holds the sampler's rows against the limits (RAM of the process tree, /dev/shm, each watched
    CUDA device's reserved memory) and hands the session the MemoryGuardError to raise when one trips.
    `check` runs on the sampler thread, `check_step` on the training thread at sampled steps; the rest
    is read by the live figure and the report.

    Args:
        shm: read by the step check itself: a step row carries the sampler's last reading of /dev/shm.
    """

    def __init__(
        self,
        share: float,
        ram_limit: MemoryLimit,
        shm_total_bytes: int | None,
        accelerator: AcceleratorProbe,
        interval_s: float,
        shm: ShmProbe | None = None,
    ) -> None:
        self.share = share
        self._ram_limit = ram_limit
        self._shm_total_bytes = shm_total_bytes
        self._accelerator = accelerator
        self._interval_s = interval_s
        self._rows: deque[tuple[float, float, dict[str, float]]] = deque(maxlen=RATE_MAX_ROWS)  # (t_s, step, used)
        self.levels: tuple[Level, ...] = ()  # at the last check
        self.horizon_s = interval_s
        self.trip: GuardTrip | None = None  # the first one
        self._error: MemoryGuardError | None = None  # the last one asked for
        self._asking = threading.Lock()  # the sampler's check and the step check ask for one error between them
        self._shm = shm
        self._last_step: tuple[float, float, dict[str, float]] | None = None  # (t_s, step, used) at the last step check
        self.next_check_steps = 1  # steps that may pass before the next step check

    def check(self, row: dict[str, float], run: Watching) -> MemoryGuardError | None:
        """Sampler thread: judge this row; on a trip, the MemoryGuardError the next step is to raise
        (None: nothing to raise, or one asked for already and not raised yet)."""
        used, limits = self._readings(row, shm_now=False)
        t_s, step = row.get("t_s", math.nan), row.get("step", math.nan)
        self._rows.append((t_s, step, used))
        while len(self._rows) > 2 and t_s - self._rows[0][0] > RATE_WINDOW_S:
            self._rows.popleft()
        self.horizon_s = self._horizon_s()
        self.levels = tuple(
            Level(resource, used[resource], limit_bytes, source, *self._growth(resource))
            for resource, (limit_bytes, source) in limits.items()
        )
        trip = guard_trip(self.levels, self.share, self.horizon_s)
        return None if trip is None else self._ask(trip, run)

    def check_step(self, row: dict[str, float], run: Watching, stride_steps: int) -> MemoryGuardError | None:
        """Training thread, at a sampled step whose next sample is `stride_steps` steps away: judge its
        step-aligned reading (/dev/shm read now) with the same trip as the sampler's rows, over the
        growth per step since the last step check, and set `next_check_steps`: the stride, fewer when
        that growth takes a resource to its threshold sooner. What this check lets pass must stay under
        the threshold until the next one, so it trips when the growth would pass it within those steps.
        Returns the MemoryGuardError to raise at this step (None: nothing, or one asked for already)."""
        used, limits = self._readings(row, shm_now=True)
        t_s, step = row["t_s"], row["step"]
        previous, self._last_step = self._last_step, (t_s, step, used)
        step_s = _step_s(previous, t_s, step)
        levels = tuple(
            Level(
                resource, used[resource], limit_bytes, source,
                *_step_growth(previous, step_s, step, resource, used[resource]),
            )
            for resource, (limit_bytes, source) in limits.items()
        )
        self.next_check_steps = steps_to_next_check(levels, self.share, stride_steps)
        trip = guard_trip(levels, self.share, self.next_check_steps * step_s if step_s is not None else 0.0)
        return None if trip is None else self._ask(trip, run)

    def restart_steps(self) -> None:
        """A better step clock replaced the current one: its steps are counted anew."""
        self._last_step = None
        self.next_check_steps = 1

    def _readings(self, row: dict[str, float], shm_now: bool) -> tuple[dict[str, float], dict[str, tuple[float, str]]]:
        """(bytes used, (limit bytes, its source)) of each watched resource in `row`; `shm_now`: /dev/shm
        as it is now rather than the row's (a step row's is the sampler's last reading)."""
        used: dict[str, float] = {}
        limits: dict[str, tuple[float, str]] = {}
        for watched in _WATCHED:
            name = watched.guard_name or watched.key
            if watched.kind == "device":
                if not math.isnan(row.get(watched.column, math.nan)):
                    for device, reserved_bytes, total_bytes in self._accelerator.reserved_by_device():
                        used[f"{name} {device}"] = float(reserved_bytes)
                        if total_bytes:
                            limits[f"{name} {device}"] = (float(total_bytes), "the device's size")
                continue
            used[name] = row.get(watched.column, math.nan)
            if watched.limit == "ram":
                limits[name] = (float(self._ram_limit.limit_bytes), self._ram_limit.source)
            elif watched.limit == "shm" and self._shm_total_bytes:
                limits[name] = (float(self._shm_total_bytes), "its size")
                if shm_now and self._shm is not None:
                    usage = self._shm.usage()
                    used[name] = math.nan if usage is None else float(usage.used_bytes)
        return used, limits

    def _ask(self, trip: GuardTrip, run: Watching) -> MemoryGuardError | None:
        """The MemoryGuardError for `trip`; None while one asked for (by either check) is not raised yet
        (a raised one has a traceback: the loop caught it and went on), so one trip raises once."""
        with self._asking:
            if self._error is not None and self._error.__traceback__ is None:
                return None
            self.trip = self.trip or trip
            self._error = MemoryGuardError(guard_message(trip, run.clock, _top_holder(run)), trip)
            return self._error

    def _growth(self, resource: str) -> tuple[float | None, float | None, float | None]:
        """(bytes per second, bytes per step, seconds measured over) over the last rows; None where
        unknown. The faster of the last second's robust slope and the last RECENT_ROWS' slope: a leak
        that just began (or sped up) is judged at its rate now, not diluted by the flat stretch before it."""
        rows = [(t, s, used[resource]) for t, s, used in self._rows if resource in used and not math.isnan(used[resource])]
        if len(rows) < 2:
            return None, None, None
        recent = rows[-RECENT_ROWS:]
        span_s = recent[-1][0] - recent[0][0]
        rates = [(robust_slope([t for t, _, _ in rows], [v for _, _, v in rows]), rows[-1][0] - rows[0][0]),
                 ((recent[-1][2] - recent[0][2]) / span_s if span_s > 0 else None, span_s)]
        per_s, measured_s = max(((r, m) for r, m in rates if r is not None), default=(None, None))
        if per_s is None:
            return None, None, None
        for stretch in (recent, rows):  # seconds a step takes, lately if steps were made lately
            steps = stretch[-1][1] - stretch[0][1]
            if steps > 0:
                return per_s, per_s * (stretch[-1][0] - stretch[0][0]) / steps, measured_s
        return per_s, None, measured_s

    def _horizon_s(self) -> float:
        """Until the guard can next stop the loop: the next check, then up to one step. The next check
        comes as late as the latest of the last second's checks while the loop stepped. A step lasts
        what the last second's steps took, else at least as long as the current one has run so far;
        rows from before the first step say nothing of it (they time the setup)."""
        stepping = [(t_s, step) for t_s, step, _ in self._rows if step >= 1]
        gaps_s = [later[0] - earlier[0] for earlier, later in zip(stepping, stepping[1:])]
        check_s = max([self._interval_s, *gaps_s])  # the sampler is late when the loop holds the GIL: as late again
        if not stepping:
            return check_s
        (first_s, first_step), (last_s, last_step) = stepping[0], stepping[-1]
        if last_step > first_step:
            current_since_s = next(t_s for t_s, step in stepping if step == last_step)
            step_s = max((last_s - first_s) / (last_step - first_step), last_s - current_since_s)
        else:
            step_s = last_s - first_s
        return check_s + step_s

    @property
    def raised(self) -> bool:
        """True once a MemoryGuardError was raised into the loop."""
        return self._error is not None and self._error.__traceback__ is not None

    def status_text(self, clock: str) -> str | None:
        """The live status line's part: the level, and how soon the threshold comes at this rate."""
        return guard_status(self.levels, self.share, self.trip is not None and not self.raised, clock)

    def thresholds(self) -> list[tuple[str, float, str]]:
        """(column, bytes, label) of each line the live figure may draw: the share of RAM's and
        /dev/shm's limits, and of the watched devices' sizes summed (the figure draws their sum)."""
        out = []
        vram = [lv for lv in self.levels if _DEVICES is not None and lv.resource.startswith(_DEVICES)]
        for level in [lv for lv in self.levels if lv not in vram] + vram[:1]:
            limit_bytes = sum(lv.limit_bytes for lv in vram) if level in vram else level.limit_bytes
            resource = (_DEVICES or "") if level in vram else level.resource
            out.append((_COLUMNS[resource], self.share * limit_bytes, f"guard: {_percent(self.share)} of {resource} limit"))
        return out

    def advice(self, ended_by: BaseException | None, clock: str, steps: int) -> tuple[str, ...]:
        """The report's line on what the guard did (nothing when it never tripped)."""
        return guard_advice(self.trip, self.share, isinstance(ended_by, MemoryGuardError), self.raised, clock, steps)


def _step_s(previous: tuple[float, float, dict[str, float]] | None, t_s: float, step: float) -> float | None:
    """Seconds a step took since the last step check; None before one, or with no step or time between."""
    if previous is None or not step > previous[1] or not t_s > previous[0]:
        return None
    return (t_s - previous[0]) / (step - previous[1])


def _step_growth(
    previous: tuple[float, float, dict[str, float]] | None, step_s: float | None, step: float, resource: str,
    used_bytes: float,
) -> tuple[float | None, float | None, float | None]:
    """(bytes per second, bytes per step, seconds measured over) of `resource` since the last step check,
    `step_s` a step ago on average; None where unknown."""
    before_bytes = math.nan if previous is None else previous[2].get(resource, math.nan)
    if previous is None or step_s is None or math.isnan(before_bytes) or math.isnan(used_bytes):
        return None, None, None
    steps = step - previous[1]
    per_step = (used_bytes - before_bytes) / steps
    return per_step / step_s, per_step, steps * step_s


def _top_holder(run: Watching) -> str | None:
    """The fastest-growing holder the scans during the run saw, with its fix if one is known."""
    try:
        _, suspects = run.holders_so_far()
    except Exception:  # the holders are extra: never let them keep the guard from acting
        suspects = ()
    top = top_holder(suspects)
    if top is None:
        return run.live_holder()
    line = f"{top.name} {format_bytes(top.growth_per_step, signed=True)}/{rate_unit(run.clock)}, {top.kind}"
    return f"{line} — fix: {top.fix}" if top.fix else line


# ----------------------------------------------------------------------------- the decision (pure)


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


def _judged(levels: Sequence[Level]) -> list[Level]:
    return [lv for lv in levels if lv.limit_bytes > 0 and math.isfinite(lv.limit_bytes) and not math.isnan(lv.used_bytes)]


def guard_trip(levels: Sequence[Level], share: float, horizon_s: float) -> GuardTrip | None:
    """The resource that trips the guard: one at `share` of its limit already (the fullest), else one
    its rate takes there within `horizon_s` (the time until the guard can next stop the loop). A rate
    of zero or less, or an unknown one, counts only what is used now; NaN readings are ignored."""
    judged = _judged(levels)
    over = [lv for lv in judged if lv.used_bytes >= share * lv.limit_bytes]
    if over:
        return GuardTrip(max(over, key=lambda lv: lv.share), share, False, 0.0)
    if not horizon_s >= 0:
        return None

    def projected_share(level: Level) -> float:
        ahead_s = horizon_s if level.rate_span_s is None else min(horizon_s, MAX_EXTRAPOLATION * level.rate_span_s)
        return (level.used_bytes + (level.per_s_bytes or 0.0) * ahead_s) / level.limit_bytes

    soon = [lv for lv in judged if lv.per_s_bytes is not None and lv.per_s_bytes > 0 and projected_share(lv) >= share]
    if soon:
        return GuardTrip(max(soon, key=projected_share), share, True, horizon_s)
    return None


def steps_to_next_check(levels: Sequence[Level], share: float, stride_steps: int) -> int:
    """Steps that may pass before the guard next checks at a step: the sampling stride, fewer where a
    resource's growth per step takes it to `share` of its limit sooner (its level at that check stays
    under the threshold), one step once a resource is within NEAR_MARGIN of its limit below it."""
    ahead = max(1, stride_steps)
    for level in _judged(levels):
        headroom_bytes = share * level.limit_bytes - level.used_bytes
        if headroom_bytes <= NEAR_MARGIN * level.limit_bytes:
            return 1
        if level.per_step_bytes is not None and level.per_step_bytes > 0:
            ahead = min(ahead, max(1, math.ceil(headroom_bytes / level.per_step_bytes) - 1))
    return ahead


def _percent(share: float) -> str:
    return f"{share * 100:.3g}%"


def _rates(level: Level, clock: str) -> str:
    """'+5.0 MiB/step (+480.0 MiB/s)', '+2.0 MiB/s' or 'not growing'."""
    if level.per_s_bytes is None or not level.per_s_bytes > 0:
        return "not growing"
    per_s = f"{format_bytes(level.per_s_bytes, signed=True)}/s"
    if clock == "time" or level.per_step_bytes is None:
        return per_s
    return f"{format_bytes(level.per_step_bytes, signed=True)}/{rate_unit(clock)} ({per_s})"


def guard_message(trip: GuardTrip, clock: str, holder: str | None) -> str:
    """MemoryGuardError's text: the resource, its level, its rate, and the top holder so far."""
    level, share = trip.level, trip.share
    kind = level.resource.split(" ")[0]
    where = (f"{level.resource} at {format_bytes(level.used_bytes)}, {_percent(level.share)} of its "
             f"{format_bytes(level.limit_bytes)} limit ({level.limit_source})")
    if trip.projected:
        why = f"would pass {_percent(share)} within {trip.horizon_s:.2g} s at {_rates(level, clock)}"
    else:
        why = f"over the {_percent(share)} guard, growing {_rates(level, clock)}"
    first = f"memwatch guard: {where} {why}; stopped before {_AT_LIMIT.get(kind, 'its limit')}"
    second = f"top holder so far: {holder}" if holder else "top holder so far: none named yet (see the report's suspects)"
    return f"{first}\n{second}"


def guard_status(levels: Sequence[Level], share: float, tripped: bool = False, clock: str = "optimizer") -> str | None:
    """The live status line's warning: 'guard: RAM 61% of 4.0 GiB, 90% in ~2 min at +5.0 MiB/s'. The
    resource that reaches its threshold soonest at its rate, else the fullest; None before a reading."""
    judged = _judged(levels)
    if not judged:
        return None
    growing = [(lv.seconds_to(share), lv) for lv in judged if lv.seconds_to(share) is not None]
    level = min(growing, key=lambda p: p[0] or 0.0)[1] if growing else max(judged, key=lambda lv: lv.share)
    text = f"guard: {level.resource} {level.share * 100:.0f}% of {format_bytes(level.limit_bytes)}"
    if tripped or level.used_bytes >= share * level.limit_bytes:
        then = "no step clock to stop it at" if clock == "time" else "stopping at the next step"
        return f"{text}, over {_percent(share)}: {then}"
    seconds = level.seconds_to(share)
    if seconds is not None and level.per_s_bytes is not None:
        when = "within a second" if seconds < 1 else f"in ~{format_duration(seconds, rough=True)}"
        text += f", {_percent(share)} {when} at {format_bytes(level.per_s_bytes, signed=True)}/s"
    return text


def guard_advice(
    trip: GuardTrip | None, share: float, stopped_it: bool, raised: bool, clock: str, steps: int
) -> tuple[str, ...]:
    """The report's advice line: the guard stopped the run and why, or why it tripped but could not act."""
    if trip is None:
        return ()
    level = trip.level
    what = (f"{level.resource} {'would pass' if trip.projected else 'reached'} {_percent(share)} of its "
            f"{format_bytes(level.limit_bytes)} limit ({level.limit_source}) at {format_bytes(level.used_bytes)}, "
            f"growing {_rates(level, clock)}")
    if stopped_it:
        return (f"the memory guard stopped the run after {steps:,} step{'s' if steps != 1 else ''} with MemoryGuardError: "
                f"{what}; the kernel and its variables are intact, so free what the top holder keeps (see the suspects) "
                "before running again",)
    if raised:
        return (f"the memory guard raised MemoryGuardError ({what}) but the loop caught it and went on",)
    if clock == "time":
        return (f"the memory guard tripped ({what}) but could not stop the loop: it has no step clock (no optimizer "
                "step, backward pass, DataLoader batch or nn.Module forward call ran), and the guard stops a loop only "
                "between two steps",)
    return (f"the memory guard tripped ({what}) after the last step: the run ended before it could stop it",)
