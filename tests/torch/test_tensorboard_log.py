"""`memwatch(log_to=writer)` with a real `SummaryWriter`, read back through TensorBoard's own event reader:
each curve and the leak rate, at the run's steps, written from the sampler thread while the loop runs."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import torchmem_magic
from torchmem_magic.report.scalars import GROWTH_TAG, SCALAR_PREFIX
from torchmem_magic.session.run import active_session
from torchmem_magic.tracing.sampler import THREAD_NAME

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

#: the writes the loops wait for while they run (a write a second: several seconds of steps)
WRITES_WHILE_RUNNING = 3


class Recording:
    """A SummaryWriter that also notes the thread of each write."""

    def __init__(self, log_dir: Path) -> None:
        self.writer = SummaryWriter(str(log_dir))
        self.threads: list[str] = []

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> Any:
        self.threads.append(threading.current_thread().name)
        return self.writer.add_scalar(tag, scalar_value, global_step=global_step)

    def flush(self) -> None:
        self.writer.flush()


def _train(log_dir: Path, leak: bool) -> tuple[torchmem_magic.Report, Recording, dict[str, list[tuple[int, float]]]]:
    """A small loop, leaking 16 KiB a step or not, that runs until the sampler wrote WRITES_WHILE_RUNNING times."""
    recording = Recording(log_dir)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    with torchmem_magic.memwatch(log_to=recording, quiet=True) as session:
        while recording.threads.count(THREAD_NAME) < 6 * WRITES_WHILE_RUNNING:
            loss = model(torch.randn(32, 64)).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
            if leak:
                kept.append(torch.randn(4096))
    recording.writer.close()
    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    scalars = {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}
    assert session.report is not None
    return session.report, recording, scalars


def test_a_leak_is_logged_as_it_grows_at_the_steps_of_the_run(tmp_path: Path) -> None:
    report, recording, scalars = _train(tmp_path, leak=True)
    assert report.verdict == "leak"
    for column in ("ram_bytes", "rss_bytes", "heap_bytes"):
        points = scalars[SCALAR_PREFIX + column]
        steps = [step for step, _ in points]
        assert len(points) >= WRITES_WHILE_RUNNING and steps == sorted(set(steps)), points
        assert steps[-1] == report.steps  # the last point is the run's end
    heap = scalars[SCALAR_PREFIX + "heap_bytes"]
    assert heap[-1][1] - heap[0][1] >= 0.5 * (16 << 10) * (heap[-1][0] - heap[0][0]), heap  # it grows with the steps
    # the report's own readings (its last, or the sampler's at the same step; an event file keeps float32),
    # each curve in its own column
    assert 0.95 * report.heap.end_bytes <= heap[-1][1] <= report.heap.peak_bytes * (1 + 1e-6), (heap, report.heap)
    assert heap[-1][1] < scalars[SCALAR_PREFIX + "rss_bytes"][-1][1] <= scalars[SCALAR_PREFIX + "ram_bytes"][-1][1]
    growth = scalars[GROWTH_TAG]
    assert growth[-1][1] == pytest.approx(16 << 10, rel=0.3) and growth[-1][0] == report.steps, growth
    # the training thread wrote nothing: the sampler's writes while it ran, the end's after it stopped
    assert set(recording.threads) <= {THREAD_NAME, threading.main_thread().name}
    assert recording.threads.count(THREAD_NAME) >= 6 * WRITES_WHILE_RUNNING


def test_a_clean_loop_logs_no_growth(tmp_path: Path) -> None:
    report, _, scalars = _train(tmp_path, leak=False)
    assert report.verdict == "clean"
    assert scalars[GROWTH_TAG][-1] == (report.steps, 0.0)
    assert SCALAR_PREFIX + "vram_allocated_bytes" not in scalars or torch.cuda.is_available()  # no CUDA: no curve


def test_anything_but_a_writer_is_refused_in_one_line_before_the_run() -> None:
    with pytest.raises(TypeError, match=r"^log_to: expected a torch.utils.tensorboard.SummaryWriter .* got str$"):
        torchmem_magic.memwatch(log_to="runs/")
    assert active_session() is None
