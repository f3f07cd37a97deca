"""What a run watches and how, fixed before it starts. `MemwatchOptions` declares the options a user
gives, once, with their defaults, checks and help: the cell magic's flags, `memwatch()`, `assert_no_leak()`
and the pytest mark, the trainers' callbacks, `watch`'s flags and the environment a rank reads are all
derived from it (`core/option_args.py`). `SessionOptions` is what the session runs with: those, and the
front end's own settings. Both are checked when built, so a bad value fails where it was written, before
anything is measured."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_INTERVAL_MS = 100.0
DEFAULT_SHM_PATH = "/dev/shm"  # the shared-memory filesystem DataLoader workers hand batches through
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 1.0, 10_000.0
#: the environment variables a rank reads the watcher's options from
ENV_INTERVAL_MS = "TORCHMEM_MAGIC_INTERVAL_MS"
ENV_SCAN = "TORCHMEM_MAGIC_SCAN"  # "0": no leak finder in the ranks (`watch --no-scan`)
ENV_GUARD = "TORCHMEM_MAGIC_GUARD"  # the share of a limit at which each rank stops its loop (`watch --guard`)


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


def interval_from_text(text: str) -> float:
    """A flag's or the environment's interval: a number of milliseconds in range, else ValueError."""
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"interval must be a number of milliseconds, got {text!r}") from None
    return validate_interval_ms(number)


@dataclass(frozen=True)
class OptionSpec:
    """How one option is given, beside its default: its help, its flag (the magic's and `watch`'s), how a
    flag's text becomes its value, how a value given in Python is checked, and the environment variable
    that hands it to a rank."""

    help: str
    flag: str | None = None  # "--interval"; a bool's flag turns it on, or off where `negated`
    short: str | None = None  # "-q"
    metavar: str | None = None
    negated: bool = False  # a bool on by default: its flag ("--no-scan") turns it off
    from_text: Callable[[str], Any] | None = None  # a flag's or the environment's text (ValueError)
    check: Callable[[Any], Any] | None = None  # a value given in Python, checked and made canonical
    env: str | None = None  # the variable a rank reads it from (None: a rank does not take it)
    in_watch: bool = True  # `python -m torchmem_magic watch` takes it


def option(default: Any, help: str, **how: Any) -> Any:
    """A field of MemwatchOptions: its default and how it is given (see OptionSpec)."""
    return field(default=default, metadata={"option": OptionSpec(help, **how)})


def spec_of(option_field: dataclasses.Field[Any]) -> OptionSpec:
    spec = option_field.metadata["option"]
    assert isinstance(spec, OptionSpec)
    return spec


@dataclass(frozen=True)
class MemwatchOptions:
    """The options a user gives a run, whatever front end they give them to (see the module's docstring)."""

    interval_ms: float = option(
        DEFAULT_INTERVAL_MS, f"background sampling period in ms, {MIN_INTERVAL_MS:g}-{MAX_INTERVAL_MS:g} "
        f"(default {DEFAULT_INTERVAL_MS:g})", flag="--interval", metavar="MS", from_text=interval_from_text,
        check=validate_interval_ms, env=ENV_INTERVAL_MS,
    )
    device: str | int | None = option(
        None, "the device to watch, e.g. cuda:1, mps, xpu:0 (default: all in use)", flag="--device", in_watch=False,
    )
    quiet: bool = option(False, "no live figure and no report output", flag="--quiet", short="-q", in_watch=False)
    shm_path: str = option(
        DEFAULT_SHM_PATH, "shared-memory filesystem to watch", flag="--shm-path", metavar="DIR", in_watch=False,
    )
    scan: bool = option(True, "skip the leak finder (no suspects in the report, curves only)", flag="--no-scan",
                        negated=True, env=ENV_SCAN)
    guard: float | str | None = option(
        None, "stop the loop (each rank's, under watch) with MemoryGuardError at a step once RAM, /dev/shm or "
        "VRAM reaches PCT of its limit (90%, 90 or 0.9), or would before the next check",
        flag="--guard", metavar="PCT", from_text=parse_guard, check=parse_guard,
        env=ENV_GUARD,
    )

    def __post_init__(self) -> None:
        for each in dataclasses.fields(self):
            value, spec = getattr(self, each.name), spec_of(each)
            if isinstance(value, str) and spec.from_text is not None:  # a flag's text (the magic's)
                value = spec.from_text(value)
            if value is not None and spec.check is not None:
                value = spec.check(value)
            object.__setattr__(self, each.name, value)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> MemwatchOptions:
        """What a rank was handed (see `environment`); a value set by hand that does not parse is the
        default (the watcher checked what it set)."""
        given: dict[str, Any] = {}
        for each in dataclasses.fields(cls):
            spec = spec_of(each)
            text = environ.get(spec.env) if spec.env is not None else None
            if not text:
                continue
            try:
                given[each.name] = text != "0" if isinstance(each.default, bool) else (spec.from_text or str)(text)
            except ValueError:
                continue
        return cls(**given)

    def environment(self) -> dict[str, str | None]:
        """The variables that hand these options to a rank (None: the variable is to be unset)."""
        out: dict[str, str | None] = {}
        for each in dataclasses.fields(self):
            spec, value = spec_of(each), getattr(self, each.name)
            if spec.env is not None:
                out[spec.env] = _env_text(value)
        return out


def _env_text(value: object) -> str | None:
    """An option's value as its variable holds it (None: unset): booleans as 1/0, floats in short form."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    return f"{value:g}" if isinstance(value, float) else str(value)


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
        watched: what the user gave the front end, as ranks are handed it (`forwarded`).
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
    watched: MemwatchOptions | None = None

    @classmethod
    def of(cls, watched: MemwatchOptions, **settings: Any) -> SessionOptions:
        """The session's options for what the user gave (`watched`) and the front end's own `settings`."""
        return cls(watched.interval_ms, device=watched.device, shm_path=watched.shm_path, guard=watched.guard,
                   watched=watched, **settings)

    def forwarded(self, scan: bool) -> MemwatchOptions:
        """What a rank of this session is handed: the user's options (the session's own where none were
        given), with `scan` as this session runs it."""
        base = self.watched or MemwatchOptions(self.interval_ms, device=self.device, shm_path=self.shm_path,
                                               guard=self.guard)
        return dataclasses.replace(base, scan=scan)

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
