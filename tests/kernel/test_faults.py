"""Interrupts that land inside %%memwatch itself, in a real kernel (what bench/faults.py found)."""

from __future__ import annotations

import re

import pytest
from kernel_client import Kernel

pytestmark = [pytest.mark.kernel]

ANSI = re.compile(r"\x1b\[[0-9;]*m")

# a SIGINT landing in the start's or the end's leak-finder scan, made deterministic: the n-th scan raises it
# (the start's and the end's scans go through the cells' scan memo)
INTERRUPT_SCAN = """\
import torchmem_magic.finder.scan.memo as _tm_memo
_tm_real_scan = _tm_memo.scan_roots
_tm_calls = []
def _tm_interrupted_scan(roots, budget=None, seen=(), _on_call={on_call}):
    _tm_calls.append(1)
    if len(_tm_calls) == _on_call:
        raise KeyboardInterrupt
    return _tm_real_scan(roots, budget, seen)
_tm_memo.scan_roots = _tm_interrupted_scan
"""
RESTORE = "_tm_memo.scan_roots = _tm_real_scan"
LEFT = (
    "[__import__('glob').glob(__import__('os').path.join(__import__('tempfile').gettempdir(), "
    "f\"torchmem_magic-{__import__('os').getpid()}-*\")), torchmem_magic.tracing.hooks.installed_hook_count(), "
    "torchmem_magic.session.run.active_session() is None]"
)
PROBE = "import weakref, gc\nprobe = torch.ones(1 << 16); probe_ref = weakref.ref(probe)"
PROBE_DIES = "(exec('del probe'), gc.collect(), probe_ref() is None)[2]"


def test_interrupted_while_memwatch_starts_says_so_in_one_line_and_leaves_nothing(kernel: Kernel) -> None:
    kernel.ok(PROBE)
    kernel.ok(INTERRUPT_SCAN.format(on_call=1))
    try:
        execution = kernel.execute("%%memwatch\nstart_body_ran = 1\n")
    finally:
        kernel.ok(RESTORE)
    assert execution.status == "error" and execution.error["ename"] == "KeyboardInterrupt"
    assert "torchmem_magic: interrupted before the cell ran" in execution.stderr
    assert "scan_roots" not in ANSI.sub("", "\n".join(execution.error["traceback"]))  # no internals shown
    assert kernel.value("'start_body_ran' in globals()") is False
    assert kernel.value(LEFT) == [[], 0, True]
    assert kernel.value(PROBE_DIES) is True  # sys.last_traceback holds no frame of the interrupted scan
    kernel.ok("%%memwatch -q\nx = 1")


def test_interrupted_while_the_report_is_made_still_shows_it(kernel: Kernel) -> None:
    kernel.ok(PROBE)
    kernel.ok(INTERRUPT_SCAN.format(on_call=2))
    try:
        execution = kernel.execute("%%memwatch --no-plot\nbody_ran = 2\n")
    finally:
        kernel.ok(RESTORE)
    assert execution.status == "error" and execution.error["ename"] == "KeyboardInterrupt"
    assert "memwatch: interrupted" in execution.stdout
    assert kernel.value("torchmem_magic.last_report().status") == "interrupted"
    assert kernel.value("body_ran") == 2
    assert kernel.value(LEFT) == [[], 0, True]
    assert kernel.value(PROBE_DIES) is True
    assert kernel.ok("%%memwatch --no-plot\nx = 1").stdout.startswith("memwatch: ok")


def test_interrupted_while_the_live_figure_is_made_says_so_in_one_line(kernel: Kernel) -> None:
    kernel.ok(
        "from torchmem_magic.widgets.live import LiveFigure as _TmLiveFigure\n"
        "_tm_real_bundle = _TmLiveFigure.widget_bundle\n"
        "def _tm_interrupted_bundle(self):\n"
        "    raise KeyboardInterrupt  # as a SIGINT landing while the widgets are made\n"
        "_TmLiveFigure.widget_bundle = _tm_interrupted_bundle\n"
    )
    try:
        execution = kernel.execute("%%memwatch\nfigure_body_ran = 3\n")
    finally:
        kernel.ok("_TmLiveFigure.widget_bundle = _tm_real_bundle")
    assert execution.status == "error" and execution.error["ename"] == "KeyboardInterrupt"
    assert "torchmem_magic: interrupted before the cell ran" in execution.stderr
    assert kernel.value("'figure_body_ran' in globals()") is False
    assert kernel.value(LEFT) == [[], 0, True]
    kernel.ok("%%memwatch -q\nx = 1")


def test_a_second_interrupt_while_the_report_is_displayed_does_not_lose_it(kernel: Kernel) -> None:
    """Seen with two SIGINTs close together: the second landed in display() (ipykernel flushing stdout)."""
    kernel.ok(
        "import torchmem_magic.frontends.magics as _tm_magics\n"
        "_tm_real_display = _tm_magics.display\n"
        "_tm_displays = []\n"
        "def _tm_interrupted_display(obj, **kw):\n"
        "    if isinstance(obj, torchmem_magic.Report) and not _tm_displays:\n"
        "        _tm_displays.append(1)\n"
        "        raise KeyboardInterrupt\n"
        "    return _tm_real_display(obj, **kw)\n"
        "_tm_magics.display = _tm_interrupted_display\n"
    )
    try:
        execution = kernel.execute(
            "%%memwatch\nmodel = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for i in range(5):\n    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()\n"
            "raise KeyboardInterrupt  # the first interrupt, in the loop\n"
        )
    finally:
        kernel.ok("_tm_magics.display = _tm_real_display")
    assert execution.status == "error" and execution.error["ename"] == "KeyboardInterrupt"
    shown = [m for m in execution.of_type("display_data") if "memwatch: interrupted" in m["content"]["data"].get("text/plain", "")]
    assert shown, "the report was not shown"
    assert kernel.value(LEFT) == [[], 0, True]


def test_a_worker_death_raised_before_stop_begins_still_stops_the_session(kernel: Kernel) -> None:
    """Seen with a SIGKILLed DataLoader worker: torch's SIGCHLD handler raised its death while the magic
    checked `session.running` after the loop's own error; the session never stopped (thread and hooks
    left, every later %%memwatch refused as nested)."""
    kernel.ok(
        "import threading, torchmem_magic.session.run as _tm_s\n"
        "_tm_real_running = _tm_s.MemwatchSession.running\n"
        "_tm_raised = []\n"
        "def _tm_running(self):\n"
        "    if not _tm_raised and self.report is None and threading.current_thread() is threading.main_thread():\n"
        "        _tm_raised.append(1)\n"
        "        raise RuntimeError('DataLoader worker (pid 4242) is killed by signal: Killed. ')\n"
        "    return _tm_real_running.fget(self)\n"
        "_tm_s.MemwatchSession.running = property(_tm_running)\n"
    )
    try:
        execution = kernel.execute("%%memwatch --no-plot\nraise ConnectionResetError(104, 'Connection reset by peer')\n")
    finally:
        kernel.ok("_tm_s.MemwatchSession.running = _tm_real_running")
    assert execution.status == "error"
    assert "memwatch: failed" in execution.stdout  # the report was shown
    assert kernel.value("torchmem_magic.last_report().status") == "error"
    assert kernel.value(LEFT) == [[], 0, True]
    assert kernel.value("[t.name for t in threading.enumerate() if 'torchmem' in t.name]") == []
    assert kernel.ok("%%memwatch --no-plot\nx = 1").stdout.startswith("memwatch: ok")


# a SIGINT that comes after the cell's code is over, while ipykernel assembles the reply (it reads the
# payloads after IPython's run_cell returned): armed by the cell, sent by ipykernel's own call
LATE_INTERRUPT = """\
_tm_late = {"armed": False}
def _tm_arm_late_interrupt():
    import os, signal
    manager = get_ipython().payload_manager
    namespace = {"os": os, "signal": signal, "real": manager.read_payload, "state": _tm_late}
    exec("def read_payload():\\n"
         "    if state['armed']:\\n"
         "        state['armed'] = False\\n"
         "        os.kill(os.getpid(), signal.SIGINT)\\n"
         "        for _ in range(1000): pass  # the handler runs here, in ipykernel's call\\n"
         "    return real()\\n", namespace)
    manager.read_payload = namespace["read_payload"]
_tm_arm_late_interrupt()
"""


def test_a_ctrl_c_just_after_the_cell_ended_does_not_lose_its_reply(kernel: Kernel) -> None:
    """Seen in the campaign (report_interrupt, double_interrupt): the SIGINT landed in ipykernel's code
    after the cell, which logged "KeyboardInterrupt caught in kernel" and never sent the reply."""
    kernel.ok(LATE_INTERRUPT)
    try:
        execution = kernel.execute("%%memwatch --no-plot\n_tm_late['armed'] = True\n", timeout_s=60)
    finally:
        kernel.ok("del get_ipython().payload_manager.read_payload")
    assert execution.status == "ok" and "memwatch: ok" in execution.stdout
    assert kernel.value("_tm_late['armed']") is False  # the interrupt was sent
    assert kernel.value("repr(__import__('signal').getsignal(2))").startswith("<built-in function default_int_handler")
    assert kernel.ok("%%memwatch --no-plot\nx = 1").stdout.startswith("memwatch: ok")


# a cut that lands at the very start of the end (as a signal's exception can at the first line of a function,
# before any `try` of it): the first call of MemwatchMagics.{method} raises {cut} instead
CUT_ON_FIRST_CALL = """\
import torchmem_magic.frontends.magics as _tm_magics
_tm_real = _tm_magics.MemwatchMagics.{method}
_tm_cut_calls = []
def _tm_cut_on_first_call(self, *args, **kwargs):
    if not _tm_cut_calls:
        _tm_cut_calls.append(1)
        raise {cut}
    return _tm_real(self, *args, **kwargs)
_tm_magics.MemwatchMagics.{method} = _tm_cut_on_first_call
"""


@pytest.mark.parametrize("body", ["raise KeyboardInterrupt  # the first Ctrl-C, in the loop", "x = 1  # the body ended"])
def test_a_ctrl_c_before_the_stop_began_still_stops_the_session_and_reports(kernel: Kernel, body: str) -> None:
    """Seen in the campaign (double_interrupt): the second SIGINT landed on the first line of the magic's
    `except` block, before the stop began; the session stayed active and every later cell was refused."""
    kernel.ok(CUT_ON_FIRST_CALL.format(method="_stop_and_show", cut="KeyboardInterrupt"))
    try:
        execution = kernel.execute(f"%%memwatch --no-plot\n{body}\n")
    finally:
        kernel.ok("_tm_magics.MemwatchMagics._stop_and_show = _tm_real")
    assert execution.status == "error" and execution.error is not None and execution.error["ename"] == "KeyboardInterrupt"
    assert "memwatch: interrupted" in execution.stdout
    assert kernel.value(LEFT) == [[], 0, True]
    assert kernel.ok("%%memwatch --no-plot\nx = 1").stdout.startswith("memwatch: ok")


# a second worker's death (a full /dev/shm kills the workers one after another) at the magic's end's first line
DEATH = "RuntimeError('DataLoader worker (pid(s) 4243) exited unexpectedly')"


@pytest.mark.parametrize(
    ("body", "ename", "headline"),
    [
        pytest.param("raise ConnectionResetError(104, 'Connection reset by peer')  # the loop saw the first death",
                     "ConnectionResetError", "memwatch: failed", id="the-body-raised"),
        pytest.param("x = 1  # the body ended", "RuntimeError", "memwatch: failed", id="the-body-ended"),
    ],
)
def test_a_worker_death_before_the_end_began_still_stops_the_session_and_reports(
    kernel: Kernel, body: str, ename: str, headline: str
) -> None:
    """Once in a full run: the full-/dev/shm cell failed, and `last_report()` was None afterwards."""
    kernel.ok(CUT_ON_FIRST_CALL.format(method="_end", cut=DEATH))
    try:
        execution = kernel.execute(f"%%memwatch --no-plot\n{body}\n")
    finally:
        kernel.ok("_tm_magics.MemwatchMagics._end = _tm_real")
    assert kernel.value("_tm_cut_calls") == [1]  # the death was raised
    assert execution.status == "error" and execution.error is not None and execution.error["ename"] == ename
    assert headline in execution.stdout
    assert kernel.value("torchmem_magic.last_report().status") == "error"
    assert kernel.value(LEFT) == [[], 0, True]
    assert kernel.ok("%%memwatch --no-plot\nx = 1").stdout.startswith("memwatch: ok")
