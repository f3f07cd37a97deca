"""The memory guard in-process: `memwatch(guard=0.9)` and `assert_no_leak(guard=0.9)` stop a loop that
leaks 5 MiB a step with MemoryGuardError before a RAM limit (set with TORCHMEM_MAGIC_RAM_LIMIT just above
what this process uses), the same loop without the guard runs to its end, a loop without a step clock
is reported as one the guard could not stop, and the live figure shows the threshold."""

from __future__ import annotations

import mmap
import re
import threading
import time
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
import torch

from torchmem_magic import MemoryGuardError, MemwatchSession, assert_no_leak, last_report, memwatch
from torchmem_magic.tracing.hooks import installed_hook_count
from torchmem_magic.probes.limits import RAM_LIMIT_VARIABLE
from torchmem_magic.tracing.sampler import THREAD_NAME
from torchmem_magic.session.run import active_session
from torchmem_magic.core.options import SessionOptions

MIB = 1 << 20
STEP_BYTES = 5 * MIB
HEADROOM_BYTES = 150 * MIB  # the 90% threshold lies this far above the RAM in use before the loop


def _ram_bytes() -> int:
    me = psutil.Process()
    return int(me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True)))


@pytest.fixture()
def limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, int]]:
    """(threshold, limit): a RAM limit whose 90% is HEADROOM_BYTES above the RAM in use now."""
    threshold = _ram_bytes() + HEADROOM_BYTES
    limit_bytes = int(threshold / 0.9)
    monkeypatch.setenv(RAM_LIMIT_VARIABLE, str(limit_bytes))
    yield threshold, limit_bytes
    assert installed_hook_count() == 0 and active_session() is None
    assert not [t for t in threading.enumerate() if t.name == THREAD_NAME]


def leaky_training(kept: list[torch.Tensor], steps: int) -> None:
    """An optimizer loop that keeps 5 MiB a step (written, so resident) at ~100 steps a second."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        kept.append(torch.ones(STEP_BYTES // 4))
        time.sleep(0.01)


def _assert_stopped_near_the_threshold(error: MemoryGuardError, kept: list[torch.Tensor], steps: int,
                                       threshold: int, limit_bytes: int) -> None:
    report = last_report()
    assert report is not None and report.status == "error"
    assert 5 < len(kept) < steps  # stopped mid-way, what it kept is there
    assert report.steps == len(kept) + 1  # the step that raised had not appended yet
    assert threshold - 100 * MIB < report.ram.end_bytes < limit_bytes  # near the threshold, below the limit
    first = str(error).splitlines()[0]
    assert first.startswith("memwatch guard: RAM at ") and "TORCHMEM_MAGIC_RAM_LIMIT" in first
    assert "MiB/step (" in first and "MiB/s)" in first and "OOM killer" in first
    assert report.advice[0].startswith(f"the memory guard stopped the run after {report.steps} steps with MemoryGuardError")
    assert report.ram.limit_source == "TORCHMEM_MAGIC_RAM_LIMIT"


def test_memwatch_with_a_guard_stops_a_leak_before_the_limit(limit: tuple[int, int]) -> None:
    threshold, limit_bytes = limit
    kept: list[torch.Tensor] = []
    with pytest.raises(MemoryGuardError) as caught:
        with memwatch(quiet=True, guard=0.9):
            leaky_training(kept, 200)  # 1000 MiB: far past the limit
    assert isinstance(caught.value, MemoryError)
    _assert_stopped_near_the_threshold(caught.value, kept, 200, threshold, limit_bytes)


def test_assert_no_leak_with_a_guard_raises_it_too(limit: tuple[int, int]) -> None:
    threshold, limit_bytes = limit
    kept: list[torch.Tensor] = []
    with pytest.raises(MemoryGuardError) as caught:
        with assert_no_leak(quiet=True, guard="90%"):
            leaky_training(kept, 200)
    _assert_stopped_near_the_threshold(caught.value, kept, 200, threshold, limit_bytes)


def test_without_a_guard_the_same_loop_crosses_the_threshold_and_runs_to_its_end(limit: tuple[int, int]) -> None:
    threshold, limit_bytes = limit
    steps = (HEADROOM_BYTES + (limit_bytes - threshold) // 2) // STEP_BYTES  # to half-way between threshold and limit
    kept: list[torch.Tensor] = []
    with memwatch(quiet=True) as session:
        leaky_training(kept, steps)
    report = session.report
    assert report is not None and report.status == "ok" and len(kept) == steps
    assert report.ram.peak_bytes > threshold
    assert not any("memory guard" in line for line in report.advice)


def test_a_loop_without_a_step_clock_is_reported_as_one_the_guard_could_not_stop(limit: tuple[int, int]) -> None:
    threshold, _ = limit
    kept: list[mmap.mmap] = []
    with memwatch(quiet=True, guard=0.9) as session:
        # plain memory, no optimizer, backward, batch or forward call: 5 MiB pages (fresh and written, so
        # resident whatever the allocator kept free from earlier tests) until the sampler has read RAM past the
        # guard's threshold twice after the 40th (on a busy machine its readings come late), or a minute
        deadline, past = time.monotonic() + 60, set()  # the times of the readings past the threshold
        while time.monotonic() < deadline and (len(kept) < 40 or len(past) < 2):
            if len(kept) < 80:
                page = mmap.mmap(-1, STEP_BYTES)
                page.write(b"x" * STEP_BYTES)
                kept.append(page)
            reading = session.view.last_reading if session.view is not None else None
            if len(kept) >= 40 and reading and reading["ram_bytes"] > threshold:
                past.add(reading["t_s"])
            time.sleep(0.01)
    report = session.report
    assert report is not None and report.status == "ok" and len(kept) >= 40 and report.clock == "time"
    assert "could not stop the loop: it has no step clock" in report.advice[0]
    for page in kept:
        page.close()


def test_a_bad_guard_is_a_value_error_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="guard takes a share of the limit"):
        memwatch(guard="most")
    assert active_session() is None


def test_the_live_figure_draws_the_threshold_and_the_status_line_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchmem_magic.widgets.live import LiveFigure

    figure = LiveFigure()  # its widgets loaded before RAM is measured
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monkeypatch.setenv(RAM_LIMIT_VARIABLE, str(int(_ram_bytes() / 0.6)))  # RAM at 60% of the limit: 2/3 of 90%
    with MemwatchSession(SessionOptions(10, guard=0.9), listener=figure) as session:
        for _ in range(40):
            optimizer.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
            time.sleep(0.02)
    assert session.report is not None and session.report.status == "ok"
    ram = figure.strips["ram_bytes"]
    assert ram.guard_lines.visible, (session.guard.levels if session.guard else None, figure.status.value)
    assert list(ram.guard_lines.labels) == ["guard: 90% of RAM limit"] and ram.guard_lines in ram.figure.marks
    threshold_mib = 0.9 * session.view.ram_limit.limit_bytes / MIB
    assert np.allclose(ram.guard_lines.y, threshold_mib) and ram.y_scale.max > threshold_mib
    status = figure.status.value.replace("&nbsp;", " ")
    assert re.search(r" · guard: RAM (5|6|7)\d% of \d+\.\d [MG]iB( ·|, 90% in ~)", status), status

    monkeypatch.setenv(RAM_LIMIT_VARIABLE, str(_ram_bytes() * 10))  # far below half the threshold: no line
    figure = LiveFigure()
    with MemwatchSession(SessionOptions(10, guard=0.9), listener=figure):
        time.sleep(0.4)
    assert figure.strips["ram_bytes"].guard_lines is None  # never drawn: not even made
    assert "guard: 90% of RAM limit at " in figure.strips["ram_bytes"].figure.title  # where it is, above the plot
