"""The live verdict on the seconds clock, before the loop's first step: the cell may still be setting
up (torch's own setup, the model, the data), growth that stops when its loop starts."""

from __future__ import annotations

import time

import torch

from torchmem_magic import MemwatchSession
from torchmem_magic.session.live_view import LIVE_SECONDS_GRACE_S
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.tracing.steps import RunTime
from torchmem_magic.core.timeline import Timeline

from idle_views import idle_view

MIB = 1 << 20


def test_no_live_verdict_from_the_setup_before_the_first_step() -> None:
    session = MemwatchSession(SessionOptions(10))
    built, verdicts = [], []
    with session:
        for _ in range(120):  # ~1.2 s of setup: 120 MiB of tensors built before the loop starts
            built.append(torch.ones(MIB // 4))
            time.sleep(0.01)
            assert session.view is not None
            verdicts.append(session.view.live_status().verdict)
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            optimizer.zero_grad(); model(torch.randn(4, 8)).sum().backward(); optimizer.step()
    assert verdicts[-1] is None and not any(verdicts), [v for v in verdicts if v][:3]


def test_a_cell_that_never_steps_is_judged_on_seconds_once_past_the_setup() -> None:
    now = [0.0]
    timeline = Timeline()
    for i in range(400):  # 40 s at 100 ms, growing 1 MiB a second: a loop without any step clock
        timeline.by_time.append({"t_s": i * 0.1, "ram_bytes": 1e9 + i * 0.1 * MIB, "heap_bytes": 5e8 + i * 0.1 * MIB})
    view = idle_view(timeline)
    runtime = RunTime(lambda: now[0])
    runtime.start()
    view._runtime = runtime  # a clock the test moves
    now[0] = LIVE_SECONDS_GRACE_S / 2
    assert view.live_verdict() is None
    now[0] = 40.0
    live = view.live_verdict()
    assert live is not None and live.verdict == "leak", live
