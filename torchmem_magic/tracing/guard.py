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
from typing import TYPE_CHECKING, Any, Protocol

from ..core import resources
from ..analysis.holder_trends import top_holder
from ..core.slopes import robust_slope
from ..core.ended import Ended
from ..core.step_requests import RaisedAtStep
from ..analysis.guard_rules import GuardTrip, Level, guard_trip, steps_to_next_check
from ..render.advice.guard import guard_advice, guard_message, guard_status, holder_line, threshold_label

if TYPE_CHECKING:
    from ..core.model import Suspect
    from ..probes.accelerator import AcceleratorProbe
    from ..probes.limits import MemoryLimit
    from ..probes.shm import ShmProbe

#: the growth rate is the slope over the rows of this last stretch (a leak's rate now, not the run's)
RATE_WINDOW_S = 1.0
RATE_MAX_ROWS = 64
RECENT_ROWS = 3  # ... or over the last rows (two intervals), whichever is faster
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
        self._asked = False  # an error was asked for and is not raised yet (the error itself is not kept)
        self.raised = False  # a MemoryGuardError was raised into the loop
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
        (once raised, `note_raised` says so: the loop may catch it and go on), so one trip raises once.
        The error is not kept: once raised, its traceback holds the user's frames."""
        with self._asking:
            if self._asked:
                return None
            self.trip = self.trip or trip
            self._asked = True
            return MemoryGuardError(guard_message(trip, run.clock, _top_holder(run)), trip)

    def note_raised(self, exc: BaseException) -> None:
        """The step path raised `exc` into the loop: if it is the guard's, the next trip may ask again."""
        if isinstance(exc, MemoryGuardError):
            with self._asking:
                self._asked, self.raised = False, True

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
            out.append((_COLUMNS[resource], self.share * limit_bytes, threshold_label(self.share, resource)))
        return out

    def advice(self, ended: Ended | None, clock: str, steps: int) -> tuple[str, ...]:
        """The report's line on what the guard did (nothing when it never tripped)."""
        stopped = ended is not None and ended.on_purpose and ended.type_name == MemoryGuardError.__name__
        return guard_advice(self.trip, self.share, stopped, self.raised, clock, steps)


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
    return holder_line(top, run.clock)




