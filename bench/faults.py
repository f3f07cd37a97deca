"""Fault campaign: each fault many times in a real kernel, both cores busy, and what the tool left behind.

Run: python bench/faults.py            (30 runs of every fault; ~40 min on a 2-core machine)
     python bench/faults.py --only report_interrupt   (reruns one fault; its row in docs/faults.md is replaced)
     python bench/faults.py --runs 3 --only loop_interrupt,exception --no-write

Each run: a tensor made before the cell (`probe`), the fault cell (which makes `cell_tensor` first), then
one check cell in the same kernel: the report was shown (or a clear one-line message), its status is the
expected one, no sampler thread is alive, torch's global hook tables and the patched classes are as they
were, no session is active, no `torchmem_magic-<pid>-*` temp directory is left, the environment, the
signal handlers, the collector's settings and sys.stdout/stderr are unchanged, both tensors die once
their names are deleted; then a plain `%%memwatch` training cell must give an ok report. The kernel
killed mid-run is a campaign of its own (`KernelKillCampaign`: a new kernel each run, its flight record read
back). Two processes spinning `while True: pass` keep both cores busy throughout (started and killed here).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kernel"))

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402
from kernel_client import SETUP, Execution  # noqa: E402

#: the docs page whose table, between `<!-- faults:start -->` and `<!-- faults:end -->`, this campaign rewrites
PAGE = ROOT / "docs" / "faults.md"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SMALL_SHM = Path(tempfile.gettempdir()) / "torchmem-faults-shm"
#: flight-record directories on a full 64 KiB tmpfs and on a read-only one (mounted by `mount_record_dirs`)
FULL_RECORDS = Path(tempfile.gettempdir()) / "torchmem-faults-records-full"
READ_ONLY_RECORDS = Path(tempfile.gettempdir()) / "torchmem-faults-records-ro"

# ---------------------------------------------------------------------------------------------- the kernel


class FaultKernel:
    """An ipykernel driven as tests/kernel/kernel_client.Kernel drives it; `argv_prefix` wraps the
    interpreter (a private mount namespace with a small /dev/shm)."""

    def __init__(self, argv_prefix: list[str] | None = None) -> None:
        self._spec_dir = tempfile.TemporaryDirectory(prefix="torchmem-faults-kernelspec-")
        spec = Path(self._spec_dir.name) / "faults"
        spec.mkdir()
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [*(argv_prefix or []), *argv], "display_name": "faults", "language": "python",
        }))
        self.km = KernelManager(kernel_name="faults", kernel_spec_manager=KernelSpecManager(kernel_dirs=[self._spec_dir.name]))
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        #: where the kernel's threads' stacks go on SIGUSR1 (`stacks()`: where a stuck kernel is stuck)
        self.stacks_path = Path(self._spec_dir.name) / "stacks.txt"
        self.current = Execution(reply={})  # the execution `execute` is collecting
        self._subshell: str | None = None

    def subshell(self) -> str:
        """A subshell of the kernel (ipykernel 7): its comm messages are handled while a cell runs."""
        if self._subshell is None:
            msg = self.kc.session.msg("create_subshell_request", {})
            self.kc.control_channel.send(msg)
            deadline = time.monotonic() + 30
            while self._subshell is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("no create_subshell_reply")
                reply = self.kc.get_control_msg(timeout=30)
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    self._subshell = str(reply["content"]["subshell_id"])
        return self._subshell

    def close_comms(self, comm_ids: list[str]) -> None:
        """Close comms from the front end's side, as a page reload or a closed tab leaves them."""
        for comm_id in comm_ids:
            msg = self.kc.session.msg("comm_close", {"comm_id": comm_id, "data": {}})
            msg["header"]["subshell_id"] = self.subshell()
            self.kc.shell_channel.send(msg)

    @property
    def pid(self) -> int:
        return int(self.km.provisioner.process.pid)  # type: ignore[union-attr]

    def arm_stacks(self) -> None:
        """Make SIGUSR1 dump every thread's stack into `stacks_path` (faulthandler: works while the main
        thread is blocked in a lock or a join, where no Python code of the kernel runs)."""
        self.ok("import faulthandler as _fh, signal as _sg\n"
                f"_fh.register(_sg.SIGUSR1, file=open({str(self.stacks_path)!r}, 'w'), all_threads=True)\n"
                # where a KeyboardInterrupt that ipykernel caught itself landed (its log line has no traceback)
                "_lg = get_ipython().kernel.log; _lg.error = (lambda m, *a, _e=_lg.error, **kw: _e(m, *a, **("
                "dict(kw, exc_info=True) if 'KeyboardInterrupt' in str(m) else kw)))\n"
                "del _fh, _sg, _lg")

    def stacks(self) -> str:
        """The kernel's threads' stacks now ('' when it is dead or was not armed)."""
        try:
            os.kill(self.pid, signal.SIGUSR1)
        except (ProcessLookupError, AttributeError):
            return ""
        time.sleep(1.0)
        try:
            return self.stacks_path.read_text()
        except OSError:
            return ""

    def execute(
        self, code: str, timeout_s: float = 180.0, at: list[tuple[float, Callable[[], None]]] | None = None,
        trigger: str | None = None, on_text: Callable[[str, float], list[tuple[float, Callable[[], None]]]] | None = None,
        store_history: bool = True,
    ) -> tuple[Execution, dict[str, float]]:
        """Run `code`; actions run at (seconds after the request) or, once `trigger` appears in the cell's
        stdout, at the times `on_text(stdout so far, now)` returns (absolute monotonic). Returns the
        execution and when things happened (relative seconds: 'reply', 'trigger', each stdout marker)."""
        sent = time.monotonic()
        msg_id = self.kc.execute(code, store_history=store_history)
        deadline = sent + timeout_s
        pending = sorted(((sent + t, f) for t, f in (at or [])), key=lambda p: p[0])
        execution = self.current = Execution(reply={})
        times: dict[str, float] = {}
        stdout = ""
        idle = False
        while not (idle and execution.reply):
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"kernel did not finish within {timeout_s}s")
            while pending and now >= pending[0][0]:
                action = pending.pop(0)[1]
                if not execution.reply:  # a SIGINT to a kernel whose cell is over hits ipykernel itself (it
                    action()  # can hang there, "KeyboardInterrupt caught in kernel"): not a fault of the cell
            try:
                msg = self.kc.get_iopub_msg(timeout=0.005)
            except queue.Empty:
                msg = None
            if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                execution.iopub.append(msg)
                if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                    stdout += msg["content"]["text"]
                    for marker in re.findall(r"^([A-Z][A-Z ]+[A-Z])\b", msg["content"]["text"], re.M):
                        times.setdefault(marker, time.monotonic() - sent)
                    if trigger is not None and trigger in stdout and "trigger" not in times and on_text is not None:
                        times["trigger"] = time.monotonic() - sent
                        pending = sorted(pending + on_text(stdout, time.monotonic()), key=lambda p: p[0])
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    idle = True
            if not execution.reply:
                try:
                    reply = self.kc.get_shell_msg(timeout=0)
                except queue.Empty:
                    continue
                if reply["parent_header"].get("msg_id") == msg_id:
                    execution.reply = reply
                    times["reply"] = time.monotonic() - sent
        return execution, times

    def ok(self, code: str, timeout_s: float = 300.0) -> Execution:
        execution, _ = self.execute(code, timeout_s=timeout_s, store_history=False)
        if execution.reply["content"]["status"] != "ok":
            error = execution.error or {}
            raise RuntimeError(f"setup cell failed: {error.get('ename')}: {error.get('evalue')}\n"
                               + ANSI.sub("", "\n".join(error.get("traceback", []))))
        return execution

    def value(self, expr: str, timeout_s: float = 300.0) -> Any:
        execution = self.ok(f"import json as _j; print('@@' + _j.dumps({expr}))", timeout_s=timeout_s)
        line = [l for l in execution.stdout.splitlines() if l.startswith("@@")][-1]
        return json.loads(line[2:])

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        finally:
            self._spec_dir.cleanup()


# ------------------------------------------------------------------------------ what is checked in the kernel

STATE_HELPER = r'''
def _fault_state():
    import gc, glob, hashlib, os, signal, sys, tempfile, threading
    import torch
    import torch.optim.optimizer as _oo
    from torch.nn.modules import module as _mm
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter
    import torchmem_magic.tracing.hooks as _h
    import torchmem_magic.session.run as _s
    patched = {
        "torch.autograd._engine_run_backward": torch.autograd.__dict__["_engine_run_backward"],
        "DataLoader.__iter__": DataLoader.__dict__["__iter__"],
        "_BaseDataLoaderIter.__next__": _BaseDataLoaderIter.__dict__["__next__"],
    }
    tables = {n: len(getattr(_mm, n)) for n in dir(_mm) if n.startswith("_global_") and n.endswith("hooks")}
    tables.update({n: len(getattr(_oo, n)) for n in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")})
    return {
        "sampler threads": sorted(t.name for t in threading.enumerate() if "torchmem" in t.name),
        "hook tables": tables,
        "our hooks": _h.installed_hook_count(),
        "patched": sorted(n for n, f in patched.items() if getattr(f, _h.WRAPPER_MARK, False) or hasattr(f, "__wrapped__")),
        "active session": _s.active_session() is not None,
        "temp dirs": sorted(glob.glob(os.path.join(tempfile.gettempdir(), f"torchmem_magic-{os.getpid()}-*"))),
        "environment": hashlib.sha1(repr(sorted(os.environ.items())).encode()).hexdigest(),
        # torch's DataLoader installs its SIGCHLD handler once per process, for good: not ours
        "signals": [("torch's DataLoader handler" if "_set_SIGCHLD_handler" in repr(h) else repr(h)) for h in
                    map(signal.getsignal, (signal.SIGINT, signal.SIGCHLD, signal.SIGTERM))],
        "gc": [gc.isenabled(), list(gc.get_threshold())],
        "streams": [type(sys.stdout).__name__, type(sys.stderr).__name__],
        "trace": [repr(sys.gettrace()), repr(sys.getprofile())],
    }

def _fault_check():
    import gc, json
    import torchmem_magic
    ns = get_ipython().user_ns
    refs = {n: ns.pop(n) for n in ("probe_ref", "cell_ref") if n in ns}
    for n in ("probe", "cell_tensor"):
        ns.pop(n, None)
    gc.collect()
    report = torchmem_magic.last_report()
    out = {
        "state": _fault_state(),
        "alive": sorted(n for n, r in refs.items() if r() is not None),
        "made": sorted(refs),
        "report": None if report is None else {"status": report.status, "error": report.error, "steps": report.steps,
                                                 "shm": None if report.shm is None else report.shm.to_dict(),
                                                 "advice": list(report.advice),
                                                 "errors": [f"{e.source}: {e.last}" for e in report.source_errors]},
        "flags": {k: ns.get(k) for k in ("body_started", "body_done")},
    }
    for k in ("body_started", "body_done"):
        ns.pop(k, None)
    import torchmem_magic.session.run as _s
    _s._registry.last = None  # the next cell's report must be its own
    return out
'''

WARM_LOADER = (
    "from torch.utils.data import DataLoader as _DL\n"
    "try:\n"
    "    list(_DL(list(range(4)), num_workers=1))\n"
    "except OSError:\n"
    "    pass  # a full /dev/shm: no semaphore for the loader's queues\n"
)

PRE_CELL = "import weakref, torch\nprobe = torch.ones(1 << 16); probe_ref = weakref.ref(probe)\n"

BODY_HEAD = (
    "import time, weakref\n"
    "body_started = True\n"
    "cell_tensor = torch.ones(1 << 16); cell_ref = weakref.ref(cell_tensor)\n"
    "model = torch.nn.Linear(32, 8); opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
)
STEP = "opt.zero_grad(); model(torch.randn(16, 32)).sum().backward(); opt.step()"


def timed_loop(seconds: float, indent: str = "") -> str:
    return (f"{indent}t0 = time.time()\n"
            f"{indent}while time.time() - t0 < {seconds}:\n"
            f"{indent}    {STEP}\n")


NEXT_CELL = (
    "%%memwatch --no-plot --interval 20\n"
    "model = torch.nn.Linear(32, 8); opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "for i in range(30):\n"
    f"    {STEP}\n"
)


# ------------------------------------------------------------------------------------------------ faults


@dataclass
class Run:
    """What one run of a fault saw."""

    failures: list[str] = field(default_factory=list)
    note: str = ""  # where the fault landed ('start', 'loop', ...)
    status: str | None = None


@dataclass
class Fault:
    name: str
    what: str
    cell: str
    expect: Callable[[Run, Execution, dict[str, Any], dict[str, float]], None]
    setup: str = ""
    plan: Callable[["Campaign", random.Random], dict[str, Any]] = lambda c, r: {}
    argv_prefix: list[str] | None = None
    calibrate: bool = False
    timeout_s: float = 180.0
    campaign: Any = None  # a campaign class of its own (None: `Campaign`, one kernel for every run)
    before_each: str = ""  # a cell run before each run (and before the calibration run)
    probe: str = "None"  # an expression evaluated in the kernel after the fault cell: check["probe"]
    calibrate_trigger: str | None = None  # the calibration run notes when this text appeared ('trigger')


def _text_of(execution: Execution) -> str:
    parts = []
    for m in execution.iopub:
        c = m["content"]
        if m["msg_type"] == "stream":
            parts.append(c["text"])
        elif m["msg_type"] in ("display_data", "execute_result"):
            parts.extend(str(v) for k, v in c.get("data", {}).items() if k.startswith("text/"))
    return ANSI.sub("", "\n".join(parts))


def report_shown(execution: Execution) -> bool:
    return "memwatch: " in _text_of(execution)


def one_line_message(execution: Execution) -> bool:
    lines = [l for l in execution.stderr.splitlines() if l.strip()]
    return any(l.startswith(("torchmem_magic:", "%%memwatch:", "UsageError: %%memwatch")) for l in lines)


def ename(execution: Execution) -> str | None:
    """How the cell ended; from the reply too: a second SIGINT while IPython formats the first one's
    traceback leaves a bare 'KeyboardInterrupt' on stderr and no error message."""
    name = (execution.error or {}).get("ename") or execution.reply["content"].get("ename")
    return None if name is None else str(name)


def expect_status(run: Run, execution: Execution, check: dict[str, Any], statuses: tuple[str, ...],
                  enames: tuple[str | None, ...], message_ok: bool = False) -> None:
    report = check["report"]
    shown = report_shown(execution)
    if report is None:
        if not (message_ok and one_line_message(execution)):
            run.failures.append("no report" + ("" if shown else " and none shown"))
    else:
        run.status = report["status"]
        if not shown:
            run.failures.append("report not shown")
        if report["status"] not in statuses:
            run.failures.append(f"status {report['status']!r} (expected {'/'.join(statuses)})")
    if ename(execution) not in enames:
        run.failures.append(f"cell ended with {ename(execution)} (expected {'/'.join(str(e) for e in enames)})")


def interrupt_after(campaign: "Campaign", delays: list[float]) -> Callable[[str, float], list[tuple[float, Callable[[], None]]]]:
    def plan(_: str, now: float) -> list[tuple[float, Callable[[], None]]]:
        return [(now + d, campaign.kernel.interrupt) for d in delays]
    return plan


def _loop_interrupt_plan(c: "Campaign", rng: random.Random) -> dict[str, Any]:
    return {"trigger": "LOOP START", "on_text": interrupt_after(c, [rng.uniform(0.0, 2.0)])}


def _double_interrupt_plan(c: "Campaign", rng: random.Random) -> dict[str, Any]:
    first = rng.uniform(0.0, 1.5)
    return {"trigger": "LOOP START", "on_text": interrupt_after(c, [first, first + rng.uniform(0.005, 0.3)])}


VICTIM: dict[str, int] = {}  # the worker the last run killed


def _kill_worker_plan(c: "Campaign", rng: random.Random) -> dict[str, Any]:
    delay = rng.uniform(0.1, 1.5)

    def plan(stdout: str, now: float) -> list[tuple[float, Callable[[], None]]]:
        found = re.search(r"WORKERS ([\d ]+)", stdout)
        assert found is not None, "the plan runs once the cell printed its workers"
        pids = [int(p) for p in found.group(1).split()]
        victim = VICTIM["pid"] = rng.choice(pids)

        def kill() -> None:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return [(now + delay, kill)]

    return {"trigger": "WORKERS", "on_text": plan}


def expect_loop_interrupt(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    run.note = "loop" if "LOOP END" not in t else "after loop"
    expect_status(run, e, check, ("interrupted",), ("KeyboardInterrupt",))


def expect_start_interrupt(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    started = bool(check["flags"]["body_started"])
    run.note = "body" if started else "start"
    if not check["probe"]:  # the start ended before the drawn moment: no SIGINT at all
        run.note = "not sent (it ended first)"
        expect_status(run, e, check, ("ok",), (None,))
    elif check["flags"]["body_done"]:  # a cell quicker than the calibration run: it came after the body
        run.note = "missed (after the body)"
        expect_status(run, e, check, ("ok", "interrupted"), ("KeyboardInterrupt", None))
    elif started:
        expect_status(run, e, check, ("interrupted",), ("KeyboardInterrupt",))
    else:  # before the body ran: no run to report; a one-line message, or a report saying so
        expect_status(run, e, check, ("interrupted",), ("KeyboardInterrupt",), message_ok=True)


def expect_report_interrupt(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    # the body finished; the SIGINT was sent while the session stopped and its report was made and shown
    run.note = f"in the report: {ename(e) or 'no exception'}" if check["probe"] else "not sent (it ended first)"
    expect_status(run, e, check, ("ok", "interrupted"), ("KeyboardInterrupt", None))


def expect_error(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    expect_status(run, e, check, ("error",), ("ValueError",))
    report = check["report"]
    if report is not None and "fault injected" not in (report["error"] or ""):
        run.failures.append(f"report error {report['error']!r}")


def expect_worker_killed(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    # what the loop sees of the death is torch's: its "worker ... killed" RuntimeError, or the pipe's
    # ConnectionResetError / EOFError when that comes first; the report must name the killed worker either way
    run.note = f"loop saw {ename(e)}" if ename(e) else "loop ended first"
    expect_status(run, e, check, ("error",) if ename(e) else ("ok",),
                  ("RuntimeError", "ConnectionResetError", "EOFError") if ename(e) else (None,))
    report = check["report"]
    said = " ".join([report["error"] or "", *report["advice"]]) if report else ""
    if ename(e) and report is not None and str(VICTIM.get("pid")) not in said:
        run.failures.append(f"the report does not name the killed worker {VICTIM.get('pid')}: {said[:100]!r}")


def expect_ok(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    expect_status(run, e, check, ("ok",), (None,))


def expect_shm_path_full(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    expect_ok(run, e, check, t)
    shm = (check["report"] or {}).get("shm") or {}
    if shm.get("limit") == shm.get("peak") == 1 << 20:
        run.note = "report: shm 1 MiB of 1 MiB"
    else:
        run.failures.append(f"shm in the report: {shm.get('peak')} of {shm.get('limit')}")


def expect_shm_full_loader(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    evalue = ((e.error or {}).get("evalue") or "").splitlines()
    run.note = f"{ename(e)}: {evalue[0][:50] if evalue else ''}"
    expect_status(run, e, check, ("error",), ("RuntimeError", "OSError"))
    report = check["report"] or {}
    if not any("shm" in a.lower() or "shared" in a.lower() for a in report.get("advice") or []):
        run.note += "; no shm advice"


def expect_nested(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    expect_ok(run, e, check, t)
    if "another memwatch session is running" not in e.stderr:
        run.failures.append("inner cell: no one-line message")
    if "OUTER DONE" not in e.stdout:
        run.failures.append("outer body did not finish")


def expect_unrecorded(reason: str) -> Callable[[Run, Execution, dict[str, Any], dict[str, float]], None]:
    """The run goes on and is reported; one line says it is not recorded, and why; no file is left."""
    def expect(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
        expect_ok(run, e, check, t)
        said = [l for l in e.stderr.splitlines() if l.startswith("torchmem_magic: no flight record:")]
        if len(said) != 1 or reason not in said[0]:
            run.failures.append(f"{len(said)} lines saying the run is not recorded ({reason!r} expected): {e.stderr[-160:]!r}")
        else:
            run.note = "said: " + reason
        if check["probe"] not in ([], ["fill"]):
            run.failures.append(f"files left in the records directory: {check['probe']}")
    return expect


def _close_figure_plan(c: "Campaign", rng: random.Random) -> dict[str, Any]:
    kernel = c.kernel
    kernel.subshell()  # made before the cell: the control channel answers while it runs, but not the point here
    delay = rng.uniform(0.2, 2.0)

    def plan(_: str, now: float) -> list[tuple[float, Callable[[], None]]]:
        def close() -> None:
            ids = [m["content"]["comm_id"] for m in kernel.current.iopub if m["msg_type"] == "comm_open"]
            VICTIM["comms"] = len(ids)
            kernel.close_comms(ids)
        return [(now + delay, close)]

    return {"trigger": "LOOP START", "on_text": plan}


def expect_figure_closed(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    expect_ok(run, e, check, t)
    closed = VICTIM.pop("comms", 0)
    if not closed:
        run.failures.append("no comm of the figure to close (the loop ended first?)")
    run.note = f"closed {closed} comms" if "LOOP END" not in t or t["LOOP END"] > t.get("trigger", 0.0) else "after loop"
    errors = (check["report"] or {}).get("errors") or []
    if errors:
        run.failures.append(f"errors in the report: {errors}")


#: a run that ends with its process SIGKILLed, leaving its flight record (run by the kernel, as a subprocess)
DEAD_RUN = (
    "import os, signal, time, torch\n"
    "from torchmem_magic import MemwatchSession\n"
    "from torchmem_magic.flight.recorder import FlightRecorder\n"
    "from torchmem_magic.core.options import SessionOptions\n"
    "torch.set_num_threads(1)\n"
    "kept = []\n"
    "session = MemwatchSession(SessionOptions(5), recorder=FlightRecorder('a run whose kernel died')).start()\n"
    "model = torch.nn.Linear(64, 64); opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "t0 = time.time()\n"
    "while time.time() - t0 < 6:\n"
    "    opt.zero_grad(); model(torch.randn(32, 64)).square().mean().backward(); opt.step()\n"
    "    kept.append(torch.ones(2**12))\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)
DEAD_KERNEL_HEADLINE = "torchmem_magic: the kernel of this notebook died"
#: the kernel makes the dead run's record once (`DEAD_RUN` in a subprocess of its own, a 6 s run: a long
#: timeline to draw) and keeps it aside; before each run, a copy goes where `%load_ext` finds it
DEAD_RECORD_SETUP = f"""
import glob as _gl, os as _os, shutil as _sh, subprocess as _sp, sys as _sys, tempfile as _tf
_sp.run([_sys.executable, '-c', {DEAD_RUN!r}], timeout=180)
_tm_dead_record = _os.path.join(_tf.mkdtemp(prefix='torchmem-faults-dead-'), 'dead.jsonl')
_sh.move(sorted(_gl.glob(_os.path.join(_os.environ['TORCHMEM_MAGIC_RECORD_DIR'], '*.jsonl')))[-1], _tm_dead_record)
del _gl, _os, _sh, _sp, _sys, _tf
"""
DEAD_RECORD_COPY = (
    "torchmem_magic.clear_crashes()\n"
    "__import__('shutil').copy(_tm_dead_record, __import__('os').path.join("
    "__import__('os').environ['TORCHMEM_MAGIC_RECORD_DIR'], 'dead.jsonl'))\n"
)


def interrupt_inside(module: str, name: str) -> str:
    """Setup code that wraps the function `module.name` so that a run can have the kernel SIGINT itself at
    a drawn point of one call (`_tm_interrupt_in_s[0]` seconds into it; sent during the call or not at
    all, never into a later cell), and times every call (`_tm_call_s`). A SIGINT sent from here reaches the
    kernel tens of ms late: aimed at a window of a few hundred ms or less (the session's start, the report
    made, a dead kernel's record shown), it came after the window in 28, 25 and 30 of 30 runs."""
    *path, attribute = name.split(".")
    owner = ".".join([f"__import__({module!r}, fromlist=['_'])", *path])
    return f"""
import os as _os, signal as _sg, threading as _th, time as _tt
_tm_call = {owner}.{attribute}
_tm_call_s, _tm_interrupt_in_s, _tm_sent = [], [None], [False]
def _tm_send_interrupt():
    _tm_sent[0] = True
    _os.kill(_os.getpid(), _sg.SIGINT)
def _tm_interrupted_call(*args, **kwargs):
    timer = None
    if _tm_interrupt_in_s[0] is not None:
        timer = _th.Timer(_tm_interrupt_in_s[0], _tm_send_interrupt)
        _tm_interrupt_in_s[0] = None
        timer.start()
    started = _tt.perf_counter()
    try:
        return _tm_call(*args, **kwargs)
    finally:
        _tm_call_s.append(_tt.perf_counter() - started)
        if timer is not None:
            timer.cancel()
            timer.join()
{owner}.{attribute} = _tm_interrupted_call
"""


def _interrupt_inside_plan(c: "Campaign", rng: random.Random) -> dict[str, Any]:
    """A delay into the wrapped call, drawn over how long that call took in the calibration run (the last
    call before the first run, read once per kernel)."""
    if "call_s" not in c.calibration:
        c.calibration["call_s"] = c.kernel.value("_tm_call_s[-1]")
    c.kernel.ok(f"_tm_interrupt_in_s[0], _tm_sent[0] = {rng.uniform(0.0, max(c.calibration['call_s'], 0.005)):.4f}, False")
    return {}


def expect_load_ext_interrupt(run: Run, e: Execution, check: dict[str, Any], t: dict[str, float]) -> None:
    probe = check["probe"]
    if DEAD_KERNEL_HEADLINE not in e.stdout:
        run.failures.append("the dead kernel's record was not announced")
    if ename(e) not in ("KeyboardInterrupt", None):
        run.failures.append(f"cell ended with {ename(e)}")
    if ename(e) is None:
        run.note = "missed"
    elif "the extension is loaded, and %memwatch --last shows that record" in e.stderr:
        run.note = "in the display: said so"
    else:
        run.note = "after the display"
    if not probe["magics"]:
        run.failures.append("the extension is not loaded (no %%memwatch)")
    if probe["records"] != 1:
        run.failures.append(f"{probe['records']} records of the dead run (1 expected)")


HOSTILE_SETUP = r'''
import itertools, sys, torch
class Hostile:
    def __getattr__(self, name): raise RuntimeError("hostile __getattr__")
    def __len__(self): raise RuntimeError("hostile __len__")
    def __iter__(self): raise RuntimeError("hostile __iter__")
    def __sizeof__(self): raise RuntimeError("hostile __sizeof__")
    def __hash__(self): raise RuntimeError("hostile __hash__")
    def __eq__(self, other): raise RuntimeError("hostile __eq__")
    def __repr__(self): raise RuntimeError("hostile __repr__")
    @property
    def __class__(self): raise RuntimeError("hostile __class__")
    @property
    def __dict__(self): raise RuntimeError("hostile __dict__")
class HostileAttr:
    def __getattribute__(self, name): raise RuntimeError("hostile __getattribute__")
class Huge(list):
    def __len__(self): return sys.maxsize
    def __iter__(self): return itertools.count()
class Endless:
    def __len__(self): return 3
    def __iter__(self):
        while True:
            yield torch.ones(1)
    def __getitem__(self, i): return torch.ones(1)
class HostileDict(dict):
    def __iter__(self): raise RuntimeError("hostile dict __iter__")
    def items(self): raise RuntimeError("hostile dict items")
    def keys(self): raise RuntimeError("hostile dict keys")
    def values(self): raise RuntimeError("hostile dict values")
    def __len__(self): return -1 if False else sys.maxsize
class Holder: pass
hostile = Hostile(); hostile_attr = HostileAttr(); huge = Huge([torch.ones(4)]); endless = Endless()
hostile_dict = HostileDict(t=torch.ones(1 << 12))
holder = Holder(); holder.me = holder; holder.t = torch.ones(1 << 12)
selfref_list = []; selfref_list.append(selfref_list); selfref_list.append(torch.ones(8))
selfref_dict = {}; selfref_dict["me"] = selfref_dict; selfref_dict["t"] = torch.ones(8)
deep = []
for _ in range(100_000):
    deep = [deep]
hostile_keys = {Hostile.__new__(Hostile): 1} if False else {}
try:
    hostile_keys[HostileAttr()] = torch.ones(8)  # hash() of it uses the type's slot, not __getattribute__
except Exception:
    pass
class HostileTensor(torch.Tensor):
    def __getattr__(self, name): raise RuntimeError("hostile tensor __getattr__")
    @property
    def __class__(self): raise RuntimeError("hostile tensor __class__")
hostile_tensor = torch.ones(16).as_subclass(HostileTensor)
'''


def faults() -> list[Fault]:
    loop_cell = ("%%memwatch --interval 20\n" + BODY_HEAD + "print('LOOP START', flush=True)\n"
                 + timed_loop(3.0) + "print('LOOP END', flush=True)\n")
    short_cell = ("%%memwatch --interval 20\n" + BODY_HEAD + "print('BODY START', flush=True)\n"
                  + timed_loop(0.3) + "body_done = True\nprint('BODY DONE', flush=True)\n")
    big_namespace = "records = [{'a': i, 'b': i + 1} for i in range(300_000)]\n"
    worker_loader = (
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "loader = DataLoader(TensorDataset(torch.randn(40_000, 32)), batch_size=16, num_workers=2)\n"
    )
    worker_cell = (
        "%%memwatch --interval 20\n" + BODY_HEAD + worker_loader
        + "it = iter(loader)\n"
        + "print('WORKERS', *[w.pid for w in it._workers], flush=True)\n"
        + "t0 = time.time()\n"
        + "for (x,) in it:\n"
        + "    opt.zero_grad(); model(x).sum().backward(); opt.step()\n"
        + "    if time.time() - t0 > 4: break\n"
        + "del it\n"
    )
    shm_loader_cell = (  # 2 MiB batches: more than a full 1 MiB /dev/shm has free
        "%%memwatch --interval 20\n" + BODY_HEAD
        + worker_loader.replace("torch.randn(40_000, 32)", "torch.randn(256, 32_768)")
        + "for (x,) in loader:\n"
        + "    opt.zero_grad(); model(x[:, :32]).sum().backward(); opt.step()\n"
    )
    exception_cell = (
        "%%memwatch --interval 20\n" + BODY_HEAD + "import random\nstop_at = random.randint(1, 300)\n"
        + "for i in range(1000):\n"
        + f"    {STEP}\n"
        + "    if i == stop_at: raise ValueError('fault injected')\n"
    )
    nested_cell = (
        "%%memwatch --interval 20\n" + BODY_HEAD + timed_loop(0.3)
        + "get_ipython().run_cell('%%memwatch\\ninner_ran = 1\\n')\n"
        + timed_loop(0.3) + "assert 'inner_ran' not in globals()\nprint('OUTER DONE', flush=True)\n"
    )
    return [
        Fault("loop_interrupt", "KeyboardInterrupt during the training loop", loop_cell, expect_loop_interrupt,
              plan=_loop_interrupt_plan),
        Fault("start_interrupt", "KeyboardInterrupt during the session's start (300k dicts in the namespace)", short_cell,
              expect_start_interrupt, setup=big_namespace + interrupt_inside("torchmem_magic.session.run", "MemwatchSession.start"),
              plan=_interrupt_inside_plan, calibrate=True, probe="_tm_sent[0]"),
        Fault("report_interrupt", "KeyboardInterrupt while the report is made (300k dicts in the namespace)",
              short_cell, expect_report_interrupt, setup=big_namespace + interrupt_inside("torchmem_magic.frontends.magics", "MemwatchMagics._stop_and_show"),
              plan=_interrupt_inside_plan, calibrate=True, probe="_tm_sent[0]"),
        Fault("exception", "an exception raised in the loop", exception_cell, expect_error),
        Fault("worker_killed", "a DataLoader worker SIGKILLed mid-loop (num_workers=2)", worker_cell,
              expect_worker_killed, plan=_kill_worker_plan),
        Fault("shm_path_full", "`--shm-path` on a full 1 MiB tmpfs, DataLoader with 2 workers",
              shm_loader_cell.replace("%%memwatch --interval 20", f"%%memwatch --interval 20 --shm-path {SMALL_SHM}"),
              expect_shm_path_full),
        Fault("shm_full_loader", "/dev/shm itself a full 1 MiB tmpfs (private mount namespace), DataLoader with 2 workers",
              shm_loader_cell, expect_shm_full_loader,
              argv_prefix=["unshare", "-m", "--propagation", "private", "sh", "-c",
                           "mount -t tmpfs -o size=1m tmpfs /dev/shm && "
                           "(dd if=/dev/zero of=/dev/shm/fill bs=64k count=13 2>/dev/null || true) && exec \"$0\" \"$@\""]),
        Fault("hostile_objects", "hostile objects in the namespace (raising __getattr__/__len__/__iter__/__sizeof__/"
              "__class__, huge __len__, endless __iter__, self-references, 100k-deep nesting)", short_cell,
              expect_ok, setup=HOSTILE_SETUP),
        Fault("million_dict", "a 1M-entry dict in the namespace", short_cell, expect_ok,
              setup="big = {i: str(i) for i in range(1_000_000)}\n"),
        Fault("double_interrupt", "two SIGINTs 5–300 ms apart during the loop", loop_cell, expect_loop_interrupt,
              plan=_double_interrupt_plan),
        Fault("nested", "`%%memwatch` run inside `%%memwatch` via get_ipython().run_cell", nested_cell, expect_nested),
        Fault("kernel_killed", "the kernel SIGKILLed 0.5–4 s into a leaking run: its flight record read back",
              KILLED_CELL, lambda *_: None, campaign=KernelKillCampaign),
        Fault("kernel_terminated", "the kernel SIGTERMed 0.5–4 s into a leaking run (as Jupyter's shutdown ends it): "
              "it dies, its flight record read back says terminated", KILLED_CELL, lambda *_: None,
              campaign=KernelTermCampaign),
        Fault("records_full", "the flight record's directory on a full 64 KiB tmpfs", short_cell,
              expect_unrecorded("[Errno 28]"),
              setup=f"import os; os.environ['TORCHMEM_MAGIC_RECORD_DIR'] = {str(FULL_RECORDS)!r}\n",
              probe=f"sorted(__import__('os').listdir({str(FULL_RECORDS)!r}))"),
        Fault("records_read_only", "the flight record's directory on a read-only tmpfs", short_cell,
              expect_unrecorded("[Errno 30]"),
              setup=f"import os; os.environ['TORCHMEM_MAGIC_RECORD_DIR'] = {str(READ_ONLY_RECORDS)!r}\n",
              probe=f"sorted(__import__('os').listdir({str(READ_ONLY_RECORDS)!r}))"),
        Fault("figure_closed", "the front end closes the live figure's comms mid-loop (a page reload), from a subshell",
              loop_cell, expect_figure_closed, plan=_close_figure_plan),
        Fault("two_kernels", "two kernels each running a `%%memwatch` training cell at the same time",
              TWO_KERNELS_CELL, lambda *_: None, campaign=TwoKernelsCampaign),
        Fault("load_ext_interrupt", "KeyboardInterrupt while `%load_ext` shows a dead kernel's record "
              "(`%reload_ext`; a killed 6 s run's record put back before each run; the SIGINT sent by the "
              "kernel itself at a random point of the record's display)",
              # an interrupted load is not one IPython counts as loaded: %reload_ext loads it without a reload
              "torchmem_magic._crash_announced = False\n%reload_ext torchmem_magic\n",
              expect_load_ext_interrupt, plan=_interrupt_inside_plan, calibrate=True,
              calibrate_trigger=DEAD_KERNEL_HEADLINE, setup=DEAD_RECORD_SETUP + interrupt_inside("torchmem_magic.frontends.magics", "display"),
              before_each=DEAD_RECORD_COPY,
              probe=("{'magics': 'memwatch' in get_ipython().magics_manager.magics['cell'], 'records': len("
                     "__import__('torchmem_magic.flight.crashes', fromlist=['_']).crash_records())}")),
    ]


# ------------------------------------------------------------------------------------------------ campaign


class Campaign:
    def __init__(self, fault: Fault, runs: int, rng: random.Random, verbose: bool) -> None:
        self.fault, self.runs, self.rng, self.verbose = fault, runs, rng, verbose
        self.kernel: FaultKernel = None  # type: ignore[assignment]
        self.calibration: dict[str, float] = {}
        self.baseline: dict[str, Any] = {}

    def start_kernel(self) -> None:
        self.kernel = FaultKernel(self.fault.argv_prefix)
        self.kernel.arm_stacks()
        self.kernel.ok(SETUP)
        self.kernel.ok(STATE_HELPER)
        module = self.kernel.value("torchmem_magic.__file__")
        assert Path(module).resolve().is_relative_to(ROOT), module
        if self.fault.setup:
            self.kernel.ok(self.fault.setup)
        self.kernel.ok(NEXT_CELL)  # warm: imports, the widgets' modules
        self.kernel.ok(WARM_LOADER)  # torch's SIGCHLD handler, installed by the first loader with workers
        self.kernel.value("_fault_check()")
        self.baseline = self.kernel.value("_fault_state()")
        if self.fault.calibrate:
            self.kernel.ok(PRE_CELL)
            if self.fault.before_each:
                self.kernel.ok(self.fault.before_each)
            _, times = self.kernel.execute(self.fault.cell, timeout_s=self.fault.timeout_s,
                                           trigger=self.fault.calibrate_trigger, on_text=lambda text, now: [])
            self.calibration = times
            if self.verbose:
                print(f"    calibration: {', '.join(f'{k} {v:.3f}s' for k, v in sorted(times.items(), key=lambda kv: kv[1]))}",
                      flush=True)
            self.kernel.value("_fault_check()")

    def one(self) -> Run:
        run = Run()
        k = self.kernel
        k.ok(PRE_CELL)
        if self.fault.before_each:
            k.ok(self.fault.before_each)
        plan = self.fault.plan(self, self.rng)
        started = time.monotonic()
        execution, times = k.execute(self.fault.cell, timeout_s=self.fault.timeout_s, **plan)
        run_s = time.monotonic() - started
        probe = k.value(self.fault.probe)
        check = k.value("_fault_check()")
        check["probe"] = probe
        self.fault.expect(run, execution, check, times)
        for key, before in self.baseline.items():
            after = check["state"][key]
            if after != before:
                run.failures.append(f"left behind: {key} {before} -> {after}")
        if check["alive"]:
            run.failures.append(f"tensor kept alive: {', '.join(check['alive'])}")
        nxt, _ = k.execute(NEXT_CELL, timeout_s=self.fault.timeout_s)
        after = k.value("_fault_check()")
        if nxt.reply["content"]["status"] != "ok" or (after["report"] or {}).get("status") != "ok" or "memwatch: ok" not in nxt.stdout:
            run.failures.append(f"next cell: {ename(nxt) or (after['report'] or {}).get('status')}")
        for key, before in self.baseline.items():
            if after["state"][key] != before and not any(f.startswith(f"left behind: {key}") for f in run.failures):
                run.failures.append(f"left behind after the next cell: {key} {before} -> {after['state'][key]}")
        if self.verbose:
            print(f"    {self.fault.name} {run_s:5.1f}s {run.note:14} status={run.status} "
                  f"ename={ename(execution)} {'; '.join(run.failures) or 'ok'}", flush=True)
            if run.failures and execution.error:
                print("      " + ANSI.sub("", "\n      ".join(execution.error["traceback"][-6:])), flush=True)
        return run

    def run_all(self) -> list[Run]:
        results: list[Run] = []
        self.start_kernel()
        try:
            while len(results) < self.runs:
                try:
                    results.append(self.one())
                    if any(f.startswith("left behind") and "active session" in f for f in results[-1].failures):
                        self.kernel.shutdown()  # every later cell would be refused: one failure, not a cascade
                        self.start_kernel()
                except (TimeoutError, RuntimeError, json.JSONDecodeError, IndexError) as exc:
                    results.append(Run(failures=[f"kernel stuck or dead: {type(exc).__name__}: {str(exc)[:120]}"]))
                    stacks = self.kernel.stacks() if isinstance(exc, TimeoutError) else ""
                    if self.verbose:
                        print(f"    {self.fault.name}: {results[-1].failures[0]}", flush=True)
                        if stacks:
                            print("      where the kernel was stuck:\n      " + "\n      ".join(stacks.splitlines()), flush=True)
                    self.kernel.shutdown()
                    self.start_kernel()
        finally:
            self.kernel.shutdown()
        return results


KILLED_CELL = (
    "%%memwatch\n"
    "kept = []\n"
    "model = torch.nn.Linear(64, 64); opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "for step in range(10**7):\n"
    "    loss = model(torch.randn(32, 64)).square().mean()\n"
    "    opt.zero_grad(); loss.backward(); opt.step()\n"
    "    kept.append(torch.ones(2**14))  # 64 KiB a step\n"
    "    if step == 8: print('STEPPED', flush=True)\n"
)


def _stepped_during(kernel: FaultKernel, wait_s: float) -> float | None:
    """Wait `wait_s` reading the kernel's output: the wall time at which the cell said its loop had
    stepped (None: not within the wait)."""
    stepped_at, deadline = None, time.monotonic() + wait_s
    while (left_s := deadline - time.monotonic()) > 0:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=min(left_s, 0.05))
        except queue.Empty:
            continue
        if stepped_at is None and msg["msg_type"] == "stream" and "STEPPED" in msg["content"].get("text", ""):
            stepped_at = time.time()
    return stepped_at


class KernelKillCampaign:
    """Each run: a new kernel starts the leaking cell, and is SIGKILLed at a random moment of its run
    (timed from when its flight record appears); the record is then read back as a new kernel reads it.
    A run fails when the record is missing, does not parse, lost more than its last second, or does not
    give the run's verdict, its status "killed" and its holder (once its loop had stepped for 1.5 s: the cell
    says when it stepped, which on a busy machine comes seconds after the record appears)."""

    signum = signal.SIGKILL

    def __init__(self, fault: Fault, runs: int, rng: random.Random, verbose: bool) -> None:
        self.fault, self.runs, self.rng, self.verbose = fault, runs, rng, verbose
        self.records = Path(tempfile.mkdtemp(prefix="torchmem-faults-records-"))

    def one(self) -> Run:
        from torchmem_magic.flight.crashes import crash_records, crash_report

        run = Run()
        kernel = FaultKernel()
        try:
            kernel.ok(SETUP)
            pid = kernel.km.provisioner.process.pid  # type: ignore[union-attr]
            kernel.kc.execute(self.fault.cell)
            deadline = time.monotonic() + 120
            while not list(self.records.glob("*.jsonl")) and time.monotonic() < deadline:
                time.sleep(0.01)
            ran_s = self.rng.uniform(0.5, 4.0)
            stepped_at = _stepped_during(kernel, ran_s)
            killed_at = time.time()
            # the loop's first steps come when torch is ready, seconds later on a busy machine: the checks
            # of what the record holds are keyed to the loop having stepped 1.5 s before the kill, not to
            # the time since the record appeared
            stepped_s = killed_at - stepped_at if stepped_at is not None else 0.0
            os.kill(pid, self.signum)
            code = kernel.km.provisioner.process.wait(30)  # type: ignore[union-attr]
        finally:
            kernel.shutdown()
        if code != -self.signum:
            run.failures.append(f"the kernel exited with {code}, not of {signal.Signals(self.signum).name}")
        run.note = ("killed before the loop's steps" if stepped_at is None
                    else "killed < 1.5 s into the loop's steps" if stepped_s < 1.5 else "killed ≥ 1.5 s into the loop's steps")
        records = [r for r in crash_records(all_notebooks=True, directory=self.records) if r.hello.get("pid") == pid]
        if len(records) != 1:
            run.failures.append(f"{len(records)} records of the killed kernel")
            return run
        record = records[0]
        report = crash_report(record)
        run.status = report.status
        lost_s = killed_at - record.died_wall_s
        if record.skipped_lines > 1:
            run.failures.append(f"{record.skipped_lines} lines did not parse")
        if lost_s > 1.0:
            run.failures.append(f"lost the last {lost_s:.1f} s")
        if report.status != "killed" or (stepped_s >= 1.5 and report.steps <= 0):
            run.failures.append(f"status {report.status}, {report.steps} steps")
        terminated = self.signum == signal.SIGTERM
        if (record.terminated_by == "SIGTERM") != terminated or (terminated and "SIGTERM" not in (report.error or "")):
            run.failures.append(f"the record says {record.terminated_by or 'killed'}; the report: {report.error}")
        if terminated:
            run.status = "killed (SIGTERM)"
        if stepped_s >= 1.5 and report.verdict != "leak":
            run.failures.append(f"verdict {report.verdict}")
        if stepped_s >= 1.5 and "kept" not in [s.name for s in report.suspects]:
            run.failures.append("holder kept not named")
        strays = [p.name for p in self.records.iterdir() if not p.name.endswith(".jsonl")]
        if strays:
            run.failures.append(f"stray files {strays}")
        record.path.unlink()
        return run

    def run_all(self) -> list[Run]:
        saved = {k: os.environ.get(k) for k in ("TORCHMEM_MAGIC_RECORD_DIR", "JPY_SESSION_NAME")}
        os.environ["TORCHMEM_MAGIC_RECORD_DIR"] = str(self.records)  # the kernels inherit both
        os.environ["JPY_SESSION_NAME"] = str(self.records / "faults.ipynb")
        results: list[Run] = []
        try:
            while len(results) < self.runs:
                try:
                    results.append(self.one())
                except (TimeoutError, RuntimeError, OSError) as exc:
                    results.append(Run(failures=[f"{type(exc).__name__}: {str(exc)[:120]}"]))
                if self.verbose:
                    r = results[-1]
                    print(f"    {self.fault.name} {r.note:8} status={r.status} {'; '.join(r.failures) or 'ok'}", flush=True)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return results


class KernelTermCampaign(KernelKillCampaign):
    """As `KernelKillCampaign`, with SIGTERM (what Jupyter's shutdown sends a kernel that does not quit
    when asked): the kernel still dies of it, and its record says it was terminated."""

    signum = signal.SIGTERM


TWO_KERNELS_CELL = (
    "%%memwatch --no-plot --interval 20\n"
    "import os, time\n"
    "model = torch.nn.Linear(32, 8); opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "for i in range({steps}):\n"
    f"    {STEP}\n"
    "    if i == 100:\n"
    "        _s = torchmem_magic.session.run.active_session()\n"
    "        print('WHERE', os.getpid(), _s.recorder.path, None if _s.ranks is None else _s.ranks.address, flush=True)\n"
    "        del _s\n"
    "    time.sleep(0.004)\n"
)


class TwoKernelsCampaign:
    """Two kernels, each running a `%%memwatch` training cell of its own length at the same time, then
    the usual checks in each: both reports ok with their own step counts, their runs overlapped (by the
    kernels' own message times), their flight records and the ranks' sockets are apart (each named by
    its own process), nothing is left in either, and the next cell of each is ok."""

    def __init__(self, fault: Fault, runs: int, rng: random.Random, verbose: bool) -> None:
        self.fault, self.runs, self.rng, self.verbose = fault, runs, rng, verbose
        self.kernels: list[FaultKernel] = []
        self.baselines: list[dict[str, Any]] = []

    def start_kernels(self) -> None:
        self.kernels = [FaultKernel(), FaultKernel()]
        for k in self.kernels:
            k.arm_stacks()
            k.ok(SETUP)
            k.ok(STATE_HELPER)
            k.ok(NEXT_CELL)
            k.ok(WARM_LOADER)
            k.value("_fault_check()")
        self.baselines = [k.value("_fault_state()") for k in self.kernels]

    @staticmethod
    def collect(kernel: FaultKernel, msg_id: str, timeout_s: float) -> Execution:
        deadline = time.monotonic() + timeout_s
        execution = Execution(reply={})
        idle = False
        while not (idle and execution.reply):
            if time.monotonic() > deadline:
                raise TimeoutError(f"kernel did not finish within {timeout_s}s")
            try:
                msg = kernel.kc.get_iopub_msg(timeout=0.01)
            except queue.Empty:
                msg = None
            if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                execution.iopub.append(msg)
                idle = idle or (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle")
            if not execution.reply:
                try:
                    reply = kernel.kc.get_shell_msg(timeout=0)
                except queue.Empty:
                    continue
                if reply["parent_header"].get("msg_id") == msg_id:
                    execution.reply = reply
        return execution

    def one(self) -> Run:
        run = Run()
        steps = [self.rng.randint(200, 300), self.rng.randint(350, 450)]
        for k in self.kernels:
            k.ok(PRE_CELL)
        ids = [k.kc.execute(self.fault.cell.format(steps=n)) for k, n in zip(self.kernels, steps)]
        executions = [self.collect(k, i, self.fault.timeout_s) for k, i in zip(self.kernels, ids)]
        where = []
        for e in executions:
            said = [(found.groups(), m["header"]["date"]) for m in e.of_type("stream")
                    for found in [re.search(r"^WHERE (\d+) (\S+) (\S+)", m["content"]["text"], re.M)] if found]
            where.append((["WHERE", *said[0][0]], said[0][1]) if said else ([], None))
        if any(not w for w, _ in where):
            run.failures.append("a cell did not say where it records")
        else:
            (a, a_at), (b, b_at) = where
            replies = [e.reply["header"]["date"] for e in executions]
            if not (a_at < replies[1] and b_at < replies[0]):
                run.failures.append("the two runs did not overlap")
            if a[1] == b[1] or f"-{a[1]}-" not in a[2] or f"-{b[1]}-" not in b[2]:
                run.failures.append(f"flight records mixed up: {a[2]} {b[2]}")
            if a[3] != "None" and a[3] == b[3]:
                run.failures.append(f"one ranks socket for both: {a[3]}")
            run.note = "overlapped"
        statuses = []
        for k, e, n, baseline in zip(self.kernels, executions, steps, self.baselines):
            check = k.value("_fault_check()")
            report = check["report"] or {}
            statuses.append(str(report.get("status")))
            if e.reply["content"]["status"] != "ok" or "memwatch: ok" not in e.stdout:
                run.failures.append(f"cell: {ename(e) or report.get('status')}")
            if report.get("steps") != n:
                run.failures.append(f"steps {report.get('steps')} in the report of a run of {n}")
            for key, before in baseline.items():
                if check["state"][key] != before:
                    run.failures.append(f"left behind: {key} {before} -> {check['state'][key]}")
            if check["alive"]:
                run.failures.append(f"tensor kept alive: {', '.join(check['alive'])}")
            nxt, _ = k.execute(NEXT_CELL, timeout_s=self.fault.timeout_s)
            if nxt.reply["content"]["status"] != "ok" or "memwatch: ok" not in nxt.stdout:
                run.failures.append(f"next cell: {ename(nxt)}")
            k.value("_fault_check()")
        pids = [w[1] for w, _ in where if w]
        left = [p.name for p in records_directory().glob("*.jsonl") if any(f"-{pid}-" in p.name for pid in pids)]
        if left:
            run.failures.append(f"records left: {left}")
        run.status = " ".join(statuses)
        if self.verbose:
            print(f"    {self.fault.name} steps {steps} {run.note:10} status={run.status} {'; '.join(run.failures) or 'ok'}",
                  flush=True)
        return run

    def run_all(self) -> list[Run]:
        results: list[Run] = []
        self.start_kernels()
        try:
            while len(results) < self.runs:
                try:
                    results.append(self.one())
                except (TimeoutError, RuntimeError, json.JSONDecodeError, IndexError) as exc:
                    results.append(Run(failures=[f"kernel stuck or dead: {type(exc).__name__}: {str(exc)[:120]}"]))
                    if self.verbose:
                        print(f"    {self.fault.name}: {results[-1].failures[0]}", flush=True)
                        for k in self.kernels:
                            print("      " + "\n      ".join(k.stacks().splitlines()), flush=True)
                    for k in self.kernels:
                        k.shutdown()
                    self.start_kernels()
        finally:
            for k in self.kernels:
                k.shutdown()
        return results


def records_directory() -> Path:
    """Where the campaign's kernels keep their flight records (its own directory, set by `main`)."""
    return Path(os.environ["TORCHMEM_MAGIC_RECORD_DIR"])


def mount_record_dirs() -> str:
    """A full 64 KiB tmpfs and a read-only tmpfs for the flight records (root: mount; else say so)."""
    for path in (FULL_RECORDS, READ_ONLY_RECORDS):
        path.mkdir(exist_ok=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True).returncode:
            return "not mounted (not root): plain directories"
    with open(FULL_RECORDS / "fill", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    subprocess.run(["mount", "-o", "remount,ro", str(READ_ONLY_RECORDS)], capture_output=True, check=True)
    return "a full 64 KiB tmpfs, a read-only tmpfs"


def unmount_record_dirs() -> None:
    for path in (FULL_RECORDS, READ_ONLY_RECORDS):
        subprocess.run(["umount", str(path)], capture_output=True)
        try:
            path.rmdir()
        except OSError:
            pass


def burners(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def mount_small_shm() -> str:
    """A full 1 MiB tmpfs for --shm-path (root: mount; else a directory, and say so)."""
    SMALL_SHM.mkdir(exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(SMALL_SHM)],
                             capture_output=True).returncode == 0
    if not mounted:
        return "not mounted (not root): a plain directory"
    with open(SMALL_SHM / "fill", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return "a full 1 MiB tmpfs"


def unmount_small_shm() -> None:
    subprocess.run(["umount", str(SMALL_SHM)], capture_output=True)
    try:
        SMALL_SHM.rmdir()
    except OSError:
        pass


def summarise(fault: Fault, results: list[Run]) -> dict[str, Any]:
    failed = [r for r in results if r.failures]
    what = collections.Counter(f for r in failed for f in r.failures)
    notes = collections.Counter(r.note for r in results if r.note)
    statuses = collections.Counter(str(r.status) for r in results)
    return {
        "name": fault.name, "what": fault.what, "runs": len(results), "failures": len(failed),
        "failed": "; ".join(f"{text} ({n}×)" for text, n in what.most_common()) or "—",
        "landed": ", ".join(f"{k} {v}" for k, v in notes.most_common()),
        "statuses": ", ".join(f"{k} {v}" for k, v in statuses.most_common()),
    }


def render(rows: list[dict[str, Any]], load: str, shm: str, record_dirs: str, seconds: float, spinning: int) -> str:
    lines = [
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {spinning} "
        f"`while True: pass` processes beside the kernel ({load}); `--shm-path` target: {shm}; flight-record "
        f"directories: {record_dirs}. Produced by `python bench/faults.py` "
        f"on {datetime.date.today()} in {seconds / 60:.0f} min.",
        "",
        "| fault | runs | failures | what failed | statuses seen | where it landed |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['what']} (`{r['name']}`) | {r['runs']} | {r['failures']} | {r['failed']} | "
                     f"{r['statuses']} | {r['landed'] or '—'} |")
    return "\n".join(lines)


def write_page(section: str) -> None:
    text = PAGE.read_text()
    start, end = "<!-- faults:start -->", "<!-- faults:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{PAGE.relative_to(ROOT)} has no faults markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    PAGE.write_text(f"{head}{start}\n{section}\n{end}{tail}")


def replace_rows(rows: list[dict[str, Any]], when: str) -> None:
    """`--only`: the page's table keeps its other rows; these faults' rows are replaced (marked as rerun)."""
    text = PAGE.read_text()
    for r in rows:
        line = (f"| {r['what']} (`{r['name']}`, rerun {when}) | {r['runs']} | {r['failures']} | {r['failed']} | "
                f"{r['statuses']} | {r['landed'] or '—'} |")
        pattern = re.compile(rf"^\| [^\n]*\(`{re.escape(r['name'])}`[^\n]*$", re.M)
        if not pattern.search(text):
            raise SystemExit(f"no row of {r['name']} in the faults table of {PAGE.relative_to(ROOT)} to replace")
        text = pattern.sub(lambda _: line, text, count=1)
    PAGE.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--only", default="", help="comma-separated fault names")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=None,
                        help="how long a cell may run before the kernel counts as stuck (default: each fault's, 180 s)")
    parser.add_argument("--no-write", "--no-readme", dest="no_write", action="store_true",
                        help="print the table only, leave the docs page as it is")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args()
    chosen = [f for f in faults() if not args.only or f.name in args.only.split(",")]
    if args.timeout_s is not None:
        for fault in chosen:
            fault.timeout_s = args.timeout_s
    if not chosen:
        raise SystemExit(f"no fault named {args.only!r}; known: {', '.join(f.name for f in faults())}")
    rng = random.Random(args.seed)
    started = time.monotonic()
    # a termination of the campaign itself (kill) still kills its burners and unmounts its filesystems
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"terminated ({signal.Signals(signum).name})"))
    records = tempfile.TemporaryDirectory(prefix="torchmem-faults-records-")
    saved_records = os.environ.get("TORCHMEM_MAGIC_RECORD_DIR")
    os.environ["TORCHMEM_MAGIC_RECORD_DIR"] = records.name  # the kernels inherit it: never the user's cache
    spinning: list[subprocess.Popen[bytes]] = []
    rows = []
    try:
        shm = mount_small_shm()
        record_dirs = mount_record_dirs()
        spinning = burners(args.burners)
        loads = [os.getloadavg()[0]]
        for fault in chosen:
            print(f"{fault.name}: {fault.what}", flush=True)
            results = (fault.campaign or Campaign)(fault, args.runs, rng, not args.quiet).run_all()
            rows.append(summarise(fault, results))
            loads.append(os.getloadavg()[0])
            print(f"  -> {rows[-1]['failures']}/{rows[-1]['runs']} failed: {rows[-1]['failed']}", flush=True)
    finally:
        for p in spinning:
            p.kill()
            p.wait()
        unmount_small_shm()
        unmount_record_dirs()
        if saved_records is None:
            os.environ.pop("TORCHMEM_MAGIC_RECORD_DIR", None)
        else:
            os.environ["TORCHMEM_MAGIC_RECORD_DIR"] = saved_records
        records.cleanup()
    load = f"1-min load average {min(loads[1:] or loads):.1f}–{max(loads):.1f} during the runs"
    section = render(rows, load, shm, record_dirs, time.monotonic() - started, args.burners)
    print(section)
    if not args.no_write:
        if args.only:
            replace_rows(rows, f"with {args.burners} burners, {load}")
        else:
            write_page(section)


if __name__ == "__main__":
    main()
