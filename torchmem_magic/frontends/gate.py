"""The CI gate: `with assert_no_leak(): train_steps()` fails a test when memory leaks.

Any test runner reports an AssertionError as a failure, so `LeakError` is one; its message is what
a reader of a CI log needs to act (the verdict, the top holder and its fix), the whole report
rides along on `.report`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Collection
from types import CodeType, FrameType, TracebackType
from typing import Any

from ..analysis import holder_trends
from ..api import watch_from
from ..core.model import Suspect, VerdictName
from ..render.results import Report
from ..core.option_args import takes_options
from ..core.options import MemwatchOptions
from ..session.run import MemwatchSession
from ..core.units import count_noun, format_bytes, rate_unit

#: verdicts a gate may fail on; "clean" never fails
FAILING_VERDICTS: tuple[VerdictName, ...] = ("leak", "suspect", "unknown")
OPTION_NAMES = tuple(each.name for each in dataclasses.fields(MemwatchOptions))


def top_holder(report: Report) -> Suspect | None:
    """The holder that grew fastest during the run; else the largest one (None: none was named).
    A CI log always names someone when there is a suspect: the largest is where to look first."""
    return holder_trends.top_holder(report.suspects, or_largest=True)


def leak_message(report: Report) -> str:
    """Three lines for a CI log: the verdict and why, the top holder, its fix."""
    steps = count_noun(report.steps, report.clock) if report.clock != "time" else f"{report.wall_s:.1f} s"
    why = f" — {report.advice[0]}" if report.advice else ""
    lines = [f"memwatch verdict: {report.verdict} over {steps}{why}"]
    holder = top_holder(report)
    if holder is None:
        lines.append("top holder: none named (the leak finder looks at the locals of the functions running the "
                     "steps and at the module's globals); the exception's .report has the curves")
        return "\n".join(lines)
    growth = ""
    if holder.growth_per_step is not None:
        growth = f" {format_bytes(holder.growth_per_step, signed=True)}/{rate_unit(report.clock)},"
    lines.append(f"top holder: {holder.name}{growth} {holder.kind}, {format_bytes(holder.retained_bytes)} retained"
                 f" — e.g. {holder.path}")
    lines.append(f"fix: {holder.fix}")
    return "\n".join(lines)


class LeakError(AssertionError):
    """The verdict of a gated block was one it fails on; `.report` is that block's Report."""

    __module__ = "torchmem_magic"  # tracebacks and CI logs name it where users import it from

    def __init__(self, report: Report) -> None:
        super().__init__(leak_message(report))
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:
        """Runners that report from another process pickle it: the report goes without its timeline
        (the sampled series, with their lock)."""
        return (LeakError, (dataclasses.replace(self.report, timeline=None),))


def _failing(fail_on: str | Collection[str]) -> frozenset[str]:
    verdicts = frozenset((fail_on,) if isinstance(fail_on, str) else fail_on)
    if not verdicts or not verdicts <= set(FAILING_VERDICTS):
        raise ValueError(f"fail_on takes one or more of {', '.join(FAILING_VERDICTS)}; got {fail_on!r}")
    return verdicts


class LeakGate:
    """Runs a block under a memwatch session, then raises LeakError when the verdict is one of `fail_on`.

    `namespace`: the globals of the code under test; `frame`: where the block is (its function is
    where fix lines are looked for first), or `code`: that function when it is not running yet.

    The session is stopped (hooks removed, sampler joined) before anything is judged; an exception
    from the block propagates unchanged, never replaced by a LeakError.
    """

    def __init__(
        self,
        namespace: dict[str, Any],
        frame: FrameType | None = None,
        fail_on: str | Collection[str] = ("leak",),
        *,
        code: CodeType | None = None,
        options: MemwatchOptions | None = None,
        **given: Any,
    ) -> None:
        self.fail_on = _failing(fail_on)
        unknown = sorted(set(given) - set(OPTION_NAMES))
        if unknown:  # said here, where the gate is written, not when the block starts
            raise TypeError(f"unknown option {', '.join(unknown)}; the options are {', '.join(sorted(OPTION_NAMES))}"
                            " and fail_on")
        options = options if options is not None else MemwatchOptions(**given)
        self._namespace, self._frame, self._code, self._options = namespace, frame, code, options
        self.session: MemwatchSession | None = None

    def __enter__(self) -> MemwatchSession:
        if self.session is not None:
            raise RuntimeError("a LeakGate runs one block")
        frame, self._frame = self._frame, None  # no reference cycle through the caller's frame
        self.session = watch_from(self._namespace, frame, self._options, code=self._code)
        del frame
        return self.session.__enter__()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        __tracebackhide__ = True  # pytest: the failure points at the test's `with`, not here
        assert self.session is not None
        self.session.__exit__(exc_type, exc, tb)
        report = self.session.report
        if exc is None and report is not None and report.verdict in self.fail_on:
            raise LeakError(report)


@takes_options
def assert_no_leak(options: MemwatchOptions, *, fail_on: str | Collection[str] = ("leak",)) -> LeakGate:
    """`with assert_no_leak(): train(200)`: raise LeakError when the block's memory leaks.

    The options are `memwatch()`'s; the holder is looked for in the locals of the test function and
    of the helpers it calls while they run steps, and in the module's globals.

    Only "leak" fails by default: it needs growth that is significant against the run's own noise,
    or a holder seen growing. "suspect" (graphs new in the block that too few scans could judge) and
    "unknown" (too few steps for any verdict) say the run could not tell, and a gate that fails on
    what it cannot tell makes flaky CI; pass `fail_on=("leak", "suspect")` to be stricter.
    With `guard` (0.9, 90 or '90%'), a block about to exhaust RAM, /dev/shm or VRAM is stopped with
    MemoryGuardError (a MemoryError: the test errors, and the runner survives to report it).
    Like any memwatch session, it cannot run inside another one (RuntimeError).
    """
    caller = sys._getframe(2)  # 1 is `takes_options`' front end
    return LeakGate(caller.f_globals, caller, fail_on, options=options)
