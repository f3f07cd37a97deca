"""The script API and the session lifecycle, on real torch loops."""

import gc
import json
import threading
import time
import weakref
from typing import Any

import pytest
import torch

import torchmem_magic
from torchmem_magic import MemwatchSession, last_report, memwatch
from torchmem_magic.tracing.hooks import installed_hook_count
from torchmem_magic.tracing.sampler import THREAD_NAME
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.finder.leak_finder import LeakSearch

SPEC_KEYS = {
    "schema", "status", "wall_s", "samples", "interval_s", "steps", "epochs", "ram", "heap", "vram",
    "shm", "workers", "verdict", "leak_kind", "resource", "steps_to_exhaustion", "suspects", "advice",
    "clock", "optimizer_steps", "live_suspects_at_step", "ranks", "worst_rank",
}


def _sampler_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == THREAD_NAME)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    optimizer.zero_grad()
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss


def test_synthetic_leak_of_1mb_per_step_is_measured_as_such() -> None:
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    with memwatch(10, quiet=True) as w:
        for _ in range(60):
            _step(model, optimizer)
            kept.append(torch.ones(1 << 18))  # 1 MiB of float32, touched
    report = w.report
    assert report is last_report()
    assert report.steps == 60 and report.status == "ok"
    if report.heap is None:
        pytest.skip("no heap counters on this platform")
    assert report.heap.per_step_bytes == pytest.approx(1 << 20, rel=0.2)
    # (RSS may stay flat here: glibc can serve the new tensors from pages earlier tests freed)


def test_garbage_of_earlier_cells_is_collected_before_the_first_sample() -> None:
    from torchmem_magic.probes.heap import HeapProbe

    heap = HeapProbe()
    if not heap.available:
        pytest.skip("no heap counters on this platform")
    was_enabled = gc.isenabled()
    gc.disable()  # keep the cycle pending, as it can be when a cell starts
    try:
        cycle: list[object] = [torch.ones(16 << 20)]  # 64 MiB, touched
        cycle.append(cycle)
        del cycle
        pending_bytes = heap.heap_bytes()
        with memwatch(10, quiet=True) as w:
            pass
    finally:
        if was_enabled:
            gc.enable()
    first_heap = w.timeline.by_time.first_value("heap_bytes")
    assert pending_bytes - first_heap > 48 << 20  # freed before the curves start, not in their middle


def test_the_status_line_quotes_the_rate_the_report_does() -> None:
    import random

    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sizes = random.Random(1)
    kept = []
    with memwatch(10, quiet=True) as w:
        for _ in range(80):
            _step(model, optimizer)
            kept.append(torch.ones(sizes.randint(1 << 16, 1 << 19)))  # 0.25-2 MiB: an uneven leak
    if w.report.heap is None:
        pytest.skip("no heap counters on this platform")
    assert w.view is not None and w.view.live_status().heap_per_step == pytest.approx(w.report.heap.per_step_bytes, rel=0.005)


def test_clean_loop_grows_by_almost_nothing() -> None:
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.Adam(model.parameters())
    history = []
    with memwatch(10, quiet=True) as w:
        for _ in range(80):
            history.append(_step(model, optimizer).item())
    assert w.report.heap is None or abs(w.report.heap.per_step_bytes) < 16 << 10


def test_report_matches_spec_schema_and_is_json() -> None:
    with memwatch(5, quiet=True) as w:
        _step(torch.nn.Linear(16, 16), torch.optim.SGD(torch.nn.Linear(16, 16).parameters(), lr=0.1))
    data = w.report.to_dict()
    assert SPEC_KEYS <= set(data)
    assert json.loads(json.dumps(data)) == data
    assert data["schema"] == 2 and data["suspects"] == [] and data["verdict"] == "unknown"
    assert (data["clock"], data["steps"], data["optimizer_steps"]) == ("optimizer", 1, 1)
    assert set(data["ram"]) >= {"start", "end", "peak", "per_step", "limit"}
    assert data["vram"] is None  # no CUDA here: null, not zeros
    assert data["samples"] >= 2 and data["ram"]["peak"] >= data["ram"]["end"] > 0


def test_exception_and_interrupt_leave_nothing_behind() -> None:
    baseline_threads = threading.active_count()
    for exc_type, status in ((ValueError, "error"), (KeyboardInterrupt, "interrupted")):
        with pytest.raises(exc_type):
            with memwatch(5, quiet=True):
                raise exc_type("stop here")
        report = last_report()
        assert report is not None and report.status == status and "stop here" in (report.error or "")
        assert _sampler_threads() == 0 and installed_hook_count() == 0
    assert threading.active_count() == baseline_threads


def test_only_one_session_at_a_time() -> None:
    with memwatch(50, quiet=True):
        with pytest.raises(RuntimeError, match="only one"):
            MemwatchSession().start()
    with memwatch(50, quiet=True):  # the failed start did not wedge the registry
        pass


def test_no_strong_reference_to_user_tensors() -> None:
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with memwatch(5, quiet=True):
        loss = _step(model, optimizer)
        big = torch.ones(1 << 20)
    refs = [weakref.ref(x) for x in (loss, big, model, optimizer)]
    del loss, big, model, optimizer
    gc.collect()
    assert [r() for r in refs] == [None] * 4


def test_bad_arguments() -> None:
    for bad in (0, 0.5, 10_001, float("nan")):
        with pytest.raises(ValueError, match="between 1 and 10000"):
            MemwatchSession(SessionOptions(bad))
    with pytest.raises(ValueError, match="cuda:N"):
        MemwatchSession(SessionOptions(device="tpu:0"))


def test_prints_text_report_unless_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    with memwatch(20):
        pass
    out = capsys.readouterr().out
    assert out.startswith("memwatch: ok") and "RAM (process tree)" in out
    with memwatch(20, quiet=True):
        pass
    assert capsys.readouterr().out == ""


def test_epochs_and_workers_from_a_real_multiprocess_dataloader() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.randn(64, 16)), batch_size=8, num_workers=2)
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with memwatch(20, quiet=True) as w:
        for _ in range(2):
            for (x,) in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
                time.sleep(0.03)  # epochs of ~0.25 s: long enough for the 20 ms sampler
    report = w.report
    assert report.steps == 16 and report.epochs == 2
    assert report.workers is not None and report.workers.max_count == 2 and report.workers.pids_seen == 4
    assert report.workers.peak_bytes > 0
    assert report.workers.per_worker and all(w["pss_peak"] > 0 and w["uss_peak"] > 0 for w in report.workers.per_worker)
    assert torchmem_magic.last_report() is report


def test_very_fast_steps_are_thinned_but_counted_exactly() -> None:
    """At thousands of steps/s the step sample would cost >0.3% of a step: every k-th step is sampled."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 4)
    session = MemwatchSession(SessionOptions(100))
    with session:
        for _ in range(5000):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    steps = list(session.timeline.by_step.column("step"))
    assert session.report is not None and session.report.steps == 5000
    assert session.step_counter.sampling.stride > 1 and 12 <= len(steps) < 1000
    early = sum(1 for s in steps if s <= 64)
    assert early / 64 > 4 * (len(steps) - early) / (5000 - 64)  # dense start, for an early verdict
    assert steps == sorted(set(steps)) and steps[:2] == [1.0, 2.0]


def test_slow_steps_are_all_sampled() -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    session = MemwatchSession(SessionOptions(100))
    with session:
        for _ in range(12):
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            time.sleep(0.05)  # a 50 ms step: sampling it costs far below the budget
    # every step, then the reading after the block at the last one
    assert list(session.timeline.by_step.column("step")) == [*(float(s) for s in range(1, 13)), 12.0]


DEATH = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible ...")


@pytest.mark.parametrize("where", ["the sampler's join", "the run's end time", "the probes' close"])
@pytest.mark.parametrize("ended_by", ["the death", "what the loop saw of it", "nothing"])
def test_a_worker_death_raised_into_teardown_neither_loses_the_report_nor_the_error(
    monkeypatch: pytest.MonkeyPatch, ended_by: str, where: str
) -> None:
    """torch's SIGCHLD handler raises into whatever runs when a worker dies: the sampler's join, the
    line that notes the run's end, the closing of the /proc readers after the report is made but
    before it is stored."""
    from torchmem_magic.probes.bundle import ProbeBundle
    from torchmem_magic.tracing.sampler import Sampler
    from torchmem_magic.tracing.steps import RunTime

    owner, name = {"the sampler's join": (Sampler, "stop"), "the run's end time": (RunTime, "end"),
                   "the probes' close": (ProbeBundle, "close")}[where]
    real = getattr(owner, name)
    raised = []

    def interrupted(self: Any, *args: Any) -> None:
        real(self, *args)
        if not raised:
            raised.append(True)
            raise DEATH

    monkeypatch.setattr(owner, name, interrupted)
    session = MemwatchSession(SessionOptions(10)).start()
    if ended_by == "the death":
        report = session.stop(DEATH)  # the loop already failed with it: the report explains it, no re-raise
    else:
        seen = ConnectionResetError(104, "Connection reset by peer") if ended_by != "nothing" else None
        with pytest.raises(RuntimeError, match="DataLoader worker") as raised_death:
            session.stop(seen)  # raised once the report exists, chained to what the loop saw
        assert raised_death.value.__cause__ is seen
        report = session.report
    assert report is not None and last_report() is report and _sampler_threads() == 0
    if where != "the probes' close":  # a death after the report was made is raised, not written into it
        assert report.status == "error" and "pid 4242" in (report.error or "")
    with memwatch(10, quiet=True):  # the registry was released: a new session starts
        pass


def test_requested_actions_run_at_a_step_and_their_failures_stay_out_of_the_loop() -> None:
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ran_at: list[int] = []

    def broken() -> None:
        raise ValueError("a button's action failed")

    def dying() -> None:  # as if torch's SIGCHLD handler fired while the action ran
        raise RuntimeError("DataLoader worker (pid 4243) is killed by signal: Killed.")

    session = MemwatchSession(SessionOptions(10))
    with pytest.raises(RuntimeError, match="pid 4243"):
        with session:
            for step in range(1, 50):
                if step == 5:
                    session.requests.request(lambda: ran_at.append(session.steps))
                    session.requests.request(broken)
                if step == 20:
                    session.requests.request(dying)
                _step(model, optimizer)
    assert ran_at == [5]  # at the step boundary after the request
    assert "a button's action failed" in (session._hooks.errors.last)  # kept, not raised
    assert session.report is not None and session.report.steps == 20 and session.report.status == "error"


def test_an_interrupt_during_the_scan_before_the_run_leaves_nothing_behind() -> None:
    import glob
    import os
    import tempfile
    import threading

    from torchmem_magic.session.run import active_session

    def interrupted_roots() -> list[object]:
        raise KeyboardInterrupt

    pattern = os.path.join(tempfile.gettempdir(), f"torchmem_magic-{os.getpid()}-*")
    threads = set(threading.enumerate())
    with pytest.raises(KeyboardInterrupt):
        MemwatchSession(SessionOptions(10), search=LeakSearch(interrupted_roots)).start()
    assert glob.glob(pattern) == []  # the ranks' socket and its directory are gone
    assert set(threading.enumerate()) == threads and active_session() is None
    with memwatch(10, quiet=True, scan=False) as w:
        pass
    assert w.report is not None and w.report.status == "ok"


def test_listeners_get_a_read_only_view_of_the_run_not_the_session() -> None:
    """The live figure, a rank's stream, the recorder and the guard read the run through a LiveView:
    what it offers reads, and nothing on it starts, stops, steps or queues anything."""
    from torchmem_magic.session.live_view import LiveView

    seen: list[object] = []

    class Recording:
        tick_period_s, tick_cpu_share = 0.01, None

        def on_tick(self, view: LiveView) -> None:
            seen.append(view)

        def on_finish(self, view: LiveView, report: object) -> None:
            seen.append((view, report))

    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemwatchSession(SessionOptions(10), listener=Recording()) as session:
        for _ in range(5):
            _step(model, optimizer)
            time.sleep(0.02)
    views = {id(v if isinstance(v, LiveView) else v[0]) for v in seen}  # type: ignore[index]
    assert len(views) == 1 and isinstance(seen[0], LiveView) and seen[-1] == (session.view, session.report)
    view = session.view
    assert view is not None and view.steps == 5 and view.clock == "optimizer" and view.report is session.report
    public = {name for name in dir(LiveView) if not name.startswith("_")}
    assert not public & {"start", "stop", "tick", "request", "request_stop", "raise_at_step", "requests", "pass_started"}
    with pytest.raises(AttributeError):
        view.timeline = None  # type: ignore[misc]
