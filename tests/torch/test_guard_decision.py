"""The memory guard's pure parts: the trip decision on synthetic readings (the sampler's rows and the
sampled steps', and when the next check at a step comes), the parsing of its share and of the RAM limit
variable, its texts; and the step request that raises through the step hooks."""

from __future__ import annotations

import gc
import weakref

import math
import pickle
from typing import cast

import bqplot
import numpy as np
import pytest

import torchmem_magic
from torchmem_magic.analysis.guard_rules import GuardTrip, Level, guard_trip, steps_to_next_check
from torchmem_magic.render.advice.guard import guard_advice, guard_message, guard_status
from torchmem_magic.tracing.guard import MemoryGuard, MemoryGuardError
from torchmem_magic.tracing.hooks import TrainingHooks
from torchmem_magic.core.options import parse_guard
from torchmem_magic.probes.accelerator import AcceleratorProbe
from torchmem_magic.probes.limits import RAM_LIMIT_VARIABLE, MemoryLimit, memory_limit, parse_size
from torchmem_magic.probes.shm import ShmProbe, ShmReading
from torchmem_magic.widgets.curve_strip import CurveStrip, StripCurve, Threshold
from torchmem_magic.core.step_requests import StepRequests

MIB, GIB = 1 << 20, 1 << 30


def ram(used_mib: float, per_s_mib: float | None = None, limit_mib: float = 1000.0) -> Level:
    per_s = None if per_s_mib is None else per_s_mib * MIB
    return Level("RAM", used_mib * MIB, limit_mib * MIB, "cgroup v2", per_s, None if per_s is None else per_s / 10)


# ----------------------------------------------------------------------------- the decision


def test_below_the_threshold_and_not_reaching_it_soon_does_not_trip() -> None:
    assert guard_trip([ram(500, per_s_mib=100)], 0.9, horizon_s=0.2) is None  # 520 MiB by then: 52%
    assert guard_trip([ram(899.9)], 0.9, horizon_s=0.2) is None


def test_at_or_over_the_threshold_now_trips_on_the_current_level() -> None:
    trip = guard_trip([ram(900)], 0.9, horizon_s=0.2)
    assert trip == GuardTrip(ram(900), 0.9, projected=False, horizon_s=0.0)
    shm = Level("/dev/shm", 62 * MIB, 64 * MIB, "its size")  # 97% against 95%
    trip = guard_trip([ram(950), shm], 0.9, horizon_s=0.2)
    assert trip is not None and trip.level is shm  # the fullest of those over


def test_projected_over_within_the_horizon_trips_before_it_is_reached() -> None:
    trip = guard_trip([ram(850, per_s_mib=500)], 0.9, horizon_s=0.11)  # 905 MiB in 0.11 s
    assert trip is not None and trip.projected and trip.horizon_s == 0.11
    assert guard_trip([ram(850, per_s_mib=500)], 0.9, horizon_s=0.05) is None  # 875 MiB: not yet


def test_a_rate_of_zero_or_less_counts_only_the_current_level() -> None:
    for rate in (0.0, -1000.0, None, math.nan):
        level = Level("RAM", 890 * MIB, 1000 * MIB, "system", None if rate is None else rate * MIB)
        assert guard_trip([level], 0.9, horizon_s=100.0) is None
    assert guard_trip([ram(901, per_s_mib=-1000)], 0.9, horizon_s=1.0) is not None


def test_nan_readings_and_unknown_limits_are_ignored() -> None:
    missing = Level("/dev/shm", math.nan, 64 * MIB, "its size", math.nan)
    no_limit = Level("VRAM cuda:0", 80 * GIB, math.nan, "the device's size")
    zero_limit = Level("VRAM cuda:1", 80 * GIB, 0.0, "the device's size")
    assert guard_trip([missing, no_limit, zero_limit, ram(100)], 0.9, horizon_s=1.0) is None
    trip = guard_trip([missing, ram(950)], 0.9, horizon_s=1.0)
    assert trip is not None and trip.level.resource == "RAM"
    assert guard_trip([ram(850, per_s_mib=500)], 0.9, horizon_s=math.nan) is None


def test_a_level_over_now_wins_over_a_projected_one() -> None:
    vram = Level("VRAM cuda:0", 72.5 * GIB, 80 * GIB, "the device's size", 10 * GIB)
    trip = guard_trip([ram(880, per_s_mib=1000), vram], 0.9, horizon_s=1.0)
    assert trip is not None and trip.level is vram and not trip.projected


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("value", ["90%", "90", " 90 % ", "0.9", 0.9, 90, 90.0])
def test_the_guard_share_reads_percent_number_or_fraction(value: str | float) -> None:
    assert parse_guard(value) == pytest.approx(0.9)


@pytest.mark.parametrize("value", ["", "abc", "0", "0%", "-5", "101", "150%", "nan", "inf", True])
def test_a_bad_guard_share_is_one_clear_value_error(value: str | float) -> None:
    with pytest.raises(ValueError, match=r"guard takes a share of the limit: 90%, 90 or 0\.9"):
        parse_guard(value)


def test_the_ram_limit_variable_overrides_the_cgroup_and_takes_units(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_size("2GiB") == 2 * GIB and parse_size("512 MiB") == 512 * MIB and parse_size("1.5G") == 3 * GIB // 2
    assert parse_size("4000000000") == 4_000_000_000 and parse_size("2GB") == 2 * 10**9
    assert parse_size("2 gigs") is None and parse_size("0") is None and parse_size("-1G") is None
    monkeypatch.setenv(RAM_LIMIT_VARIABLE, "3GiB")
    limit = memory_limit()
    assert (limit.limit_bytes, limit.source) == (3 * GIB, "TORCHMEM_MAGIC_RAM_LIMIT")
    monkeypatch.setenv(RAM_LIMIT_VARIABLE, "lots")
    with pytest.raises(ValueError, match="TORCHMEM_MAGIC_RAM_LIMIT='lots' is not a size"):
        memory_limit()
    monkeypatch.delenv(RAM_LIMIT_VARIABLE)
    assert memory_limit().source != "TORCHMEM_MAGIC_RAM_LIMIT"


# ----------------------------------------------------------------------------- texts


def test_the_message_names_resource_level_rate_and_holder() -> None:
    level = Level("RAM", 3686 * MIB, 4 * GIB, "TORCHMEM_MAGIC_RAM_LIMIT", 480 * MIB, 5 * MIB)
    text = guard_message(GuardTrip(level, 0.9, False, 0.0), "optimizer", "kept +5.0 MiB/step, tensors — fix: del kept")
    first, second = text.splitlines()
    assert first == ("memwatch guard: RAM at 3.6 GiB, 90% of its 4.0 GiB limit (TORCHMEM_MAGIC_RAM_LIMIT) over the 90% "
                     "guard, growing +5.0 MiB/step (+480.0 MiB/s); stopped before the OOM killer")
    assert second == "top holder so far: kept +5.0 MiB/step, tensors — fix: del kept"
    soon = guard_message(GuardTrip(level, 0.95, True, 0.11), "optimizer", None)
    assert "would pass 95% within 0.11 s at +5.0 MiB/step (+480.0 MiB/s)" in soon
    assert soon.endswith("top holder so far: none named yet (see the report's suspects)")


def test_the_status_line_warns_with_the_time_to_the_threshold() -> None:
    level = Level("RAM", 0.61 * 4 * GIB, 4 * GIB, "cgroup v2", 5 * MIB)
    assert guard_status([level], 0.9) == "guard: RAM 61% of 4.0 GiB, 90% in ~4 min at +5.0 MiB/s"
    assert guard_status([ram(500)], 0.9) == "guard: RAM 50% of 1000.0 MiB"
    assert guard_status([ram(950)], 0.9) == "guard: RAM 95% of 1000.0 MiB, over 90%: stopping at the next step"
    assert guard_status([ram(950)], 0.9, clock="time") == "guard: RAM 95% of 1000.0 MiB, over 90%: no step clock to stop it at"
    shm = Level("/dev/shm", 10 * MIB, 64 * MIB, "its size", 1 * MIB)
    assert guard_status([level, shm], 0.9) == "guard: /dev/shm 16% of 64.0 MiB, 90% in ~48 s at +1.0 MiB/s"  # the sooner
    assert guard_status([Level("RAM", math.nan, GIB, "system")], 0.9) is None
    close = Level("RAM", 0.895 * GIB, GIB, "system", 20 * MIB)  # 5 MiB to go at 20 MiB/s
    assert guard_status([close], 0.9) == "guard: RAM 90% of 1.0 GiB, 90% within a second at +20.0 MiB/s"


def test_the_advice_says_what_the_guard_did_or_why_it_could_not() -> None:
    trip = GuardTrip(ram(905, per_s_mib=50), 0.9, False, 0.0)
    assert guard_advice(None, 0.9, False, False, "optimizer", 10) == ()
    (stopped,) = guard_advice(trip, 0.9, True, True, "optimizer", 31)
    assert stopped.startswith("the memory guard stopped the run after 31 steps with MemoryGuardError: RAM reached 90%")
    (no_clock,) = guard_advice(trip, 0.9, False, False, "time", 0)
    assert "could not stop the loop: it has no step clock" in no_clock
    (caught,) = guard_advice(trip, 0.9, False, True, "optimizer", 40)
    assert "the loop caught it and went on" in caught


def test_the_error_is_a_public_memory_error_that_pickles() -> None:
    assert torchmem_magic.MemoryGuardError is MemoryGuardError
    error = MemoryGuardError("memwatch guard: RAM ...")
    assert isinstance(error, MemoryError)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is MemoryGuardError and str(again) == str(error)


# ----------------------------------------------------------------------------- the raise and the figure


def test_a_requested_raise_goes_through_the_step_hooks_into_the_loop() -> None:
    """Failures of memwatch's own callbacks are absorbed; the guard's error must not be."""
    errors: list[Exception] = []
    requests = StepRequests(on_error=errors.append)
    error = MemoryGuardError("stop")
    requests.raise_at_step(error)
    hooks = TrainingHooks(lambda clock: requests.run(7), lambda loader_pass: None)
    hooks.active = True
    with pytest.raises(MemoryGuardError) as caught:
        hooks._tick("optimizer")
    assert caught.value is error and not errors and not requests.pending
    hooks._tick("optimizer")  # raised once only


def test_the_figure_draws_a_threshold_once_its_curve_reaches_half_of_it() -> None:
    strip = CurveStrip(bqplot.LinearScale(), bqplot.LinearScale())
    x = np.array([0.0, 1.0])
    guard = Threshold(900.0 * MIB, "guard: 90% of RAM limit", "#1f77b4")
    strip.draw(x, [StripCurve("RAM (process tree)", "#1f77b4", np.array([100.0, 300.0]) * MIB)], [guard], [])
    # 300 of 900 MiB: the line would squash the curve (it is not even made until it is drawn)
    assert strip.guard_lines is None and strip.y_scale.max < 900
    assert strip.figure.title == "RAM (process tree) · guard: 90% of RAM limit at 900.0 MiB, above"
    strip.draw(x, [StripCurve("RAM (process tree)", "#1f77b4", np.array([100.0, 450.0]) * MIB)], [guard], [])
    assert strip.guard_lines.visible and list(strip.guard_lines.labels) == ["guard: 90% of RAM limit"]
    assert strip.guard_lines in strip.figure.marks  # made, and on the figure
    assert np.allclose(strip.guard_lines.y, 900.0) and strip.y_scale.max > 900
    assert strip.figure.title == "RAM (process tree) · guard: 90% of RAM limit (dashed)"
    strip.draw(x, [StripCurve("RAM (process tree)", "#1f77b4", np.array([100.0, 300.0]) * MIB)], [], [])
    assert not strip.guard_lines.visible  # no threshold any more: hidden


# ----------------------------------------------------------------------------- the wiring, with a fake CUDA


class _FakeRun:
    """What MemoryGuard reads of the run it guards (the `Watching` protocol)."""

    def __init__(self) -> None:
        self.clock, self.steps, self.elapsed_s = "optimizer", 0, 0.0

    def holders_so_far(self) -> tuple[dict[str, list[tuple[int, int]]], tuple[()]]:
        return {}, ()

    def live_holder(self) -> str | None:
        return "outputs +2.0 GiB/step, tensors"


def test_each_cuda_device_is_held_against_its_own_size() -> None:
    """Two 80 GiB devices: one filling up trips the guard though their sum is at half of both sizes."""
    from types import SimpleNamespace

    from torchmem_magic.tracing.guard import MemoryGuard
    from torchmem_magic.probes.accelerator import AcceleratorProbe
    from torchmem_magic.probes.limits import MemoryLimit

    reserved = {0: 10 * GIB, 1: 1 * GIB}
    cuda = SimpleNamespace(
        is_initialized=lambda: True, device_count=lambda: 2,
        memory_stats_as_nested_dict=lambda i: {"reserved_bytes": {"all": {"current": reserved[i]}},
                                               "allocated_bytes": {"all": {"current": reserved[i]}}},
        get_device_properties=lambda i: SimpleNamespace(total_memory=80 * GIB),
    )
    probe = AcceleratorProbe(_torch=SimpleNamespace(cuda=cuda))
    guard = MemoryGuard(0.9, MemoryLimit(64 * GIB, "system"), 32 * GIB, probe, interval_s=0.1)
    session = _FakeRun()
    raised: list[MemoryGuardError] = []
    for step in range(1, 9):  # device 0 grows 8 GiB every 0.1 s step: 10, 18, ..., 66 GiB
        session.steps, session.elapsed_s = step, step * 0.1
        row = {"t_s": step * 0.1, "step": float(step), "ram_bytes": 8.0 * GIB, "shm_used_bytes": 1.0 * MIB,
               "vram_reserved_bytes": float(sum(reserved.values()))}
        error = guard.check(row, session)
        if error is not None:
            raised.append(error)
            break
        reserved[0] += 8 * GIB
    assert [lv.resource for lv in guard.levels] == ["RAM", "/dev/shm", "VRAM cuda:0", "VRAM cuda:1"]
    (error,) = raised
    assert isinstance(error, MemoryGuardError) and error.trip is not None
    # at 58 of 80 GiB: the next check and one more step (0.2 s at 80 GiB/s) would take it to 74, past 72
    assert error.trip.level.resource == "VRAM cuda:0" and error.trip.projected and error.trip.horizon_s == pytest.approx(0.2)
    assert reserved[0] == 58 * GIB and sum(reserved.values()) < 0.9 * 160 * GIB
    assert "stopped before CUDA out of memory" in str(error) and "+8.0 GiB/step (+80.0 GiB/s)" in str(error)
    assert str(error).splitlines()[1] == "top holder so far: outputs +2.0 GiB/step, tensors"
    assert guard.check(row, session) is None  # asked once until it is raised
    assert guard.thresholds()[-1] == ("vram_reserved_bytes", 0.9 * 160 * GIB, "guard: 90% of VRAM limit")


def test_a_rise_over_a_few_milliseconds_is_not_projected_over_a_long_interval() -> None:
    """At start-up torch allocates between the first two rows a few ms apart: 60 MiB in 5 ms is 12 GiB/s,
    which over a 10 s sampling interval would pass 90% of 64 GiB from 1.2%. A rate is projected at most a
    few times as far as it was measured; the same rise measured over seconds still trips."""
    from torchmem_magic.tracing.guard import MemoryGuard

    def first_two_rows(gap_s: float) -> MemoryGuardError | None:
        guard = MemoryGuard(0.9, MemoryLimit(64 * GIB, "system"), None, AcceleratorProbe(), interval_s=10.0)
        run = _FakeRun()
        guard.check({"t_s": 0.0, "step": 0.0, "ram_bytes": 0.8 * GIB}, run)
        return guard.check({"t_s": gap_s, "step": 0.0, "ram_bytes": 0.8 * GIB + 60 * MIB * gap_s / 0.005}, run)

    assert first_two_rows(0.005) is None
    over_a_second = first_two_rows(1.0)  # 12 GiB in 1 s: projected 4 s ahead, past 90%
    assert over_a_second is not None and over_a_second.trip is not None and over_a_second.trip.projected


# ----------------------------------------------------------------------------- the checks at steps


def shm(used_mib: float, per_step_mib: float | None = None, limit_mib: float = 16.0) -> Level:
    per_step = None if per_step_mib is None else per_step_mib * MIB
    return Level("/dev/shm", used_mib * MIB, limit_mib * MIB, "its size", per_step, per_step)


def test_the_next_step_check_comes_before_the_growth_per_step_reaches_the_threshold() -> None:
    assert steps_to_next_check([shm(2)], 0.8, stride_steps=40) == 40  # not growing: the stride
    assert steps_to_next_check([shm(2, per_step_mib=0.0)], 0.8, stride_steps=40) == 40
    assert steps_to_next_check([shm(2, per_step_mib=1)], 0.8, stride_steps=40) == 10  # 12 MiB then, 13 after
    assert steps_to_next_check([shm(2, per_step_mib=0.25)], 0.8, stride_steps=40) == 40  # 43 steps to 12.8
    assert steps_to_next_check([shm(12.2, per_step_mib=0.01)], 0.8, stride_steps=40) == 1  # within 5% of the size
    assert steps_to_next_check([shm(12.2)], 0.8, stride_steps=40) == 1  # a jump there could pass it in a step
    assert steps_to_next_check([shm(2, per_step_mib=100)], 0.8, stride_steps=40) == 1
    assert steps_to_next_check([shm(2, per_step_mib=1), ram(100, per_s_mib=1)], 0.8, stride_steps=0) == 1
    missing = Level("/dev/shm", math.nan, 16 * MIB, "its size", math.nan, math.nan)
    assert steps_to_next_check([missing], 0.8, stride_steps=40) == 40


class _FakeShm:
    """The shared-memory filesystem as the step check reads it (`usage()`), filled by the test."""

    def __init__(self, total_bytes: int) -> None:
        self.used_bytes, self.total_bytes = 0, total_bytes

    def usage(self) -> ShmReading:
        return ShmReading(self.used_bytes, self.total_bytes)


def _shm_guard(fake: _FakeShm) -> MemoryGuard:
    """A guard of a 1 TiB RAM limit (far away), no device, and `fake` as /dev/shm, sampled every 10 s."""
    return MemoryGuard(0.8, MemoryLimit(1 << 40, "system"), fake.total_bytes, AcceleratorProbe([]), interval_s=10.0,
                       shm=cast(ShmProbe, fake))


def _step_row(step: int) -> dict[str, float]:
    """A step row as the training thread makes it: /dev/shm as the sampler last read it (empty)."""
    return {"t_s": step * 0.001, "step": float(step), "ram_bytes": 300.0 * MIB, "shm_used_bytes": 0.0}


def test_the_step_check_reads_shm_now_and_trips_at_the_last_step_under_the_threshold() -> None:
    fake = _FakeShm(16 * MIB)
    guard = _shm_guard(fake)
    run = _FakeRun()
    ahead = []
    for step in range(1, 20):  # 1 MiB a step, a step a millisecond: far faster than the 10 s interval
        run.steps = step
        error = guard.check_step(_step_row(step), run, stride_steps=64)
        if error is not None:
            break
        ahead.append(guard.next_check_steps)
        fake.used_bytes += MIB
    assert isinstance(error, MemoryGuardError) and error.trip is not None
    assert fake.used_bytes == 12 * MIB and step == 13  # 13 MiB after one more step: over 12.8
    assert error.trip.level.resource == "/dev/shm" and error.trip.projected
    assert error.trip.horizon_s == pytest.approx(0.001) and error.trip.level.per_step_bytes == MIB
    assert "/dev/shm at 12.0 MiB, 75% of its 16.0 MiB limit (its size) would pass 80%" in str(error)
    assert "+1.0 MiB/step (+1000.0 MiB/s)" in str(error)
    # the first check knows no growth (the stride); then the check comes before the 1 MiB steps reach 12.8 MiB
    assert ahead == [64, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    assert guard.check_step(_step_row(14), run, stride_steps=64) is None  # asked once


def test_the_sampler_and_the_step_check_ask_for_one_error_between_them() -> None:
    fake = _FakeShm(16 * MIB)
    guard = _shm_guard(fake)
    run = _FakeRun()
    fake.used_bytes = 13 * MIB  # over 80% now, for both checks
    from_sampler = guard.check({**_step_row(5), "shm_used_bytes": 13.0 * MIB}, run)
    assert isinstance(from_sampler, MemoryGuardError)
    assert guard.check_step(_step_row(5), run, stride_steps=1) is None
    requests = StepRequests(on_error=lambda exc: None)
    requests.on_raise = guard.note_raised  # as the session wires them
    requests.raise_at_step(from_sampler)
    with pytest.raises(MemoryGuardError) as caught:  # the session runs the requests after its step check
        requests.run(5)
    assert caught.value is from_sampler and not requests.pending and guard.raised
    first_trip, raised = from_sampler.trip, weakref.ref(from_sampler)
    del from_sampler, caught
    gc.collect()
    assert raised() is None  # the guard keeps no error it raised (its traceback holds the loop's frames)
    # raised, and the loop caught it and went on: the next trip asks again
    again = guard.check_step(_step_row(6), run, stride_steps=1)
    assert isinstance(again, MemoryGuardError) and guard.trip is first_trip


def test_a_better_clock_restarts_the_step_checks_growth() -> None:
    fake = _FakeShm(16 * MIB)
    guard = _shm_guard(fake)
    run = _FakeRun()
    assert guard.check_step(_step_row(40), run, stride_steps=8) is None  # forward calls
    guard.restart_steps()  # optimizer steps from 1
    fake.used_bytes = 2 * MIB
    assert guard.check_step(_step_row(41), run, stride_steps=8) is None
    assert guard.next_check_steps == 8  # no growth known across the clocks
