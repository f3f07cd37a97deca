"""The one table the verdict's rules read (pure): every threshold they judge by, each with a line on why,
and which rules are on. Every verdict (the live one, the report's, a rank's, the benchmarks') reads the
table in force when it is worked out, so switching a rule off here switches it off everywhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

MIB = 1 << 20


def _why(value: float, reason: str) -> Any:
    """A threshold's field: its value, and why it is that (`why(name)` reads it back)."""
    return field(default=value, metadata={"why": reason})


@dataclass(frozen=True)
class Thresholds:
    """Every number a verdict rule judges by (one rule may read several; no two rules share one by accident)."""

    min_steps: int = _why(12, "sampled steps after warm-up needed for any verdict: a robust slope needs a dozen points")
    min_total_bytes: float = _why(2 * MIB, "growth below this over the window is never called a leak: allocator "
                                  "and interpreter churn reach it in a few steps")
    fit_noise_scales: float = _why(6.0, "a line's growth must pass this many noise scales: noise alone cannot make it")
    z_leak: float = _why(5.0, "slope over its standard error for a leak: far past what noise reaches (under 1 % "
                                 "false leaks on pure noise, tested)")
    z_suspect: float = _why(3.0, "slope over its standard error for a suspect: worth a look, not yet an alarm")
    full_share: float = _why(0.98, "a reading this close to its limit is at it: the resource ran out")
    filled_from_share: float = _why(0.5, "...when it was below this share of the limit earlier in the run: it "
                                    "filled in the run, not before it")
    epoch_growth_share: float = _why(0.7, "a staircase puts at least this share of the growth where epochs begin")
    jump_growth_low: float = _why(0.7, "the jumps carry at least this share of the net growth to be sporadic...")
    jump_growth_high: float = _why(1.5, "...and at most this share: more means falls between them (a sawtooth)")
    jumps_per_reading: float = _why(0.2, "a sporadic leak jumps at no more than this share of its readings "
                                    "(three at least): many jumps are noise")
    sporadic_leak_jumps: int = _why(2, "jumps that make a sporadic leak: one rise is a level change (a suspect)")
    level_flat_of_jump: float = _why(0.05, "after a level change the readings stay within this share of the jump "
                                     "(or three noise scales)...")
    level_after_over_before: float = _why(1.0, "...for at least this many times the steps before it: a jump (or a "
                                          "rise that stopped) late in a run is too soon to call level")
    flat_of_rise: float = _why(0.05, "readings within this share of the rise (or the noise) stay flat: the "
                               "growth stopped")
    late_from_share: float = _why(0.2, "growth that began part-way began this share of the steps in at the earliest...")
    late_until_share: float = _why(0.9, "...and this share at the latest: later is too few readings to judge")
    late_over_earlier_range: float = _why(0.25, "...and ends above all before it by this share of their range: a "
                                          "sawtooth's last rise does not")
    late_earlier_of_rate: float = _why(0.25, "...and rose before it at less than this share of its rate: else one "
                                       "line through the run judges it")
    late_shown_share: float = _why(0.5, "...and rose by at least this share of its own line's growth above all before")
    late_min_readings: int = _why(6, "readings after a late start or a stop, at least: sampling thins out (160 "
                                  "late steps may be 9 readings)")
    ramp_readings: int = _why(5, "jumps at this many readings in a row are a line sampled thinly, not sporadic jumps")
    heap_share_of_rss: float = _why(0.5, "RSS growth is retention only where the heap in use grew by at least this "
                                    "share of it: the allocator keeps what was freed")
    heap_aside_share: float = _why(0.25, "the workers' growth is theirs where the kernel's heap grew by less than "
                                   "this share of it (or is clean)")


def why(name: str) -> str:
    """The reason written beside threshold `name`."""
    return str(next(f for f in dataclasses.fields(Thresholds) if f.name == name).metadata["why"])


#: the verdict's rules by name, with what each finds: the shape rules in the order they are tried on one
#: resource, then the rules that explain growth away in the order their notes are given
RULES: dict[str, str] = {
    "ran-out": "a resource that filled to its limit in the run is a leak at the rate it filled",
    "per-epoch": "a staircase: growth where epochs begin, flat within them",
    "level-change": "one jump, then level for at least as long as before it: a resize, not a leak",
    "filled-then-flat": "a rise, then flat to the end, for at least as long as the rise took: growth that "
                        "stopped is clean (also where a warm-up cut leaves its flat end too few readings)",
    "sporadic": "a few jumps spread over the run that never come back",
    "started-late": "a line that began rising part-way and rose to the end",
    "per-iteration": "a line that rises with the steps, clear of the noise",
    "ramp-read-thinly": "jumps at readings in a row that no line rule could judge: still a leak by its jumps",
    "caching-allocator": "CUDA reserved grows while allocated is flat: the caching allocator keeps it",
    "copy-on-access": "DataLoader workers copy the dataset's pages as they read them",
    "allocator-keeps-rss": "RSS grows while the heap in use is flat: no retention",
}


@dataclass(frozen=True)
class VerdictTable:
    """The thresholds and the rules switched off: what every verdict of this process reads."""

    thresholds: Thresholds = Thresholds()
    off: frozenset[str] = frozenset()

    def on(self, rule: str) -> bool:
        return rule not in self.off


_in_force = [VerdictTable()]


def table() -> VerdictTable:
    """The table in force."""
    return _in_force[0]


@contextmanager
def switched(*off: str, **thresholds: float) -> Iterator[VerdictTable]:
    """Rules `off` switched off and `thresholds` changed for every verdict worked out in the block."""
    unknown = sorted(set(off) - set(RULES))
    if unknown:
        raise ValueError(f"no verdict rule {', '.join(unknown)}: the rules are {', '.join(RULES)}")
    before = _in_force[0]
    changed: Thresholds = dataclasses.replace(before.thresholds, **thresholds)  # type: ignore[arg-type]
    _in_force[0] = VerdictTable(changed, before.off | frozenset(off))
    try:
        yield _in_force[0]
    finally:
        _in_force[0] = before
