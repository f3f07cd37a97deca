"""How sizes and durations are written for people (stdlib only; used by analysis and renderers)."""

from __future__ import annotations

import math

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(value: float | None, signed: bool = False) -> str:
    """1536 -> '1.5 KiB'; None/NaN -> '—'. `signed` adds '+' to growth figures."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    sign = "-" if value < 0 else ("+" if signed else "")
    size = abs(float(value))
    for unit in _UNITS:
        if size < 1024 or unit == _UNITS[-1]:
            return f"{sign}{size:.0f} {unit}" if unit == "B" else f"{sign}{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float, rough: bool = False) -> str:
    """'12.4 s', '3.2 min', '1.5 h'; `rough` for forecasts: '86 s', '17 min' (no false precision)."""
    if seconds < (90 if rough else 60):
        return f"{seconds:.0f} s" if rough else f"{seconds:.1f} s"
    if seconds < (5400 if rough else 3600):
        return f"{seconds / 60:.0f} min" if rough else f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


#: clock -> (what a rate is per, singular noun, plural noun)
_CLOCK_WORDS = {
    "optimizer": ("step", "step", "steps"),
    "backward": ("backward", "backward pass", "backward passes"),
    "batch": ("batch", "batch", "batches"),
    "forward": ("forward", "forward call", "forward calls"),
    "time": ("s", "second", "seconds"),
}


def rate_unit(clock: str) -> str:
    """What growth is quoted per: '+1.0 MiB/step', '/batch', '/forward', '/backward', '/s'."""
    return _CLOCK_WORDS[clock][0]


def singular_noun(clock: str) -> str:
    """'step', 'batch', 'forward call', 'second': one of what a clock counts."""
    return _CLOCK_WORDS[clock][1]


def count_noun(count: float, clock: str) -> str:
    """'200 steps', '1 batch', '40 forward calls', '3 seconds'."""
    _, one, many = _CLOCK_WORDS[clock]
    return f"{count:,.0f} {one if count == 1 else many}"


def plural_noun(clock: str) -> str:
    """'steps', 'batches', 'forward calls': what a clock counts."""
    return _CLOCK_WORDS[clock][2]
