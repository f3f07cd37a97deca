"""%%memwatch against the tools a user would otherwise pick, each in a real ipykernel of its own.

Every tool gets a fresh kernel (jupyter_client, as a notebook front end drives it) that defines the same
four loops; then, per loop, cells alternate bare, tool, bare, tool, ... (A-B-A: the machine's drift
cancels). Each timed cell times its loop from inside (perf_counter around the loop, kept in a dict in
the kernel) and the client times the whole cell (send to idle). Reported: the median over rounds of
tool / mean(the two bare cells beside it), with quartiles; and the fixed per-cell cost, a tool cell with
a trivial body minus a bare trivial cell, both timed by the client.

A second table runs the leaking loop once more under each tool and checks its real output (stream
text, displays, the files its iframes show) for a leak verdict, the holder's name, the kind of memory.

A peer that launches the training script itself (TraceML: `traceml run train.py`, `SCRIPT_TOOLS`) cannot
run in a kernel: the same loops go into a script instead, runs alternating `python train.py` and the
peer's launcher, the loop timed from inside as in the kernel, the whole process by the client (its
start-up cost is the extra wall time of a run with a trivial body).

Run: python bench/run_all.py peers (rewrites the peers section of docs/benchmarks.md);
python bench/peers.py [--quick] [--only NAME,NAME] (prints the tables; --only keeps the tools whose name
contains one of the words, case-insensitive, memwatch's default always kept as the reference)
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "kernel"))

from kernel_client import Execution, Kernel  # noqa: E402

# ---------------------------------------------------------------- the loops (same code under every tool)

LEAK_SOURCE = '''\
def leak_loop(steps=STEPS_LEAK):
    global losses
    losses = []
    _truth["before"] = _mem()
    _truth["t0"] = time.time()
    t = time.perf_counter()
    for _ in range(steps):
        opt_s.zero_grad()
        loss = F.mse_loss(tiny(xs), ys)
        loss.backward()
        opt_s.step()
        losses.append(loss)
    elapsed = time.perf_counter() - t
    _truth["t1"] = time.time()
    _truth["after"] = _mem()
    return elapsed
'''

LOOPS = '''\
import ctypes, os, time, psutil, torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)
torch.manual_seed(0)
os.chdir(WORKDIR)
_t, _truth = {}, {}
_proc, _libc = psutil.Process(), ctypes.CDLL("libc.so.6")

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
_libc.mallinfo2.restype = _MallInfo2

def _mem():
    info = _libc.mallinfo2()
    return {"rss": _proc.memory_info().rss, "heap": info.uordblks + info.hblkhd}

tiny = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt_s = torch.optim.SGD(tiny.parameters(), lr=0.01)
xs, ys = torch.randn(8, 16), torch.randn(8, 1)
big = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
opt_b = torch.optim.SGD(big.parameters(), lr=0.01)
xb, yb = torch.randn(128, 256), torch.randint(0, 10, (128,))

def tiny_loop(steps=STEPS_TINY):
    t = time.perf_counter()
    for _ in range(steps):
        opt_s.zero_grad()
        loss = F.mse_loss(tiny(xs), ys)
        loss.backward()
        opt_s.step()
    return time.perf_counter() - t

def big_loop(steps=STEPS_BIG):
    t = time.perf_counter()
    for _ in range(steps):
        opt_b.zero_grad()
        F.cross_entropy(big(xb), yb).backward()
        opt_b.step()
    return time.perf_counter() - t

class Synthetic(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return self.x[i], self.y[i]

data = Synthetic(ITEMS_LOADER)

def loader_loop():
    t = time.perf_counter()
    for x, y in DataLoader(data, batch_size=16, num_workers=2):
        opt_s.zero_grad()
        F.mse_loss(tiny(x), y).backward()
        opt_s.step()
    return time.perf_counter() - t

losses = []
''' + LEAK_SOURCE + '''
for _f in (tiny_loop, big_loop, loader_loop, leak_loop):  # warm-up: first calls, allocator, worker start
    _f()
losses = []
'''

LOOP_NAMES = {
    "tiny_loop": "tiny MLP 16-16-1, batch 8 (Python-bound)",
    "big_loop": "MLP 256-1024-10, batch 128 (compute-bound)",
    "loader_loop": "DataLoader, 2 workers, tiny MLP",
    "leak_loop": "tiny MLP keeping `losses.append(loss)` (leak)",
}

FULL = {"STEPS_TINY": 2000, "STEPS_BIG": 200, "ITEMS_LOADER": 4096, "STEPS_LEAK": 2000, "rounds": 5}
QUICK = {"STEPS_TINY": 500, "STEPS_BIG": 50, "ITEMS_LOADER": 1024, "STEPS_LEAK": 500, "rounds": 2}


# ---------------------------------------------------------------- the tools


@dataclass
class Tool:
    """How a user runs one tool in a notebook.

    setup: cells run once after the loops are defined. wrap(body) -> (cells before, the timed cell, cells after):
    the cells around it switch tools that watch every cell on and off (untimed). leak_wrap: the invocation
    for the leak report (default: wrap). live: whether its output updates while the cell runs, from its
    docs/source (checked against the output's timestamps where possible).
    """

    name: str
    setup: list[str]
    wrap: Callable[[str], tuple[list[str], str, list[str]]]
    live_fact: str
    leak_wrap: Callable[[str], tuple[list[str], str, list[str]]] | None = None
    loops: tuple[str, ...] = tuple(LOOP_NAMES)
    rounds: int | None = None  # None: the run's default
    cell_timeout_s: float = 120.0
    group: str = ""  # tools sharing a kernel (memwatch's configurations)
    note: str = ""


def magic(line: str) -> Callable[[str], tuple[list[str], str, list[str]]]:
    return lambda body: ([], f"{line}\n{body}", [])


def between(before: list[str], after: list[str], prefix: str = "") -> Callable[[str], tuple[list[str], str, list[str]]]:
    return lambda body: (before, prefix + body, after)


MEMLAB_MLRUN_FUNC = re.compile(r"_t\[[^]]*\] = (\w+)\(")


#: defined in the stormlog kernel: what `gpumemprof analyze track.json` does with a tracker's export (the
#: telemetry events read back, `MemoryAnalyzer.generate_optimization_report`), printed as its report's fields,
#: and the tracker's own RSS samples (first, last, peak), the growth it saw
STORMLOG_REPORT = '''\
def _stormlog_report(tracker, path="stormlog-track.json"):
    from stormlog.telemetry import load_telemetry_events
    tracker.export_events(path, format="json")
    report = MemoryAnalyzer().generate_optimization_report(events=load_telemetry_events(path))
    score = report["optimization_score"]
    print(f"stormlog grade {score['grade']} ({score['score']}/100): {score['description']}; "
          f"issues found: {score['issues_found']}")
    for item in report["critical_issues"] + report["high_impact_insights"] + report["recommendations"]:
        print("stormlog:", item.get("description"), "|", "; ".join(item.get("suggestions") or item.get("recommendations") or []))
    for name, why in (report.get("analysis_availability") or {}).items():
        print(f"stormlog {name}: {why.get('reason')}")
    rss = [e.memory_allocated for e in tracker.get_events() if e.event_type == "sample"]
    alerts = [e.context for e in tracker.get_events() if "alert" in e.event_type or "warning" in e.event_type]
    print(f"stormlog alerts: {len(alerts)} {alerts[:3]}")
    if rss:
        print(f"stormlog RSS samples: {len(rss)}, first {rss[0] / 2**20:.1f} MiB, last {rss[-1] / 2**20:.1f} MiB, "
              f"growth {(rss[-1] - rss[0]) / 2**20:+.1f} MiB")
'''


def stormlog_tracked(body: str, report: bool = False) -> tuple[list[str], str, list[str]]:
    """The cell as stormlog's docs track a run: a tracker started before the work and stopped after it,
    both inside the timed cell (their cost is part of the cell's); `report`: its analysis after it."""
    code = (f"_st = CPUMemoryTracker(sampling_interval=0.1)\n_st.start_tracking()\ntry:\n"
            f"{textwrap.indent(body, '    ')}\nfinally:\n    _st.stop_tracking()")
    return [], code + ("\n_stormlog_report(_st)" if report else ""), []


def mlrun(body: str) -> tuple[list[str], str, list[str]]:
    match = MEMLAB_MLRUN_FUNC.search(body)
    func = f" -f {match.group(1)}" if match else ""
    return [], f"%%mlrun{func}\n{body}", []


TOOLS = [
    Tool("`%%memwatch` (100 ms, live figure)", ["%load_ext torchmem_magic"], magic("%%memwatch"),
         "yes: a live bqplot figure fed by its sampler thread (docs, *What the live figure shows*)",
         group="memwatch"),
    Tool("`%%memwatch --interval 10`", [], magic("%%memwatch --interval 10"), "yes (as above)", group="memwatch"),
    Tool("`%%memwatch -q` (no figure, no report)", [], magic("%%memwatch -q"), "no output at all (-q)",
         leak_wrap=magic("%%memwatch --no-plot"), group="memwatch",
         note="leak report with `--no-plot` (text report)"),
    Tool("ipython-memory-usage (`%imu_start`)",
         ["%load_ext ipython_memory_usage", "import ipython_memory_usage.ipython_memory_usage as _imu"],
         # %imu_stop unregisters the post-cell hook inside its own cell, so the sampler thread that cell's
         # pre-cell hook started never hears keep_watching=False and samples every 1 ms for up to 60 s:
         # the cleanup cell stops it (a bare cell would otherwise run beside it)
         between(["%imu_start"], ["%imu_stop", "_imu.keep_watching = False"]),
         "no: pre/post-cell hooks; one line printed after the cell (ipython_memory_usage.py)"),
    Tool("ipyexperiments (`IPyExperimentsCPU()`)",
         ["from ipyexperiments import IPyExperimentsCPU"],
         between(["_exp = IPyExperimentsCPU()"], ["_exp.finish(); del _exp"]),
         "no: its CellLogger prints after each cell (cell_logger.py post_run_cell)",
         note="`IPyExperimentsPytorch()` needs NVML and CUDA (see failures); this is its CPU backend"),
    Tool("memory_profiler `%%memit`", ["%load_ext memory_profiler"], magic("%%memit"),
         "no: one line after the statement ends (memory_profiler.py memit)"),
    Tool("memray `%%memray_flamegraph`", ["%load_ext memray"], magic("%%memray_flamegraph"),
         "no: the flame graph is built after the Tracker exits (memray/_ipython/flamegraph.py)",
         leak_wrap=magic("%%memray_flamegraph --leaks"), note="leak report with `--leaks`"),
    Tool("pytorch_memlab `%%mlrun`", ["%load_ext pytorch_memlab"], mlrun,
         "no: a table after the cell (line_profiler/extension.py)"),
    Tool("pytorch_memlab `MemReporter().report()` after the loop", ["from pytorch_memlab import MemReporter"],
         lambda body: ([], f"{body}\nMemReporter().report()", []),
         "no: a snapshot printed when called (mem_reporter.py)"),
    Tool("Scalene `%%scalene`", ["%load_ext scalene"], magic("%%scalene"),
         "no: an iframe of the profile after the cell (scalene_jupyter.py)",
         loops=("leak_loop",), rounds=1, cell_timeout_s=60.0,
         note="one cell per loop only (the leaking loop), stopped after 60 s"),
    # stormlog's CPU tracker (its `MemoryTracker` needs a CUDA, ROCm or MPS device), sampling at memwatch's
    # default 100 ms rather than its own 0.5 s, which would take no sample in a loop of 0.4 s
    Tool("stormlog `CPUMemoryTracker(sampling_interval=0.1)`",
         ["from stormlog import CPUMemoryTracker, MemoryAnalyzer", STORMLOG_REPORT], stormlog_tracked,
         "no: the tracker's thread keeps RSS samples; the analyser reads them after the run (cpu_profiler.py)",
         leak_wrap=lambda body: stormlog_tracked(body, report=True),
         note="leak report: its events exported and read back by `MemoryAnalyzer` (as `gpumemprof analyze` does)"),
]


# ---------------------------------------------------------------- driving a kernel


def execute(kernel: Kernel, code: str, timeout_s: float) -> Execution:
    """Kernel.execute, keeping also the messages of other parents (widget updates sent from a sampler
    thread) and each message's arrival time (`_arrived`, perf_counter) for the liveness check."""
    msg_id = kernel.kc.execute(code)
    deadline = time.monotonic() + timeout_s
    execution = Execution(reply={})
    execution.started = time.perf_counter()  # type: ignore[attr-defined]
    idle = False
    while not (idle and execution.reply):
        if time.monotonic() > deadline:
            raise TimeoutError(f"kernel did not finish within {timeout_s}s")
        try:
            msg = kernel.kc.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            msg = None
        if msg is not None:
            msg["_arrived"] = time.perf_counter()
            msg["_ours"] = msg["parent_header"].get("msg_id") == msg_id
            if msg["_ours"] or msg["msg_type"] in ("comm_msg", "update_display_data"):
                execution.iopub.append(msg)
            if msg["_ours"] and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        if not execution.reply:
            try:
                reply = kernel.kc.get_shell_msg(timeout=0.0 if msg is not None else 0.01)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                execution.reply = reply
    return execution


def last_json(execution: Execution) -> Any:
    """The JSON line a cell printed (tools that print after every cell add lines of their own)."""
    for line in reversed(execution.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


@dataclass
class Cell:
    label: str
    wall_s: float
    execution: Execution | None
    error: str | None = None


@dataclass
class KernelRun:
    kernel: Kernel
    workdir: Path
    cells: list[Cell] = field(default_factory=list)

    def run(self, code: str, label: str = "", timeout_s: float = 120.0) -> Cell:
        started = time.perf_counter()
        try:
            execution = execute(self.kernel, code, timeout_s)
        except TimeoutError:
            self.kernel.km.interrupt_kernel()
            cell = Cell(label, time.perf_counter() - started, None, f"did not finish within {timeout_s:.0f} s")
            try:
                self.kernel.execute("pass", timeout_s=30)  # drain the interrupted cell's messages
            except TimeoutError:
                cell.error = f"{cell.error}; the kernel did not answer an interrupt"
            self.cells.append(cell)
            return cell
        cell = Cell(label, time.perf_counter() - started, execution)
        if execution.status != "ok":
            err = execution.error or {}
            cell.error = f"{err.get('ename')}: {err.get('evalue')}"
        self.cells.append(cell)
        return cell

    def inner_times(self) -> dict[str, float]:
        execution = execute(self.kernel, "import json as _j; print(_j.dumps(_t))", 60)
        return last_json(execution) if execution.status == "ok" else {}


def loops_code(params: dict[str, Any], workdir: Path) -> str:
    """The loops' source with this run's sizes and working folder filled in."""
    code = LOOPS.replace("WORKDIR", repr(str(workdir)))
    for key, value in params.items():
        code = code.replace(key, str(value))
    return code


def start_kernel(params: dict[str, Any]) -> KernelRun:
    # the kernel imports this checkout's torchmem_magic, whatever the venv has installed
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    workdir = Path(tempfile.mkdtemp(prefix="peers-"))
    run = KernelRun(Kernel(), workdir)
    cell = run.run(loops_code(params, workdir), "setup", timeout_s=300)
    if cell.error:
        raise RuntimeError(f"loop setup failed: {cell.error}")
    return run


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def _body(label: str, func: str | None) -> str:
    return f"_t[{label!r}] = {func}()" if func else f"_t[{label!r}] = 0.0"


def measure_group(tools: list[Tool], params: dict[str, Any], failures: dict[str, str]) -> dict[str, Any]:
    """One kernel for `tools` (one tool, or memwatch's configurations): timing rounds, then the leak report."""
    run = start_kernel(params)
    results: dict[str, Any] = {}
    try:
        usable = []
        for tool in tools:
            bad = next((c for c in (run.run(s, f"{tool.name} setup") for s in tool.setup) if c.error), None)
            if bad:
                failures[tool.name] = f"setup: {bad.error}"
            else:
                usable.append(tool)
        if any(t.name.startswith("ipyexperiments") for t in usable):  # what its docs' PyTorch experiment does here
            cell = run.run("from ipyexperiments import IPyExperimentsPytorch\n_e = IPyExperimentsPytorch()", "ipyexp pt")
            if cell.error:
                failures["ipyexperiments `IPyExperimentsPytorch()`"] = cell.error
        rounds = params["rounds"]
        samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
        broken: set[str] = set()
        loop_errors: dict[tuple[str, str], str] = {}

        def tool_cell(tool: Tool, label: str, func: str | None) -> Cell | None:
            before, code, after = tool.wrap(_body(label, func))
            for c in before:
                run.run(c, "control")
            cell = run.run(code, label, timeout_s=tool.cell_timeout_s)
            for c in after:
                run.run(c, "control")
            if cell.error:
                failures.setdefault(tool.name, f"{LOOP_NAMES.get(func or '', 'trivial cell')}: {cell.error}")
                loop_errors[(tool.name, func or "trivial")] = cell.error
                broken.add(tool.name)
                return None
            return cell

        for func in [None, *LOOP_NAMES]:  # None: a trivial body, for the fixed per-cell cost
            key = func or "trivial"
            members = [t for t in usable if (func is None or func in t.loops) and t.name not in broken]
            n_rounds = max([rounds] + [0]) if members else 0
            prev = run.run(_body(f"{key} bare 0", func), f"{key} bare 0")
            for r in range(n_rounds):
                for tool in members:
                    if tool.name in broken or r >= (tool.rounds or rounds):
                        continue
                    label = f"{key} {tool.name} {r}"
                    watched = tool_cell(tool, label, func)
                    nxt = run.run(_body(f"{key} bare {r}+{tool.name}", func), f"{key} bare {r}+{tool.name}")
                    if watched is not None and not prev.error and not nxt.error:
                        samples.setdefault((tool.name, key), []).append(
                            {"label": label, "bare_labels": (prev.label, nxt.label), "wall": watched.wall_s,
                             "bare_wall": (prev.wall_s + nxt.wall_s) / 2})
                    prev = nxt
        inner = run.inner_times()
        for (name, key), rows in samples.items():
            entry: dict[str, Any] = {"rounds": len(rows)}
            walls = [r["wall"] - r["bare_wall"] for r in rows]
            if key == "trivial":
                entry["fixed_s"] = _quartiles(walls)
            else:
                ratios, tool_s, bare_s = [], [], []
                for row in rows:
                    t, b = inner.get(row["label"]), [inner.get(x) for x in row["bare_labels"]]
                    known = [x for x in b if x is not None]
                    if t is None or len(known) < len(b):
                        continue
                    bare = sum(known) / 2
                    ratios.append(t / bare)
                    tool_s.append(t)
                    bare_s.append(bare)
                if ratios:
                    entry.update(ratio=_quartiles(ratios), tool_s=statistics.median(tool_s),
                                 bare_s=statistics.median(bare_s), cell_extra_s=_quartiles(walls))
            results.setdefault(name, {})[key] = entry
        for (name, key), error in loop_errors.items():
            results.setdefault(name, {}).setdefault(key, {})["error"] = error
        # the leak report: the leaking loop once more under each tool, its output checked
        for tool in usable:
            if tool.name in broken or "leak_loop" not in tool.loops:
                continue
            wrap = tool.leak_wrap or tool.wrap
            before, code, after = wrap(_body(f"report {tool.name}", "leak_loop"))
            for c in before:
                run.run(c, "control")
            cell = run.run(code, f"report {tool.name}", timeout_s=tool.cell_timeout_s)
            for c in after:
                run.run(c, "control")
            if cell.execution is None or cell.error:
                continue
            truth_d = last_json(execute(run.kernel, "import json as _j; print(_j.dumps(_truth))", 30))
            loop_s = run.inner_times().get(f"report {tool.name}", 0.0)
            results.setdefault(tool.name, {})["report"] = check_report(tool, cell.execution, run.workdir, truth_d, loop_s)
    finally:
        run.kernel.shutdown()
    return results

# ---------------------------------------------------------------- peers that launch the script themselves


@dataclass
class ScriptTool:
    """A peer whose documented use is a launcher around the training script (`traceml run train.py`), so it
    cannot watch a kernel's cell: the same loops run as a script, bare (`python train.py`) and under it.

    instrument(source): the script as the peer's docs have a user change it. command(script, workdir): the
    launcher's argv. report_files(workdir): the text of what it wrote for the user to read (its summary).
    """

    name: str
    instrument: Callable[[str], str]
    command: Callable[[Path, Path], list[str]]
    report_files: Callable[[Path], tuple[str, str]]
    live_fact: str
    loops: tuple[str, ...] = tuple(LOOP_NAMES)
    rounds: int | None = None  # None: the run's default
    run_timeout_s: float = 180.0
    note: str = ""


#: appended to the loops' source: runs the loop named in PEER_LOOP (warmed up first, as in the kernel) and
#: prints its time and the truth (heap and RSS before and after) as one JSON line
SCRIPT_MAIN = """
import json as _json
_name = os.environ["PEER_LOOP"]
if _name != "trivial":
    globals()[_name]()
    losses = []
_t["loop"] = globals()[_name]() if _name != "trivial" else 0.0
print(_json.dumps({"loop_s": _t["loop"], "truth": _truth}), flush=True)
"""

WARM_ALL = "for _f in (tiny_loop, big_loop, loader_loop, leak_loop):"


def script_code(params: dict[str, Any], workdir: Path) -> str:
    """The kernel's loops as one script; the warm-up of all four loops at once is left to SCRIPT_MAIN, which
    warms only the loop it times (a process runs one loop)."""
    code = loops_code(params, workdir)
    assert WARM_ALL in code
    return code.replace(WARM_ALL, "for _f in ():") + SCRIPT_MAIN


STEP_FOR = re.compile(r"^( {4,})for .*:\s*$")


def traceml_instrumented(source: str) -> str:
    """The script as TraceML's quickstart has a plain PyTorch loop written: `traceml.init(mode="auto")` once,
    and each step, zero_grad() through step(), inside `with traceml.trace_step(model):` (its step boundary,
    and where its step-memory figures come from)."""
    lines, out = source.splitlines(), ["import traceml_ai as traceml", 'traceml.init(mode="auto")']
    i = 0
    while i < len(lines):
        out.append(lines[i])
        match = STEP_FOR.match(lines[i])
        i += 1
        if not match:
            continue
        depth, block = len(match.group(1)), []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > depth):
            block.append(lines[i])
            i += 1
        model = "big" if any("big(" in line for line in block) else "tiny"
        out.append(" " * (depth + 4) + f"with traceml.trace_step({model}):")
        out.extend("    " + line if line.strip() else line for line in block)
    return "\n".join(out) + "\n"


def _free_port() -> int:
    """A port nobody listens on now: TraceML's aggregator and torchrun's rendezvous would otherwise take their
    fixed defaults (29765, 29500), which another run on this machine may hold."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def traceml_command(script: Path, workdir: Path) -> list[str]:
    """`traceml run train.py` (summary mode, its default), its logs in the run's folder."""
    return [str(Path(sys.executable).with_name("traceml")), "run", str(script), "--logs-dir", str(workdir / "logs"),
            "--aggregator-port", str(_free_port()), "--master-port", str(_free_port())]


def traceml_report(workdir: Path) -> tuple[str, str]:
    """(final_summary.txt, the diagnoses in final_summary.json) of the newest session under the run's logs."""
    sessions = sorted((workdir / "logs").glob("*/final_summary.json"), key=lambda p: p.stat().st_mtime)
    if not sessions:
        return "", ""
    summary = json.loads(sessions[-1].read_text())
    diagnoses = [f"{section}: {summary[section]['diagnosis'].get('status')}: {summary[section]['diagnosis'].get('summary')}"
                 for section in ("step_memory", "process", "system")
                 if isinstance(summary.get(section), dict) and isinstance(summary[section].get("diagnosis"), dict)]
    text = sessions[-1].with_suffix(".txt")
    return (text.read_text() if text.exists() else ""), "\n".join(diagnoses)


SCRIPT_SENTENCE = ("a launcher's runs alternate with `python train.py` runs of the same script, one process "
                   "each, its loop warmed up first in the same process")

SCRIPT_TOOLS = [
    ScriptTool("TraceML `traceml run train.py`", traceml_instrumented, traceml_command, traceml_report,
               "no: summary mode (its default) prints one card when the script ends; `--mode=cli` is a live "
               "terminal view (traceml run --help)",
               rounds=3, note="each step inside `traceml.trace_step(model)`; 3 rounds (a run takes ~10 s)"),
]


@dataclass
class ScriptRun:
    label: str
    wall_s: float
    loop_s: float | None
    truth: dict[str, Any]
    output: str
    error: str | None = None


def run_script(argv: list[str], loop: str, workdir: Path, label: str, timeout_s: float) -> ScriptRun:
    """One process, timed by the client from start to exit; the loop's own time from its JSON line."""
    import subprocess

    env = dict(os.environ, PEER_LOOP=loop, PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return ScriptRun(label, time.perf_counter() - started, None, {}, "", f"did not finish within {timeout_s:.0f} s")
    wall = time.perf_counter() - started
    output = done.stdout + done.stderr
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith('{"loop_s"')), None)
    if done.returncode != 0 or line is None:
        tail = " | ".join(output.strip().splitlines()[-3:])
        return ScriptRun(label, wall, None, {}, output, f"exit {done.returncode}: {tail[-300:]}")
    data = json.loads(line)
    return ScriptRun(label, wall, data["loop_s"], data["truth"], output)


def measure_script_tool(tool: ScriptTool, params: dict[str, Any], failures: dict[str, str]) -> dict[str, Any]:
    """Runs alternating bare, tool, bare, ... per loop (a trivial body first, for the start-up cost); then the
    leaking loop once more under the tool, its summary read."""
    workdir = Path(tempfile.mkdtemp(prefix="peers-script-"))
    bare_script, tool_script = workdir / "train_bare.py", workdir / "train.py"
    source = script_code(params, workdir)
    bare_script.write_text(source)
    tool_script.write_text(tool.instrument(source))
    bare_argv = [sys.executable, str(bare_script)]
    results: dict[str, Any] = {}
    for key in ["trivial", *tool.loops]:
        prev = run_script(bare_argv, key, workdir, f"{key} bare 0", tool.run_timeout_s)
        ratios, walls, tool_s, bare_s = [], [], [], []
        for r in range(min(tool.rounds or params["rounds"], params["rounds"])):
            cell = run_script(tool.command(tool_script, workdir), key, workdir, f"{key} tool {r}", tool.run_timeout_s)
            nxt = run_script(bare_argv, key, workdir, f"{key} bare {r + 1}", tool.run_timeout_s)
            for bad in (cell, prev, nxt):
                if bad.error:
                    failures.setdefault(tool.name if bad is cell else f"{tool.name} (bare script)",
                                        f"{LOOP_NAMES.get(key, 'trivial body')}: {bad.error}")
            if cell.error:
                results.setdefault(key, {})["error"] = cell.error
                break
            if not prev.error and not nxt.error and cell.loop_s is not None:
                bare_loop = ((prev.loop_s or 0.0) + (nxt.loop_s or 0.0)) / 2
                walls.append(cell.wall_s - (prev.wall_s + nxt.wall_s) / 2)
                if key != "trivial":
                    ratios.append(cell.loop_s / bare_loop)
                    tool_s.append(cell.loop_s)
                    bare_s.append(bare_loop)
            prev = nxt
        entry = results.setdefault(key, {})
        entry["rounds"] = len(walls)
        if key == "trivial" and walls:
            entry["fixed_s"] = _quartiles(walls)
        elif ratios:
            entry.update(ratio=_quartiles(ratios), tool_s=statistics.median(tool_s), bare_s=statistics.median(bare_s),
                         cell_extra_s=_quartiles(walls))
        if "error" in entry:
            return results
    if "leak_loop" in tool.loops:
        shutil.rmtree(workdir / "logs", ignore_errors=True)
        cell = run_script(tool.command(tool_script, workdir), "leak_loop", workdir, "report", tool.run_timeout_s)
        if not cell.error:
            summary, diagnoses = tool.report_files(workdir)
            # what the user reads: its terminal output (the card) and the summary it saved; not the loop's JSON line
            text = ANSI.sub("", "\n".join(x for x in cell.output.splitlines() if not x.startswith('{"loop_s"')))
            results["report"] = check_text(tool, text + "\n" + summary, diagnoses, cell.truth, None)
            results["report"]["words"] = diagnoses
    return results


# ---------------------------------------------------------------- reading what a tool reported


TAG = re.compile(r"<[^>]+>")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SIZE = r"([+-]?[\d.,]+)\s*(B|KiB|MiB|GiB|KB|MB|GB)"
UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def _visible_text(execution: Execution, workdir: Path) -> tuple[str, str]:
    """(what the cell printed and displayed, the data behind its iframes: memray's flame graph frames,
    Scalene's profile), as text."""
    parts, behind = [], []
    for m in execution.iopub:
        c = m["content"]
        if m["msg_type"] == "stream":
            parts.append(c["text"])
        elif m["msg_type"] in ("display_data", "execute_result", "update_display_data"):
            data = c.get("data", {})
            html = data.get("text/html", "")
            plain = data.get("text/plain", "")
            parts.append(plain if plain and not plain.startswith("<IPython") else TAG.sub(" ", html))
            alt = re.findall(r"alt='([^']*)'", html)
            parts.extend(alt)
            for src in re.findall(r'src="([^"]+)"', html):
                path = workdir / src if not src.startswith("http") else workdir / "scalene-profile.json"
                if path.suffix == ".html" and path.exists():  # memray: the frames of its flame graph
                    match = re.search(r"const packed_data = (\{.*?\});\n", path.read_text())
                    if match:
                        packed = json.loads(match.group(1))
                        behind.append("\n".join(packed.get("strings", [])))
                        behind.append(f"total bytes: {packed['nodes']['value'][0]}")
                elif path.suffix == ".json" and path.exists():  # Scalene's profile, which its page shows
                    profile = json.loads(path.read_text())
                    for fname, f in profile.get("files", {}).items():
                        behind.extend(line.get("line", "") for line in f.get("lines", []))
                        for lineno, leak in (f.get("leaks") or {}).items():
                            behind.append(f"Possible memory leak identified at line {lineno}")
                    behind.append(f"growth_rate {profile.get('growth_rate', 0)}")
    return ANSI.sub("", "\n".join(parts)), ANSI.sub("", "\n".join(behind))


def _growth(tool: Tool | ScriptTool, text: str, behind: str) -> str:
    """Did the figure the tool shows grow during the leaking cell? (parsed from its own output)"""
    name = tool.name
    found: float | None = None
    if name.startswith("`%%memwatch"):
        m = re.search(r"heap in use.*?" + SIZE + r"/step", text)
        if m:
            found = float(m.group(1).replace(",", "")) * UNITS[m.group(2)]
            return f"yes (heap {m.group(1)} {m.group(2)}/step)" if found > 0 else "no"
    elif name.startswith("ipython-memory-usage"):
        m = re.search(r"used (-?[\d.]+) MiB RAM", text)
        if m:
            return f"{'yes' if float(m.group(1)) > 0 else 'no'} (RAM {m.group(1)} MiB)"
    elif name.startswith("ipyexperiments"):
        m = re.search(r"CPU:\s+(-?[\d,]+)\s+(-?[\d,]+)\s+([\d,]+) MB", text)
        if m:
            return f"{'yes' if int(m.group(1).replace(',', '')) > 0 else 'no'} (△Consumed {m.group(1)} MB)"
    elif name.startswith("memory_profiler"):
        m = re.search(r"increment: (-?[\d.]+) MiB", text)
        if m:
            return f"{'yes' if float(m.group(1)) > 0.05 else 'no'} (increment {m.group(1)} MiB)"
    elif name.startswith("memray"):
        m = re.search(r"total bytes: (\d+)", behind)
        if m:
            return f"yes ({int(m.group(1)) / 2**20:.1f} MiB not freed, by allocation site)"
    elif name.startswith("Scalene"):
        m = re.search(r"growth_rate ([\d.]+)", behind)
        if m:
            return "no (memory profiling is off in notebooks)" if float(m.group(1)) == 0 else f"yes ({m.group(1)})"
    elif name.startswith("stormlog"):
        m = re.search(r"stormlog RSS samples: (\d+),.*growth ([+-][\d.]+) MiB", text)
        grade = re.search(r"stormlog grade (\w+) \(\d+/100\): ([^;]+)", text)
        graded = f"; graded {grade.group(1)}, '{grade.group(2)}'" if grade else ""
        if m:
            return f"{'yes' if float(m.group(2)) > 0 else 'no'} (RSS {m.group(2)} MiB in {m.group(1)} samples{graded})"
        return f"no (no RSS sample{graded})"
    elif name.startswith("TraceML"):
        step = re.search(r"STEP MEMORY: ([A-Z][A-Z ]*[A-Z])", text)
        proc = re.search(r"PROCESS METRICS: ([A-Z][A-Z ]*[A-Z])", text)
        if step or proc:
            return (f"no (step memory: '{step.group(1) if step else '?'}'; process metrics: "
                    f"'{proc.group(1) if proc else '?'}')")
    elif "MemReporter" in name:
        return "no (a snapshot: one line per tensor, no growth)"
    elif "mlrun" in name:
        return "no (CUDA only: " + ("'No data collected')" if "No data collected" in text else "nothing shown)")
    return "no figure"


def _live(execution: Execution, t0: float | None, t1: float | None) -> bool:
    """At least 3 outputs (widget updates, streams, displays) sent while the loop ran, spread over half of
    it: the messages' header dates (the kernel's clock) against the loop's start and end (time.time()
    taken inside the loop function)."""
    import datetime as dt

    if not t0 or not t1 or t1 <= t0:
        return False
    sent = []
    for m in execution.iopub:
        if m["msg_type"] in ("comm_msg", "stream", "display_data", "update_display_data", "clear_output"):
            d = m["header"].get("date")
            if isinstance(d, str):
                d = dt.datetime.fromisoformat(d.replace("Z", "+00:00"))
            if d is not None and t0 <= d.timestamp() <= t1:
                sent.append(d.timestamp())
    return len(sent) >= 3 and max(sent) - min(sent) >= (t1 - t0) * 0.5


def check_report(tool: Tool, execution: Execution, workdir: Path, truth: dict[str, Any], loop_s: float) -> dict[str, Any]:
    text, behind = _visible_text(execution, workdir)
    return check_text(tool, text, behind, truth, _live(execution, truth.get("t0"), truth.get("t1")))


def check_text(tool: Tool | ScriptTool, text: str, behind: str, truth: dict[str, Any],
               live_seen: bool | None) -> dict[str, Any]:
    """What the tool's output says about the leaking run (`text`: what it printed or displayed; `behind`: the
    data behind it); `live_seen`: None where its output's timing cannot be told (a script's terminal)."""
    everything = text + "\n" + behind
    # lines that only echo the loop's own source (memray's and Scalene's frames) do not name a holder
    echoed = re.sub(r"\S*/\S*\.py\S*", " ", everything)
    for line in LEAK_SOURCE.splitlines():
        if line.strip():
            echoed = echoed.replace(line.strip(), "")
    # the kind: in what the tool says, not in the torch source lines of memray's allocation-site frames
    # (torch.autograd.backward is among them whatever is kept)
    kind = ("autograd graph" if re.search(r"autograd|grad_fn|\bgraphs?\b", text, re.I)
            else "tensors" if re.search(r"\btensor", text, re.I) else "—")
    before, after = truth.get("before", {}), truth.get("after", {})
    return {
        # TraceML names its leak rule "memory creep"
        "verdict": bool(re.search(r"\bleak\b|memory leak|memory creep", text, re.I)
                        or re.search(r"memory leak|memory creep", behind, re.I)),
        "holder": bool(re.search(r"\blosses\b", echoed)),
        "kind": kind,
        "growth": _growth(tool, text, behind),
        "live_seen": live_seen,
        "live_fact": tool.live_fact,
        "rss_mib": (after.get("rss", 0) - before.get("rss", 0)) / 2**20,
        "heap_mib": (after.get("heap", 0) - before.get("heap", 0)) / 2**20,
        "chars": len(text),
        # stormlog's report lines as it printed them (TraceML's diagnoses are set by measure_script_tool)
        "words": "\n".join(re.findall(r"^stormlog (?:grade|alerts|RSS samples|gap_analysis).*$", text, re.M)),
    }


# ---------------------------------------------------------------- run and render


def selected(only: list[str]) -> list[Tool | ScriptTool]:
    """The tools whose name contains one of the words in `only` (all where it is empty), with memwatch's
    default always: every ratio is read beside it."""
    tools: list[Tool | ScriptTool] = [*TOOLS, *SCRIPT_TOOLS]
    words = [w.lower() for w in only if w]
    return [t for t in tools if not words or t is TOOLS[0] or any(w in t.name.lower() for w in words)]


def run(quick: bool = False, only: list[str] | None = None) -> dict[str, Any]:
    params = dict(QUICK if quick else FULL)
    failures: dict[str, str] = {}
    groups: dict[str, list[Tool]] = {}
    tools = selected(only or [])
    for tool in tools:
        if isinstance(tool, Tool):
            groups.setdefault(tool.group or tool.name, []).append(tool)
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for members in groups.values():
        t0 = time.perf_counter()
        try:
            results.update(measure_group(members, params, failures))
        except Exception as exc:  # a tool that breaks its kernel: said in the table, the others go on
            for tool in members:
                failures.setdefault(tool.name, f"{type(exc).__name__}: {exc}")
        print(f"peers: {', '.join(t.name for t in members)} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    for script_tool in (t for t in tools if isinstance(t, ScriptTool)):
        t0 = time.perf_counter()
        try:
            results[script_tool.name] = measure_script_tool(script_tool, params, failures)
        except Exception as exc:  # said in the table, as for a kernel tool
            failures.setdefault(script_tool.name, f"{type(exc).__name__}: {exc}")
        print(f"peers: {script_tool.name} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return {"params": params, "results": results, "failures": failures, "tools": tools,
            "total_s": time.perf_counter() - started}


def _q(q: tuple[float, float, float], fmt: str, scale: float = 1.0) -> str:
    low, mid, high = (v * scale for v in q)
    return f"{mid:{fmt}} ({low:{fmt}} … {high:{fmt}})"


def render(quick: bool = False, only: list[str] | None = None) -> str:
    import platform

    import torch

    out = run(quick, only)
    params, results, failures, tools = out["params"], out["results"], out["failures"], out["tools"]
    script_rounds = ", ".join(f"{t.name.split(' ')[0]}: {t.rounds or params['rounds']} rounds of runs"
                              for t in tools if isinstance(t, ScriptTool))
    load = os.getloadavg()[0]
    lines = [
        f"Machine: {os.cpu_count()} cores (shared), Python {platform.python_version()}, torch {torch.__version__}, "
        f"one torch thread; load average {load:.1f} after the runs. Loops: {LOOP_NAMES['tiny_loop']} "
        f"{params['STEPS_TINY']} steps; {LOOP_NAMES['big_loop']} {params['STEPS_BIG']} steps; DataLoader over "
        f"{params['ITEMS_LOADER']} synthetic items, batch 16, `num_workers=2`; the leak: {params['STEPS_LEAK']} steps, "
        f"`losses = []` then `losses.append(loss)`. {params['rounds']} rounds per loop in one fresh kernel per tool "
        f"(Scalene: one cell){'; ' + SCRIPT_SENTENCE + ' (' + script_rounds + ')' if script_rounds else ''}; "
        f"whole run {out['total_s'] / 60:.1f} min.",
        "",
        "| tool | loop | loop time, tool / bare (quartiles) | bare loop | cell's extra wall time |",
        "|---|---|---|---|---|",
    ]
    for tool in tools:
        r = results.get(tool.name, {})
        fixed = r.get("trivial", {}).get("fixed_s")
        if isinstance(tool, ScriptTool):
            fixed_s = f"{_q(fixed, '.1f')} s" if fixed else "—"
            lines.append(f"| {tool.name} | start-up cost (a run with a trivial body, against `python train.py`) | — | — "
                         f"| {fixed_s} |")
        else:
            fixed_s = f"{_q(fixed, '.0f', 1e3)} ms" if fixed else "—"
            lines.append(f"| {tool.name} | fixed per-cell cost (trivial body) | — | — | {fixed_s} |")
        for key in tool.loops:
            e = r.get(key, {})
            if "ratio" in e:
                lines.append(f"| {tool.name} | {LOOP_NAMES[key]} | {_q(e['ratio'], '.2f')} | {e['bare_s']:.2f} s | "
                             f"{_q(e['cell_extra_s'], '.2f')} s |")
            else:
                why = e.get("error") or ("not run after an earlier failure" if tool.name in failures else "—")
                lines.append(f"| {tool.name} | {LOOP_NAMES[key]} | did not run: {why} | — | — |")
    lines += ["", "**Could not run here** (exact errors):", ""]
    lines += [f"- {name}: `{why}`" for name, why in failures.items()] or ["- none"]
    lines += [
        "",
        "**What each tool reports on the leaking loop** (one more run of it under the tool; computed from the "
        "cell's real output — printed text, displays, the files behind its iframes: *verdict*: a statement that it "
        "leaks; *holder*: `losses` named (lines that echo the loop's own source do not count); *kind*: autograd "
        "graph / tensors named in what it prints or displays; *growth shown*: the tool's own figure for the cell, parsed from its output; "
        "*live*: the tool's documented behaviour, and whether its outputs were sent spread over the loop's run):",
        "",
        "| tool | verdict | holder named | kind named | growth shown | live during the cell | heap / RSS growth in that cell (truth) |",
        "|---|---|---|---|---|---|---|",
    ]
    words = []
    for tool in tools:
        rep = results.get(tool.name, {}).get("report")
        if rep is None:
            continue
        seen = {True: "yes (seen)", False: "not seen", None: "not checked (a script's terminal)"}[rep["live_seen"]]
        live = f"{seen}; {rep['live_fact']}"
        if rep.get("words"):
            words.append(f"- {tool.name}: " + "; ".join(f"“{w}”" for w in rep["words"].splitlines()))
        note = f" ({tool.note})" if tool.note and "leak report" in tool.note else ""
        lines.append(
            f"| {tool.name}{note} | {'yes' if rep['verdict'] else 'no'} | {'yes' if rep['holder'] else 'no'} | "
            f"{rep['kind']} | {rep['growth']} | {live} | +{rep['heap_mib']:.1f} MiB / {rep['rss_mib']:+.1f} MiB |"
        )
    if words:
        lines += ["", "What the training-loop peers said about the leaking run, in their own words (TraceML: the "
                  "diagnoses in its final_summary.json; stormlog: its analyser's report and its tracker's samples):",
                  "", *words]
    lines += ["", winners(results, tools)]
    return "\n".join(lines)


def winners(results: dict[str, Any], tools: list[Tool | ScriptTool]) -> str:
    """One sentence on where a peer is cheaper than %%memwatch's default: a loop where the peer's upper
    quartile of tool/bare lies under memwatch's lower quartile, or a smaller median fixed per-cell cost
    (a kernel tool's: a script's start-up cost is another thing)."""
    ref = results.get(TOOLS[0].name, {})
    beats = []
    for tool in (t for t in tools if t not in TOOLS[:3]):
        r = results.get(tool.name, {})
        if any("error" in r.get(k, {}) or k not in r for k in tool.loops):
            continue  # a tool that could not finish a loop is cheaper at nothing
        won = [LOOP_NAMES[k].split(" (")[0].split(",")[0] for k in tool.loops
               if r.get(k, {}).get("ratio") and ref.get(k, {}).get("ratio") and r[k]["ratio"][2] < ref[k]["ratio"][0]]
        fa, fb = r.get("trivial", {}).get("fixed_s"), ref.get("trivial", {}).get("fixed_s")
        if fa and fb and fa[1] < fb[1] and isinstance(tool, Tool):
            won.append(f"fixed cost {fa[1] * 1e3:.0f} vs {fb[1] * 1e3:.0f} ms")
        if won:
            beats.append(f"{tool.name} ({'; '.join(won)})")
    if not beats:
        return "No peer was clearly cheaper than `%%memwatch`'s default in these runs."
    return ("Where a peer is clearly cheaper than `%%memwatch`'s default (quartile ranges apart, or a smaller fixed "
            "per-cell cost): " + ", ".join(beats) + ".")


def _only(argv: list[str]) -> list[str]:
    """`--only traceml,stormlog` -> ["traceml", "stormlog"]."""
    if "--only" not in argv:
        return []
    at = argv.index("--only") + 1
    return argv[at].split(",") if at < len(argv) else []


if __name__ == "__main__":
    print(render(quick="--quick" in sys.argv, only=_only(sys.argv)))
