"""The memory guard's words: its error, its part of the live status line, its line in the report."""

from __future__ import annotations

from collections.abc import Sequence

from ...analysis.guard_rules import GuardTrip, Level, status_level
from ...core import resources
from ...core.model import Suspect
from ...core.units import format_bytes, format_duration, rate_unit

#: what each watched resource's limit brings, by the guard's name for it ("the OOM killer" for RAM)
_STOPPED_BEFORE = {r.guard_name: r.stopped_before for r in resources.RESOURCES if r.guard_name is not None}


def percent(share: float) -> str:
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
    where = (f"{level.resource} at {format_bytes(level.used_bytes)}, {percent(level.share)} of its "
             f"{format_bytes(level.limit_bytes)} limit ({level.limit_source})")
    if trip.projected:
        why = f"would pass {percent(share)} within {trip.horizon_s:.2g} s at {_rates(level, clock)}"
    else:
        why = f"over the {percent(share)} guard, growing {_rates(level, clock)}"
    first = f"memwatch guard: {where} {why}; stopped before {_STOPPED_BEFORE.get(kind, 'its limit')}"
    second = f"top holder so far: {holder}" if holder else "top holder so far: none named yet (see the report's suspects)"
    return f"{first}\n{second}"


def guard_status(levels: Sequence[Level], share: float, tripped: bool = False, clock: str = "optimizer") -> str | None:
    """The live status line's warning: 'guard: RAM 61% of 4.0 GiB, 90% in ~2 min at +5.0 MiB/s'. The
    resource that reaches its threshold soonest at its rate, else the fullest; None before a reading."""
    level = status_level(levels, share)
    if level is None:
        return None
    text = f"guard: {level.resource} {level.share * 100:.0f}% of {format_bytes(level.limit_bytes)}"
    if tripped or level.used_bytes >= share * level.limit_bytes:
        then = "no step clock to stop it at" if clock == "time" else "stopping at the next step"
        return f"{text}, over {percent(share)}: {then}"
    seconds = level.seconds_to(share)
    if seconds is not None and level.per_s_bytes is not None:
        when = "within a second" if seconds < 1 else f"in ~{format_duration(seconds, rough=True)}"
        text += f", {percent(share)} {when} at {format_bytes(level.per_s_bytes, signed=True)}/s"
    return text


def guard_advice(
    trip: GuardTrip | None, share: float, stopped_it: bool, raised: bool, clock: str, steps: int
) -> tuple[str, ...]:
    """The report's advice line: the guard stopped the run and why, or why it tripped but could not act."""
    if trip is None:
        return ()
    level = trip.level
    what = (f"{level.resource} {'would pass' if trip.projected else 'reached'} {percent(share)} of its "
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


def holder_line(top: Suspect, clock: str) -> str:
    """'history +1.0 MiB/step, autograd-graph — fix: ...': the top holder so far, as the guard's error names it."""
    line = f"{top.name} {format_bytes(top.growth_per_step or 0.0, signed=True)}/{rate_unit(clock)}, {top.kind}"
    return f"{line} — fix: {top.fix}" if top.fix else line


def threshold_label(share: float, resource: str) -> str:
    """The live figure's label of a guard threshold: 'guard: 90% of RAM limit'."""
    return f"guard: {percent(share)} of {resource} limit"
