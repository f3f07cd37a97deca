"""The lean step path on real torch loops: once the clock is chosen only its hook stays, a step with nothing
due never reaches the session, and what is asked from another thread still comes at the very next step."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from torchmem_magic import MemwatchSession
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.tracing.hooks import installed_hook_count
from torchmem_magic.tracing.patches import WRAPPER_MARK


def _ours(function: Any) -> bool:
    return bool(getattr(function, WRAPPER_MARK, False))


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()


class _TickCount:
    """How many steps reached the session (its `tick`), of each clock."""

    def __init__(self, session: MemwatchSession) -> None:
        self.ticks: list[str] = []
        tick = session.step_path.tick

        def counted(clock: Any) -> None:
            self.ticks.append(clock)
            tick(clock)

        assert session._hooks is not None
        session._hooks._on_tick = counted


def test_once_optimizer_steps_are_the_clock_the_lesser_clocks_hooks_go_and_come_back_next_cell() -> None:
    model, optimizer = _model()
    loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4)
    for _ in range(2):
        with MemwatchSession(SessionOptions()) as session:
            assert _ours(vars(torch.autograd)["_engine_run_backward"]) and _ours(_BaseDataLoaderIter.__next__)
            for (x,) in loader:
                _step(model, optimizer, x)
            assert not _ours(vars(torch.autograd)["_engine_run_backward"]) and not _ours(_BaseDataLoaderIter.__next__)
            assert _ours(DataLoader.__iter__)  # the passes (epochs) are still marked
        assert installed_hook_count() == 0
        report = session.report
        assert report is not None and (report.clock, report.steps, report.optimizer_steps, report.epochs) == (
            "optimizer", 16, 16, 1)


def test_a_step_with_nothing_due_never_reaches_the_session_and_every_step_is_counted() -> None:
    model, optimizer = _model()
    x = torch.randn(8, 4)
    with MemwatchSession(SessionOptions()) as session:
        reached = _TickCount(session)
        for _ in range(3000):
            _step(model, optimizer, x)
        gate = session.step_counter.gate
        assert (gate.clock, gate.step, session.steps) == ("optimizer", 3000, 3000)
        chosen_at = reached.ticks.index("optimizer")
        assert reached.ticks[:chosen_at] == ["forward", "backward"]  # the first step's, before its optimizer step
        assert set(reached.ticks[chosen_at:]) == {"optimizer"}  # from then on the lesser clocks' hooks are gone
        # the dense start samples each step; past it, only the due steps come (a sample, a scan's reading)
        assert len(reached.ticks) < 3000 - session.step_counter.sampling.dense_steps


def test_what_another_thread_asks_runs_at_the_very_next_step() -> None:
    model, optimizer = _model()
    x = torch.randn(8, 4)
    ran_at: list[int] = []
    with MemwatchSession(SessionOptions()) as session:
        gate = session.step_counter.gate
        for _ in range(5000):
            _step(model, optimizer, x)
            if gate.due_step > gate.step + 1:
                break
        assert gate.due_step > gate.step + 1, "the gate never waited for a later step"
        asked_at = gate.step
        session.requests.request(lambda: ran_at.append(session.steps))  # as a button's click does
        _step(model, optimizer, x)
    assert ran_at == [asked_at + 1]


def test_the_sampler_opens_the_gate_when_a_scans_time_has_come() -> None:
    from torchmem_magic.finder.leak_finder import LeakSearch
    from torchmem_magic.finder.scan.results import Root

    model, optimizer = _model()
    x = torch.randn(8, 4)
    search = LeakSearch(lambda: [Root("model", "user", "model", model)])
    with MemwatchSession(SessionOptions(), search=search) as session:
        for _ in range(300):
            _step(model, optimizer, x)
        finder, gate, background = session.finder, session.step_counter.gate, session.background
        assert finder is not None and background is not None and finder._tracker is not None
        schedule = finder._tracker.schedule
        schedule.check_at_step = gate.due_step = gate.step + 10_000  # a countdown far off, as slow steps leave it
        schedule._next_scan_s = schedule._budget_ready_s = 0.0  # and the scan's time has come
        scans = finder.scans
        background.row()  # the sampler's reading
        assert gate.due_step == 0
        _step(model, optimizer, x)
        assert finder.scans == scans + 1


def test_interleaved_loaders_put_the_batch_hook_back_and_the_training_loader_stays_right() -> None:
    """A validation pass inside each training epoch (the training pass still under way): from then on only a
    batch tells which loader carries the steps; the epochs are the training loader's passes."""
    model, optimizer = _model()
    train = DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=4)
    val = DataLoader(TensorDataset(torch.randn(80, 4)), batch_size=4)
    with MemwatchSession(SessionOptions()) as session:
        for _ in range(3):
            for i, (x,) in enumerate(train):
                _step(model, optimizer, x)
                if i == 4:
                    assert not _ours(_BaseDataLoaderIter.__next__) or session._hooks.loaders.interleaved  # type: ignore[union-attr]
                    with torch.no_grad():
                        for (v,) in val:
                            model(v)
                    assert _ours(_BaseDataLoaderIter.__next__)
    report = session.report
    assert report is not None and (report.clock, report.steps, report.epochs) == ("optimizer", 30, 3)
    assert session.step_counter.training_loader(session.timeline) == 1


def test_a_reading_takes_the_heap_figure_of_a_step_sample_filed_with_it_instead_of_walking_the_heap() -> None:
    """mallinfo2 walks the heap's free lists (up to ms on a churned heap): a step sample already did."""
    from torchmem_magic.core.resources import HEAP

    model, optimizer = _model()
    x = torch.randn(8, 4)
    with MemwatchSession(SessionOptions()) as session:
        for _ in range(10):
            _step(model, optimizer, x)
        probes, background = session.probes, session.background
        assert probes is not None and background is not None
        heap = probes._background_heap
        if not heap.available:
            pytest.skip("no glibc heap counters here")
        walks: list[int] = []

        def counted(walk: Any) -> Any:
            def walked() -> Any:
                walks.append(1)
                return walk()

            return walked

        heap._mallinfo2, heap._releasing = counted(heap._mallinfo2), counted(heap._releasing)  # GIL kept or not
        background.row()  # files what is queued; from here on, one step sample at a time
        walks.clear()
        session.step_counter.sampling.sample_next()
        _step(model, optimizer, x)
        queued = session.step_counter._rows[-1][1]
        assert background.row()[HEAP.column] == queued[HEAP.column] and walks == []
        background.row()  # no step sample since: a walk of its own
        assert walks == [1]


def test_the_samplers_heap_walk_lets_go_of_the_gil_only_after_a_long_walk() -> None:
    """A short walk keeps the GIL (a handoff would cost the training thread more); a long one lets go."""
    from torchmem_magic.probes.heap import RELEASE_GIL_WALK_S, HeapProbe

    heap = HeapProbe(release_gil=True)
    if not heap.available:
        pytest.skip("no glibc heap counters here")
    used: list[str] = []
    kept, releasing = heap._mallinfo2, heap._releasing

    def spied(name: str, walk: Any) -> Any:
        def called() -> Any:
            used.append(name)
            return walk()

        return called

    heap._mallinfo2, heap._releasing = spied("kept", kept), spied("let go", releasing)
    heap.heap_bytes()
    heap._last_walk_s = 2 * RELEASE_GIL_WALK_S  # as a churned heap's walk takes
    heap.heap_bytes()
    assert used == ["kept", "let go"]
