"""What a run watches and how, fixed before it starts: one frozen object that every front end (the
cell magic, the script API, the command line, a rank's agent) builds once and hands to the session.
Checked when built, so a bad value fails where it was written, before anything is measured."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_INTERVAL_MS = 100.0
DEFAULT_SHM_PATH = "/dev/shm"  # the shared-memory filesystem DataLoader workers hand batches through
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 1.0, 10_000.0


def validate_interval_ms(interval_ms: float) -> float:
    if not isinstance(interval_ms, (int, float)) or math.isnan(interval_ms) or not (
        MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS
    ):
        raise ValueError(
            f"interval must be between {MIN_INTERVAL_MS:g} and {MAX_INTERVAL_MS:g} ms, got {interval_ms!r}"
        )
    return float(interval_ms)


def parse_guard(value: str | float) -> float:
    """'90%', '90', 90, '0.9' or 0.9 -> 0.9: the share of a limit at which the guard stops the loop
    (a number above 1 is a percentage). ValueError for anything else."""
    text = str(value).strip()
    percent = text.endswith("%")
    try:
        number = math.nan if isinstance(value, bool) else float(text.removesuffix("%").strip())
    except ValueError:
        number = math.nan
    share = number / 100.0 if percent or number > 1 else number
    if not 0 < share <= 1:  # NaN too
        raise ValueError(f"guard takes a share of the limit: 90%, 90 or 0.9 (above 0, at most 100%); got {value!r}")
    return share


@dataclass(frozen=True)
class SessionOptions:
    """Args:
        interval_ms: background sampling period (1–10,000 ms).
        device: the CUDA device to watch ('cuda:1', '1'); None watches every device in use.
        shm_path: the shared-memory filesystem to watch.
        guard: stop the loop with MemoryGuardError at a step boundary once a watched resource reaches
            this share of its limit, or would before the next chance to stop ('90%', 90 or 0.9; None:
            never); kept as the share (0.9).
        print_report: print the text report when the block ends (the script API's default).
        watch_ranks: listen for ranks (processes forked from this one, or a watched command's) and
            report each of them.
        train_hooks: install the step clocks (a watcher of another command's processes does not train).
        keep_scanned_holders: report the holders the last mid-run scan saw even when the end-of-run
            scan cannot reach them any more (a helper's or a rank's training function has returned).
        timeline_rows: how many rows each series of the timeline keeps before it decimates.
    """

    interval_ms: float = DEFAULT_INTERVAL_MS
    device: str | int | None = None
    shm_path: str = DEFAULT_SHM_PATH
    guard: float | str | None = None
    print_report: bool = False
    watch_ranks: bool = True
    train_hooks: bool = True
    keep_scanned_holders: bool = False
    timeline_rows: int = 2000

    def __post_init__(self) -> None:
        object.__setattr__(self, "interval_ms", validate_interval_ms(self.interval_ms))
        if self.guard is not None:
            object.__setattr__(self, "guard", parse_guard(self.guard))

    @property
    def interval_s(self) -> float:
        return self.interval_ms / 1000.0

    @property
    def guard_share(self) -> float | None:
        return None if self.guard is None else float(self.guard)
