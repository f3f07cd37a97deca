"""Phrases every part of the catalogue words the same way: a rate, what a resource's limit means, steps."""

from __future__ import annotations

from collections.abc import Iterable

from ...core.resources import by_key
from ...core.units import format_bytes, rate_unit


def rate(per_step_bytes: float, clock: str, signed: bool = False) -> str:
    return f"{format_bytes(per_step_bytes, signed=signed)}/{rate_unit(clock)}"


def runs_out(resource: str) -> str:
    """What happens at the resource's limit, as the resources table says it."""
    try:
        return by_key(resource).runs_out
    except KeyError:
        return "it runs out"


def steps_named(ranges: Iterable[tuple[int, int]]) -> str:
    """'12, 40–41': the steps (or ranges of steps) a jump lies in, the first ten."""
    return ", ".join(str(b) if a == b else f"{a}–{b}" for a, b in list(ranges)[:10])
