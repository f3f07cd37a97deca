"""A KeyboardInterrupt that lands inside memwatch itself (its start, its teardown, its end-of-run scan):
the fault campaign's findings (bench/faults.py), each pinned here without a kernel."""

from __future__ import annotations

import gc
import glob
import os
import tempfile
import threading
import weakref
from typing import Any

import pytest
import torch

import torchmem_magic.finder.scan.memo as memo_module
from torchmem_magic import MemwatchSession, last_report, memwatch
from torchmem_magic.tracing.hooks import installed_hook_count
from torchmem_magic.tracing.sampler import THREAD_NAME, Sampler
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.session.run import active_session
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.finder.leak_finder import LeakSearch


def _left_behind() -> list[Any]:
    threads = [t.name for t in threading.enumerate() if t.name == THREAD_NAME]
    temp = glob.glob(os.path.join(tempfile.gettempdir(), f"torchmem_magic-{os.getpid()}-*"))
    return [*threads, *temp, *(["hooks"] if installed_hook_count() else []), *(["active"] if active_session() else [])]


def _interrupt_scan(monkeypatch: pytest.MonkeyPatch, on_call: int) -> None:
    """The `on_call`-th scan (1: the start's, 2: the end's) is interrupted while it holds the roots."""
    real = memo_module.scan_roots  # the start's and the end's scans go through the cells' scan memo
    calls = []

    def scan_roots(roots: list[Root], budget: Any = None, seen: Any = ()) -> Any:
        calls.append(1)
        if len(calls) == on_call:
            raise KeyboardInterrupt  # as a SIGINT would, with `roots` (the user's objects) in this frame
        return real(roots, budget, seen)

    monkeypatch.setattr(memo_module, "scan_roots", scan_roots)


def test_an_interrupt_during_the_end_scan_still_gives_the_report_then_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupt_scan(monkeypatch, on_call=2)
    big = torch.ones(1 << 16)
    session = MemwatchSession(SessionOptions(10), search=LeakSearch(lambda: [Root("big", "user", "big", big)])).start()
    with pytest.raises(KeyboardInterrupt) as raised:
        session.stop()  # the block had ended by itself
    report = session.report
    assert report is not None and last_report() is report
    assert report.status == "interrupted" and report.suspects == ()
    assert _left_behind() == []
    # the raised interrupt (IPython keeps it as sys.last_traceback) holds no frame of the interrupted scan
    ref = weakref.ref(big)
    del big, session
    gc.collect()
    assert ref() is None, "the interrupt's traceback keeps the scan's roots alive"
    assert raised.value is not None


def test_an_interrupt_during_the_end_scan_after_an_error_keeps_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupt_scan(monkeypatch, on_call=2)
    session = MemwatchSession(SessionOptions(10), search=LeakSearch(lambda: [])).start()
    try:
        report = session.stop(ValueError("the loop failed"))  # the block's own error is what the cell raises
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped stop() without a report")
    assert report.status == "error" and "the loop failed" in (report.error or "")
    assert _left_behind() == []


def test_an_interrupt_during_the_start_scan_leaves_no_socket_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupt_scan(monkeypatch, on_call=1)
    session = MemwatchSession(SessionOptions(10), search=LeakSearch(lambda: []))
    with pytest.raises(KeyboardInterrupt):
        session.start()
    assert not session.running
    assert _left_behind() == []
    with memwatch(10, quiet=True):
        pass


def test_an_interrupt_while_the_sampler_is_joined_releases_the_session_and_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    real_stop = Sampler.stop
    interrupted = []

    def stop(self: Sampler, timeout_s: float = 10.0) -> None:
        if not interrupted:  # the first join is interrupted (the thread was told to stop)
            interrupted.append(True)
            self._stop.set()
            raise KeyboardInterrupt
        real_stop(self, timeout_s)

    monkeypatch.setattr(Sampler, "stop", stop)
    session = MemwatchSession(SessionOptions(10)).start()
    with pytest.raises(KeyboardInterrupt):
        session.stop()
    assert session.report is not None and session.report.status == "interrupted"
    assert _left_behind() == []
    with memwatch(10, quiet=True):  # not wedged as "another session is running"
        pass


def test_an_interrupt_during_a_mid_run_holder_scan_keeps_no_user_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder scans run on the training thread, so a SIGINT in the loop can land in one; the raised
    interrupt is kept by IPython (sys.last_traceback) and must not hold the scan's roots."""
    import torchmem_magic.finder.holder_tracking as tracking

    def scan_roots(roots: list[Root], budget: Any = None, **_: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(tracking, "scan_roots", scan_roots)
    _an_interrupted_scan_keeps_nothing()


def test_a_second_interrupt_while_the_sources_close_neither_loses_the_report_nor_leaves_the_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen with two SIGINTs close together: the second landed in the ranks' socket directory's rmtree."""
    from torchmem_magic.stream.transport import RankSink

    real_close = RankSink.close
    interrupted = []

    def close(self: RankSink) -> None:
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        real_close(self)

    monkeypatch.setattr(RankSink, "close", close)
    session = MemwatchSession(SessionOptions(10)).start()
    try:
        report = session.stop(KeyboardInterrupt())  # the first interrupt ended the loop; the cell raises it
    except KeyboardInterrupt:
        pytest.fail("the second interrupt escaped stop()")
    assert report.status == "interrupted" and last_report() is report
    assert _left_behind() == []


class _KernelShell:
    """What `drop_late_interrupts` reads of a kernel's shell: that it has a kernel, and the user's namespace."""

    def __init__(self) -> None:
        self.kernel = object()
        self.user_global_ns: dict[str, Any] = {}


def test_a_ctrl_c_after_the_cell_ended_is_dropped_and_one_during_user_code_still_interrupts() -> None:
    """Seen in the campaign (report_interrupt, double_interrupt): a SIGINT after the cell magic returned
    landed in ipykernel's own code, which caught it and never sent the cell's reply."""
    import signal

    from torchmem_magic.frontends import late_interrupts

    shell = _KernelShell()
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)  # as ipykernel sets it for a request
    try:
        assert late_interrupts.drop_late_interrupts(shell)
        dropped = late_interrupts.dropped
        signal.raise_signal(signal.SIGINT)  # the cell is over: no frame of the user's is running
        assert late_interrupts.dropped == dropped + 1
        shell.user_global_ns["raise_signal"] = signal.raise_signal
        # a cell that ran %%memwatch through run_cell goes on. Compiled first: a KeyboardInterrupt out of
        # exec() of a string sets CPython's "unhandled KeyboardInterrupt" flag, and a process that ends
        # with it set kills itself with SIGINT (pytest's exit status became 130)
        cell = compile("raise_signal(2)\nfor _ in range(10): pass\n", "<cell>", "exec")
        with pytest.raises(KeyboardInterrupt):
            exec(cell, shell.user_global_ns)
        assert not late_interrupts.drop_late_interrupts(shell)  # installed once, over the default handler only
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert not late_interrupts.drop_late_interrupts(object())  # no kernel: terminal IPython keeps its own
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, saved)


def test_an_interrupt_as_the_optimizer_puts_grad_mode_back_leaves_it_as_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in the campaign (loop_interrupt): the SIGINT landed in the `finally` of torch's step wrapper,
    which left autograd off, and every later cell's backward() failed."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    real = torch.set_grad_enabled
    calls: list[bool] = []

    def set_grad_enabled(mode: bool) -> Any:
        calls.append(mode)
        if len(calls) == 2:  # the step's `finally`, putting the caller's mode back
            raise KeyboardInterrupt
        return real(mode)

    session = MemwatchSession(SessionOptions(10)).start()
    try:
        monkeypatch.setattr(torch, "set_grad_enabled", set_grad_enabled)
        with pytest.raises(KeyboardInterrupt) as raised:
            optimizer.step()
        monkeypatch.undo()
        assert not torch.is_grad_enabled()  # what torch left behind
        report = session.stop(raised.value)
        assert report.status == "interrupted"
        assert torch.is_grad_enabled()
    finally:
        real(True)
        session.stop()


def test_an_interrupt_while_a_holder_scan_files_its_results_keeps_no_user_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in the campaign (loop_interrupt): the SIGINT landed after the scan itself, while its results were
    filed (the scanned roots still in the frame)."""
    import torchmem_magic.finder.holder_tracking as tracking

    def record(self: Any, step: int, measured: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tracking.HolderTracker, "_record", record)
    _an_interrupted_scan_keeps_nothing()


def _an_interrupted_scan_keeps_nothing() -> None:
    """A scan that a KeyboardInterrupt cut short: the interrupt's traceback must not keep what it scanned."""
    import torchmem_magic.finder.holder_tracking as tracking

    kept = [torch.ones(1 << 16)]
    tracker = tracking.HolderTracker(lambda: [Root("kept", "user", "kept", kept)])
    with pytest.raises(KeyboardInterrupt) as raised:
        tracker.scan(1)
    ref = weakref.ref(kept[0])
    del kept
    gc.collect()
    assert ref() is None, "the interrupt's traceback keeps the scanned objects alive"
    assert raised.value is not None


def test_a_sampler_whose_start_was_interrupted_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in the fault campaign: the Ctrl-C landed in Thread.start() before the thread said it runs;
    joining it raised RuntimeError, and the session's teardown stopped there (its temp directory, the
    environment and the flight recorder's SIGTERM handler stayed)."""
    from torchmem_magic.core.timeline import Timeline

    def interrupted_start(self: threading.Thread) -> None:
        raise KeyboardInterrupt

    sampler = Sampler(dict, Timeline().by_time, 0.01)
    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    with pytest.raises(KeyboardInterrupt):
        sampler.start()
    monkeypatch.undo()
    sampler.stop()  # no RuntimeError
    assert not sampler.alive


def test_a_close_cut_short_after_the_descriptor_closed_is_repeated_without_closing_it_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen in the fault campaign: the Ctrl-C landed just after os.close() in a reader's close, and the
    teardown's repeat closed the same number again (OSError: the rest of the teardown was skipped)."""
    from torchmem_magic.probes.process import RssReader

    reader = RssReader(os.getpid())
    real_close = os.close

    def close_then_interrupt(fd: int) -> None:
        real_close(fd)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "close", close_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        reader.close()
    monkeypatch.undo()
    reader.close()  # no OSError (EBADF), and no other file's descriptor closed


@pytest.mark.parametrize(
    "cut", [KeyboardInterrupt(), RuntimeError("DataLoader worker (pid 4242) is killed by signal: Bus error. ")],
    ids=["ctrl-c", "worker-death"],
)
@pytest.mark.parametrize("body_raises", [True, False], ids=["the-body-raised", "the-body-ended"])
def test_a_cut_at_the_first_line_of_stop_still_ends_the_block_with_its_report(
    monkeypatch: pytest.MonkeyPatch, cut: BaseException, body_raises: bool
) -> None:
    """A Ctrl-C, or a second worker's death raised by torch's SIGCHLD handler, landing at stop()'s first
    line (before its `try`): `with memwatch()` stops again, so no session stays active."""
    real_stop = MemwatchSession.stop
    cuts = []

    def stop(self: MemwatchSession, exc: BaseException | None = None) -> Any:
        if not cuts:
            cuts.append(1)
            raise cut
        return real_stop(self, exc)

    monkeypatch.setattr(MemwatchSession, "stop", stop)
    with pytest.raises((type(cut), ConnectionResetError)) as raised:
        with memwatch(10, quiet=True) as session:
            if body_raises:
                raise ConnectionResetError(104, "Connection reset by peer")
    assert cuts == [1]
    assert raised.type is (ConnectionResetError if body_raises else type(cut))
    assert session.report is not None and last_report() is session.report
    assert _left_behind() == []
