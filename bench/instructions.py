"""Where memwatch's overhead on a Python-bound loop goes, in instructions (deterministic) and in A-B-A wall time.

Wall-clock overhead on a shared 2-core machine moves by several percent between identical runs; the
instructions a step executes do not. Each configuration runs a tiny MLP loop (32-32-1, batch 16) in a
child process under `valgrind --tool=callgrind`; a small client-request library (built here with the
system's C compiler and `valgrind/callgrind.h`) zeroes the counters after the warm-up and dumps them
after the measured steps, so the figure is the measured steps' alone (no interpreter start, no import).
Only the training thread is counted there: the sampler thread's cost is its instructions per reading
(measured by calling the reading in a loop the same way) times the readings a step sees at full speed
(step time / interval). The wall-clock part repeats the A-B-A rounds of `overhead.py` for the same
configurations, so the two can be compared: what instructions do not account for is time the training
thread spends elsewhere (waiting for the GIL, cache misses after a thread switch).

The attribution part takes the training thread's A-B-A difference apart in time: each layer of the
step path is switched on and off every `--block-steps` steps in one process (hundreds of short pairs:
the machine's drift cancels within a pair), and its median ratio is its share of a step; a layer's
share divided by its share of the instructions says how much slower than the step's average its
instructions run (the step path runs once a step, between torch's calls, with its code and data
cold). The session's time-paced parts (step samples, holder scans) are charged at their instructions
times how often the timed runs make them; the sampler thread's wake-ups by an idle thread at the
same rate. What the whole A-B-A difference leaves after these rows is its own row.

Run: .venv/bin/python bench/instructions.py [--steps N] [--rounds R] [--no-wall] [--no-callgrind]
     [--no-attribution] [--cache-sim]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

CLIENT_SOURCE = r"""
#include <valgrind/callgrind.h>
void tm_zero(void) { CALLGRIND_ZERO_STATS; }
void tm_dump(const char *what) { CALLGRIND_DUMP_STATS_AT(what); }
"""

#: what each configuration installs around the loop (in the order of the table)
CONFIGS = (
    "bare",
    "optimizer hook, no-op",
    "all step hooks, no-op callbacks",
    "idle thread waking every 100 ms",
    "memwatch -q, 100 ms",
    "memwatch -q, 10 ms",
)
#: under callgrind the threads take turns at a 50x slower pace: a thread's wake-ups say nothing there, and
#: a session's time-paced parts (step samples, scans, readings) come 50x too often per step; the session
#: is measured part by part instead (COMPONENTS), each part's count per step taken from the timed runs
CALLGRIND_CONFIGS = (
    "bare", "optimizer hook, no-op", "all step hooks, no-op callbacks", "memwatch -q, sampler asleep, nothing due",
)
#: a whole session whose time-paced parts never come due: its sampler thread asleep (one reading in
#: 10 s), no step sample, no scan; what every step of a session pays on the training thread
ASLEEP = "memwatch -q, sampler asleep, nothing due"


# ---------------------------------------------------------------------------------------------- the workload
def make_step() -> Callable[[], None]:
    """A tiny MLP step, 32-32-1, batch 16 (Python-bound: ~0.2 ms, most of it torch's dispatch); the counts
    so far were taken on it, so it stays this size (`overhead.py` times the goals' 16-16-1, batch 8)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    batch = torch.randn(16, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    return step


@contextmanager
def optimizer_hook_only() -> Iterator[None]:
    """torch's global optimizer post-hook with a callback that does nothing: what the hook point costs."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: None)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def idle_thread(interval_s: float) -> Iterator[None]:
    """A thread that wakes every `interval_s` and does nothing: what a wake-up costs the training thread."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval_s):
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def config_context(config: str, step: Callable[[], None], records: Path) -> AbstractContextManager[Any]:
    """The context a configuration's steps run in."""
    if config == "bare":
        return nullcontext()
    if config == "optimizer hook, no-op":
        return optimizer_hook_only()
    if config == "all step hooks, no-op callbacks":
        from torchmem_magic.tracing.hooks import TrainingHooks

        return TrainingHooks(lambda clock: None, lambda loader_pass: None)
    if config == "idle thread waking every 100 ms":
        return idle_thread(0.1)
    if config == "idle thread waking every 10 ms":
        return idle_thread(0.01)
    if config == ASLEEP:
        session: AbstractContextManager[Any] = memwatch_session(10_000.0, step, records)
        return session
    return memwatch_session(100.0 if "100 ms" in config else 10.0, step, records)


def memwatch_session(interval_ms: float, step: Callable[[], None], records: Path) -> Any:
    """A session as `%%memwatch -q` makes one: the leak finder on what the step holds, the flight recorder."""
    from torchmem_magic import MemwatchSession
    from torchmem_magic.flight.recorder import FlightRecorder
    from torchmem_magic.finder.leak_finder import LeakSearch
    from torchmem_magic.core.options import SessionOptions
    from torchmem_magic.finder.scan.results import Root

    search = LeakSearch(lambda: [Root("train_step", "user", "train_step", step)])
    recorder = FlightRecorder("bench", directory=records)
    return MemwatchSession(SessionOptions(interval_ms), search=search, recorder=recorder)


# ---------------------------------------------------------------------------------------------- callgrind
def client_library(directory: Path) -> ctypes.CDLL | None:
    """The zero/dump client requests as a shared library (None without a C compiler or callgrind.h)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not Path("/usr/include/valgrind/callgrind.h").exists():
        return None
    source, library = directory / "tm_callgrind.c", directory / "tm_callgrind.so"
    if not library.exists():
        source.write_text(CLIENT_SOURCE)
        subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return ctypes.CDLL(str(library))


def child(config: str, steps: int, warmup_steps: int, client_dir: Path) -> None:
    """Under callgrind: warm up inside the configuration, count `steps` steps, print what the run saw."""
    import torch

    torch.set_num_threads(1)
    client = client_library(client_dir)
    assert client is not None
    records = Path(tempfile.mkdtemp(prefix="torchmem-instr-records-"))
    if config == "components":
        return child_components(steps, client, records)
    step = make_step()
    for _ in range(20):
        step()
    context = config_context(config, step, records)
    with context:
        for _ in range(warmup_steps):
            step()
        if config == ASLEEP:
            nothing_due(context)
        facts_before = session_facts(context)
        client.tm_zero()
        for _ in range(steps):
            step()
        client.tm_dump(b"measured steps")
        facts_after = session_facts(context)
    print(json.dumps({"before": facts_before, "after": facts_after}))


#: the parts of memwatch's cost measured one by one (each a dump of its own, in this order)
COMPONENTS = (
    "bare step",
    "step in a session, nothing due",
    "optimizer tick, not sampled",
    "optimizer tick, sampled",
    "holder scan",
    "sampler reading",
    "flight record flush after 5 readings",
    "bare step, after the session",
)


def child_components(calls: int, client: ctypes.CDLL, records: Path) -> None:
    """Each part of a session's cost, called `calls` times (scans: a tenth of that) between a zeroing and
    a dump of the counters: instructions per call, whatever the machine's speed."""
    step = make_step()
    for _ in range(84):
        step()

    def measure(name: str, fn: Callable[[], None], n: int) -> None:
        fn()  # warm
        client.tm_zero()
        for _ in range(n):
            fn()
        client.tm_dump(name.encode())
        counts[name] = n

    counts: dict[str, int] = {}
    measure("bare step", step, calls)
    session = memwatch_session(10_000.0, step, records)  # its thread wakes once in 10 s: asleep here
    with session:
        for _ in range(84):
            step()  # past the dense start of 64 sampled steps
        sampling, tracker = session.step_counter.sampling, session.finder._tracker
        nothing_due(session)
        measure("step in a session, nothing due", step, calls)
        hooks = session._hooks
        measure("optimizer tick, not sampled", lambda: hooks._after_optimizer_step(None, (), {}), calls)

        def sampled_tick() -> None:
            sampling.sample_next()
            hooks._after_optimizer_step(None, (), {})

        measure("optimizer tick, sampled", sampled_tick, calls)
        nothing_due(session)
        measure("holder scan", lambda: tracker.scan(session.steps), max(calls // 10, 5))
        measure("sampler reading", session.background.row, calls)
        recorder, view = session.recorder, session.view

        def flush_after_readings() -> None:
            for _ in range(5):
                session.timeline.by_time.append(session.background.row())
            recorder._flush(view)

        measure("flight record flush after 5 readings", flush_after_readings, max(calls // 10, 5))
    measure("bare step, after the session", step, calls)  # A-B-A within the process: the heap moved meanwhile
    print(json.dumps({"calls": counts}))


def nothing_due(session: Any) -> None:
    """No step sample, no scan, no request for a long while: what every other step costs."""
    sampling, tracker = session.step_counter.sampling, session.finder._tracker
    sampling.stride = sampling.next_sampled_step = 10**9
    tracker.schedule._next_scan_s = tracker.schedule._budget_ready_s = float("inf")
    tracker.schedule._next_scan_step = tracker.schedule.check_at_step = 10**9  # no clock reading either (a wait without end: one in 1,024 steps)


def session_facts(context: Any) -> dict[str, Any]:
    """What a session did so far (events to rate per step); empty for the other configurations."""
    sampler = getattr(context, "_sampler", None)
    if sampler is None:
        return {}
    tracker = getattr(context.finder, "_tracker", None)
    recorder = context.recorder
    return {
        "steps": context.steps,
        "step_samples": len(context.timeline.by_step) + len(context.step_counter._rows),
        "stride": context.step_counter.sampling.stride,
        "readings": sampler.samples,
        "scans": getattr(tracker, "scans", 0),
        "record_bytes": getattr(recorder, "bytes_written", 0),
    }


#: callgrind's simulated caches as this machine's (L1i 32 KiB, L1d 48 KiB, its 1 MiB L2 as the last level:
#: callgrind simulates two levels, and what a step's code and data miss is the L2)
CACHE_SIM = ["--cache-sim=yes", "--branch-sim=yes", "--I1=32768,8,64", "--D1=49152,12,64", "--LL=1048576,16,64"]


def run_callgrind(config: str, steps: int, warmup_steps: int, work: Path, cache_sim: bool = False) -> dict[str, Any]:
    """One configuration under callgrind: the instructions of each dump, on the training thread (with
    `cache_sim`, also the simulated cache misses and mispredicted branches)."""
    out = work / f"cg-{len(list(work.glob('cg-*')))}"
    out.mkdir()
    command = [
        "valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}/cg.out",
        *(CACHE_SIM if cache_sim else []),
        sys.executable, __file__, "--child", config, str(steps), str(warmup_steps), str(work),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{config}: {done.stderr[-3000:]}")
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    parts = training_thread_dumps(out)
    dumps = {trigger(part): (total_instructions(part), str(part)) for part in parts}
    events = {trigger(part): summary_events(part) for part in parts}
    return {"config": config, "dumps": dumps, "events": events, **facts}


def training_thread_dumps(out: Path) -> list[Path]:
    """The client requests' dumps of the training thread (parts 1, 2, ... of thread 1), in order."""
    parts = [p for p in out.glob("cg.out.*-01") if p.name.split(".")[-1].split("-")[0].isdigit()]
    if not parts:
        raise RuntimeError(f"no callgrind dump in {out}: {sorted(p.name for p in out.iterdir())}")
    return sorted(parts, key=lambda p: int(p.name.split(".")[-1].split("-")[0]))


def trigger(part: Path) -> str:
    with part.open() as lines:
        for line in lines:
            if line.startswith("desc: Trigger: Client Request: "):
                return line.split(": ", 3)[-1].strip()
    return part.name


def total_instructions(part: Path) -> int:
    with part.open() as lines:
        for line in lines:
            if line.startswith("summary:"):  # the dump's events ("totals" also counts the frames open at the zeroing)
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {part}")


def summary_events(part: Path) -> dict[str, int]:
    """Every event of the dump's summary by name (Ir; with the cache simulation I1mr, D1mr, ... Bcm, Bim)."""
    names: list[str] = []
    with part.open() as lines:
        for line in lines:
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith("summary:"):
                return dict(zip(names, map(int, line.split()[1:])))
    return {}


def misses(events: dict[str, int]) -> dict[str, int]:
    """The simulated misses of a dump: instruction fetches and data accesses missing L1 and missing the
    L2, and mispredicted branches (empty without the cache simulation)."""
    if "I1mr" not in events:
        return {}
    return {
        "I1 misses": events["I1mr"], "D1 misses": events["D1mr"] + events["D1mw"],
        "L2 misses": events["ILmr"] + events["DLmr"] + events["DLmw"],
        "mispredicted branches": events.get("Bcm", 0) + events.get("Bim", 0),
    }


def top_functions(part: Path, limit: int = 25) -> list[tuple[int, str]]:
    """(self instructions, function) of the dump's costliest functions (callgrind_annotate)."""
    done = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", str(part)], capture_output=True, text=True, check=True)
    rows = []
    for line in done.stdout.splitlines():
        fields = line.strip().split(None, 2)
        if len(fields) == 3 and fields[0].replace(",", "").isdigit() and "PROGRAM TOTALS" not in fields[2]:
            rows.append((int(fields[0].replace(",", "")), fields[2].split(" [")[0]))
    return rows[:limit]


# ---------------------------------------------------------------------------------------------- wall time
def wall_step_s(step: Callable[[], None], steps: int, config: str, records: Path) -> dict[str, Any]:
    """Wall and process CPU seconds per step of `steps` timed steps, after half as many untimed ones
    inside the configuration (the dense start and the first scans fall there), and the session's
    events in the timed part."""
    for _ in range(20):
        step()
    context = config_context(config, step, records)
    collections = [0]

    def count_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections[0] += 1

    with context:
        for _ in range(steps // 2):
            step()
        before = session_facts(context)
        gc.callbacks.append(count_collection)
        wall0, cpu0, thread0 = time.perf_counter(), time.process_time(), time.thread_time()
        for _ in range(steps):
            step()
        wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
        thread_s = time.thread_time() - thread0
        gc.callbacks.remove(count_collection)
        after = session_facts(context)
    events = {key: after[key] - before[key] for key in after if key != "stride"}
    events["gc_collections"] = collections[0]
    return {"wall_s": wall_s / steps, "cpu_s": cpu_s / steps, "thread_s": thread_s / steps, "events": events}


def aba(configs: tuple[str, ...], rounds: int, steps: int) -> dict[str, dict[str, Any]]:
    """A-B-A rounds per configuration: median and quartiles of config / mean(the two bare runs around
    it), of wall time and of the process's CPU time; and the session's events per timed step."""
    import torch

    torch.set_num_threads(1)
    step = make_step()
    records = Path(tempfile.mkdtemp(prefix="torchmem-instr-records-"))
    rows: dict[str, dict[str, Any]] = {}
    bare_s: list[float] = []
    bare_collections: list[float] = []
    for config in configs:
        if config == "bare":
            continue
        ratios: dict[str, list[float]] = {"wall_s": [], "thread_s": [], "cpu_s": []}
        events = []
        for _ in range(rounds):
            before = wall_step_s(step, steps, "bare", records)
            timed = wall_step_s(step, steps, config, records)
            after = wall_step_s(step, steps, "bare", records)
            bare_s += [before["wall_s"], after["wall_s"]]
            bare_collections.append((before["events"]["gc_collections"] + after["events"]["gc_collections"]) / 2 / steps)
            for key, values in ratios.items():
                values.append(timed[key] / ((before[key] + after[key]) / 2))
            events.append(timed["events"])
        rows[config] = {
            "wall": percent_quartiles(ratios["wall_s"]), "thread": percent_quartiles(ratios["thread_s"]),
            "cpu": percent_quartiles(ratios["cpu_s"]),
            "events_per_step": {key: statistics.median(e[key] for e in events) / steps for key in events[0]},
        }
    rows["bare"] = {"step_s": statistics.median(bare_s), "gc_collections_per_step": statistics.median(bare_collections or [0.0])}
    return rows


def percent_quartiles(ratios: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of ratios, as percent above 1."""
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return ((statistics.median(ratios) - 1) * 100, (q[0] - 1) * 100, (q[2] - 1) * 100)


# ---------------------------------------------------------------------------------------------- attribution
#: the layers of the step path, each switched on and off between two blocks of steps in one process
LAYERS = (
    "torch's optimizer hook point, no-op callback",
    "backward engine wrap, pass-through",
    "the step hooks, no-op callbacks",
    "the session's tick, nothing due (sampler asleep)",
    "idle thread waking every 100 ms",
    "idle thread waking every 10 ms",
)


def pass_through_backward() -> AbstractContextManager[Any]:
    """`torch.autograd._engine_run_backward` wrapped by a function that only calls it."""
    import torch.autograd

    @contextmanager
    def wrapped() -> Iterator[None]:
        original = getattr(torch.autograd, "_engine_run_backward")

        def run_backward(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **kwargs)

        setattr(torch.autograd, "_engine_run_backward", run_backward)
        try:
            yield
        finally:
            setattr(torch.autograd, "_engine_run_backward", original)

    return wrapped()


def layer_toggle(layer: str, step: Callable[[], None], records: Path) -> tuple[Callable[[], AbstractContextManager[Any]], AbstractContextManager[Any]]:
    """(what switches the layer on for one block, what the whole measurement of the layer runs in)."""
    from torchmem_magic.tracing.hooks import TrainingHooks

    if layer == LAYERS[0]:
        return optimizer_hook_only, nullcontext()
    if layer == LAYERS[1]:
        return pass_through_backward, nullcontext()
    if layer == LAYERS[2]:
        return lambda: TrainingHooks(lambda clock: None, lambda loader_pass: None), nullcontext()
    if layer == LAYERS[3]:
        session = memwatch_session(10_000.0, step, records)

        @contextmanager
        def active() -> Iterator[None]:
            hooks = session._hooks
            hooks.active = True
            try:
                yield
            finally:
                hooks.active = False

        @contextmanager
        def around() -> Iterator[None]:
            with session:
                for _ in range(84):
                    step()  # past the dense start
                nothing_due(session)
                session._hooks.active = False  # the hooks stay installed: the layer is what an active one adds
                yield

        return active, around()
    return lambda: idle_thread(0.1 if "100 ms" in layer else 0.01), nullcontext()


def attribution(layers: tuple[str, ...], pairs: int, block_steps: int) -> dict[str, tuple[float, float, float]]:
    """Per layer, the median and quartiles (percent) of the training thread's CPU time in a block with the
    layer on over the block before it without: `pairs` pairs of `block_steps` steps, in one process."""
    import torch

    torch.set_num_threads(1)
    step = make_step()
    records = Path(tempfile.mkdtemp(prefix="torchmem-instr-records-"))
    for _ in range(200):
        step()

    def block() -> float:
        started = time.thread_time()
        for _ in range(block_steps):
            step()
        return time.thread_time() - started

    shares = {}
    for layer in layers:
        switch_on, around = layer_toggle(layer, step, records)
        ratios = []
        with around:
            for _ in range(pairs):
                without = block()
                with switch_on():
                    with_layer = block()
                ratios.append(with_layer / without)
        shares[layer] = percent_quartiles(ratios)
        print(f"# {layer}: {shares[layer][0]:+.2f}% ({shares[layer][1]:+.2f} … {shares[layer][2]:+.2f})", file=sys.stderr)
    return shares


def attribution_rows(
    counts: dict[str, Any], shares: dict[str, tuple[float, float, float]], wall: dict[str, Any], interval_s: float
) -> list[tuple[str, float | None, float | None, tuple[float, float, float] | None]]:
    """(cause, instructions per step, share of a bare step's instructions, share of its time with quartiles)
    that add up to the session's A-B-A difference of the training thread's CPU time; None where not known."""
    per_call, per_step = counts["per_call"], counts["per_step"]
    bare = per_step.get("bare", {}).get("per_step") or bare_step(per_call)
    instructions = {
        LAYERS[0]: per_step.get("optimizer hook, no-op", {}).get("per_step", bare) - bare,
        LAYERS[2]: per_step.get("all step hooks, no-op callbacks", {}).get("per_step", bare) - bare,
        LAYERS[3]: per_call["step in a session, nothing due"] - bare_step(per_call)
        - (per_step.get("all step hooks, no-op callbacks", {}).get("per_step", bare) - bare),
    }
    events = wall.get("events_per_step", {})
    sample = (per_call["optimizer tick, sampled"] - per_call["optimizer tick, not sampled"]) * events.get("step_samples", 0.0)
    scan = per_call["holder scan"] * events.get("scans", 0.0)
    idle = LAYERS[4] if interval_s >= 0.1 else LAYERS[5]
    rows: list[tuple[str, float | None, float | None, tuple[float, float, float] | None]] = []
    for layer in (LAYERS[0], LAYERS[2], LAYERS[3]):
        name, instr, share = layer, instructions[layer], shares.get(layer)
        if layer == LAYERS[2]:  # what the hooks add over torch's hook point
            name, instr = "the step hooks' own wraps and checks", instr - instructions[LAYERS[0]]
            share = minus(share, shares.get(LAYERS[0]))
        rows.append((name, instr, instr / bare * 100, share))
    for name, instr in (("step samples (at the timed runs' rate)", sample), ("holder scans (at the timed runs' rate)", scan)):
        rows.append((name, instr, instr / bare * 100, (instr / bare * 100,) * 3))  # long runs of code: at the step's pace
    rows.append((f"the sampler thread's wake-ups ({idle})", None, None, shares.get(idle)))
    return rows


def minus(a: tuple[float, float, float] | None, b: tuple[float, float, float] | None) -> tuple[float, float, float] | None:
    """The median of a less b's (the quartiles: a's spread around that)."""
    if a is None or b is None:
        return None
    return (a[0] - b[0], a[1] - b[0], a[2] - b[0])


# ---------------------------------------------------------------------------------------------- the tables
def instruction_counts(configs: list[str], steps: int, warmup_steps: int, calls: int, cache_sim: bool = False) -> dict[str, Any]:
    """Instructions per step of each configuration (training thread), and per call of each component;
    with `cache_sim`, each configuration's simulated misses per step too."""
    work = Path(tempfile.mkdtemp(prefix="torchmem-instr-"))
    if client_library(work) is None or shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind, valgrind/callgrind.h and a C compiler")
    per_step = {}
    for config in configs:
        run = run_callgrind(config, steps, warmup_steps, work, cache_sim)
        instructions, _ = run["dumps"]["measured steps"]
        missed = {name: n / steps for name, n in misses(run["events"]["measured steps"]).items()}
        per_step[config] = {
            "per_step": instructions / steps, "misses_per_step": missed, "facts": run["after"],
            "file": run["dumps"]["measured steps"][1],
        }
        print(f"# {config}: {instructions / steps:,.0f} instructions per step {missed or ''}", file=sys.stderr)
    components = run_callgrind("components", calls, 0, work)
    per_call = {name: components["dumps"][name][0] / n for name, n in components["calls"].items()}
    files = {name: components["dumps"][name][1] for name in components["calls"]}
    return {"per_step": per_step, "per_call": per_call, "files": files}


def component_rows(per_call: dict[str, float], events_per_step: dict[str, float], interval_s: float) -> list[tuple[str, float, float]]:
    """(part, instructions per event, events per step) of a session's cost at full speed."""
    step_s = events_per_step.get("step_s", 0.0)
    reading = per_call["sampler reading"]
    bare = bare_step(per_call)
    return [
        ("step hooks and tick, nothing due", per_call["step in a session, nothing due"] - bare, 1.0),
        ("step sample (extra over a tick)", per_call["optimizer tick, sampled"] - per_call["optimizer tick, not sampled"], events_per_step.get("step_samples", 0.0)),
        ("holder scan", per_call["holder scan"], events_per_step.get("scans", 0.0)),
        ("sampler reading (sampler thread)", reading, events_per_step.get("readings", step_s / interval_s)),
        ("flight record flush (sampler thread)", per_call["flight record flush after 5 readings"] - 5 * reading, step_s / 0.5),
    ]


def bare_step(per_call: dict[str, float]) -> float:
    """A bare step's instructions: the mean of the steps before and after the session, in the same process."""
    return (per_call["bare step"] + per_call.get("bare step, after the session", per_call["bare step"])) / 2


def print_tables(counts: dict[str, Any] | None, walls: dict[str, dict[str, Any]], shares: dict[str, tuple[float, float, float]] | None = None) -> None:
    bare_step_s = walls.get("bare", {}).get("step_s", 219e-6)
    for config, wall in walls.items():
        if config != "bare":
            wall["bare_gc_collections_per_step"] = walls.get("bare", {}).get("gc_collections_per_step", 0.0)
    if shares:
        print("\n**Layers switched on and off** (training thread CPU, block with over block without; median and quartiles):\n")
        print("| layer | share of a step's time |")
        print("|---|---|")
        for layer, share in shares.items():
            print(f"| {layer} | {share[0]:+.2f}% ({share[1]:+.2f} … {share[2]:+.2f}) |")
    if counts is None:
        for config, wall in walls.items():
            if config != "bare":
                print(f"{config}: A-B-A wall {pct(wall, 'wall')}, training thread CPU {pct(wall, 'thread')}, process CPU {pct(wall, 'cpu')}, events per step {wall['events_per_step']}")
    else:
        bare = bare_step(counts["per_call"])
        print("\n**Instructions per step** (training thread, callgrind) and A-B-A (wall, process CPU; median and quartiles):\n")
        print("| configuration | instructions/step | vs bare | A-B-A wall | A-B-A training thread CPU | A-B-A process CPU |")
        print("|---|---|---|---|---|---|")
        whole = counts["per_step"].get("bare", {}).get("per_step") or bare
        for config in (*CONFIGS, ASLEEP):
            row = counts["per_step"].get(config)
            timed = walls.get(config)
            instr = "—" if row is None else f"{row['per_step']:,.0f}"
            vs = "—" if row is None else f"{(row['per_step'] / whole - 1) * 100:+.2f}%"
            print(f"| {config} | {instr} | {vs} | {pct(timed, 'wall')} | {pct(timed, 'thread')} | {pct(timed, 'cpu')} |")
        missed = {c: r["misses_per_step"] for c, r in counts["per_step"].items() if r.get("misses_per_step")}
        if missed:
            names = list(next(iter(missed.values())))
            print("\n**Simulated misses per step** (callgrind's cache and branch simulation, training thread):\n")
            print(f"| configuration | {' | '.join(names)} |")
            print(f"|---|{'---|' * len(names)}")
            for config, row in missed.items():
                print(f"| {config} | {' | '.join(f'{row[n]:,.0f}' for n in names)} |")
        print("\n**Components** (instructions per call, callgrind):\n")
        print("| part | instructions per call |")
        print("|---|---|")
        for name, value in counts["per_call"].items():
            print(f"| {name} | {value:,.0f} |")
        for config in ("memwatch -q, 100 ms", "memwatch -q, 10 ms"):
            wall = walls.get(config)
            events = dict(wall["events_per_step"]) if wall else {}
            events["step_s"] = bare_step_s
            interval_s = 0.1 if "100 ms" in config else 0.01
            rows = component_rows(counts["per_call"], events, interval_s)
            total = sum(cost * rate for _, cost, rate in rows)
            print(f"\n**{config}: the parts at full speed** (events per step from the timed runs; bare step {bare:,.0f} instructions, {bare_step_s * 1e6:.0f} µs):\n")
            print("| part | instructions per event | events per step | instructions per step | share of a bare step |")
            print("|---|---|---|---|---|")
            for name, cost, rate in rows:
                print(f"| {name} | {cost:,.0f} | {rate:.5f} | {cost * rate:,.0f} | {cost * rate / bare * 100:.3f}% |")
            print(f"| total | | | {total:,.0f} | {total / bare * 100:.2f}% |")
            if wall:
                print(f"\nA-B-A: wall {pct(wall, 'wall')}, training thread CPU {pct(wall, 'thread')}, process CPU {pct(wall, 'cpu')}")
            if wall and shares:
                print_attribution(attribution_rows(counts, shares, wall, interval_s), wall, config)


def print_attribution(rows: list[tuple[str, float | None, float | None, tuple[float, float, float] | None]], wall: dict[str, Any], config: str) -> None:
    """The session's A-B-A difference of the training thread's CPU time, cause by cause, and what is left."""
    whole = wall["thread"][0]
    print(f"\n**{config}: the training thread's A-B-A difference ({whole:+.1f}%), cause by cause** (time: layers switched on and off every block of steps, median and quartiles; *time per instruction*: the time share over the instruction share):\n")
    print("| cause | instructions/step | share of a bare step's instructions | share of its time | time per instruction vs the step's |")
    print("|---|---|---|---|---|")
    explained = 0.0
    for name, instr, instr_share, time_share in rows:
        instr_text = "—" if instr is None else f"{instr:,.0f}"
        share_text = "—" if instr_share is None else f"{instr_share:.2f}%"
        if time_share is None:
            print(f"| {name} | {instr_text} | {share_text} | — | — |")
            continue
        explained += time_share[0]
        spread = "" if time_share[1] == time_share[2] else f" ({time_share[1]:+.1f} … {time_share[2]:+.1f})"
        # a ratio says something only where the layer executes instructions of its own (not a few hundred, noise)
        ratio = "—" if instr_share is None or instr_share < 0.1 or time_share[1] == time_share[2] else f"{time_share[0] / instr_share:.1f}x"
        print(f"| {name} | {instr_text} | {share_text} | {time_share[0]:+.2f}%{spread} | {ratio} |")
    print(f"| not explained by the rows above | | | {whole - explained:+.2f}% | |")
    print(f"| the whole A-B-A difference (training thread CPU) | | | {whole:+.2f}% ({wall['thread'][1]:+.1f} … {wall['thread'][2]:+.1f}) | |")
    collections = wall["events_per_step"].get("gc_collections")
    if collections is not None:
        print(f"\ngc collections per step: {collections:.5f} in the session, {wall.get('bare_gc_collections_per_step', 0.0):.5f} bare")


def pct(row: dict[str, Any] | None, key: str) -> str:
    if row is None or key not in row:
        return "—"
    median, low, high = row[key]
    return f"{median:+.1f}% ({low:+.1f} … {high:+.1f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=4, metavar=("CONFIG", "STEPS", "WARMUP", "DIR"))
    parser.add_argument("--steps", type=int, default=400, help="steps counted under callgrind per configuration")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--calls", type=int, default=300, help="calls of each component under callgrind")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--wall-steps", type=int, default=6000)
    parser.add_argument("--no-wall", action="store_true")
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), help="timed A-B-A")
    parser.add_argument("--callgrind-configs", nargs="*", default=list(CALLGRIND_CONFIGS))
    parser.add_argument("--annotate", action="store_true", help="print each dump's costliest functions")
    parser.add_argument("--cache-sim", action="store_true", help="simulated cache misses and branches per step too")
    parser.add_argument("--no-attribution", action="store_true")
    parser.add_argument("--pairs", type=int, default=150, help="on/off pairs of blocks per layer")
    parser.add_argument("--block-steps", type=int, default=300)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--from-json", type=Path, help="print the tables of figures written by --json, measuring nothing")
    args = parser.parse_args()
    if args.child:
        config, steps, warmup, directory = args.child
        return child(config, int(steps), int(warmup), Path(directory))
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        print_tables(saved["counts"], saved["walls"], saved.get("shares"))
        print(f"\nload average at the end of that run: {saved.get('loadavg', '?')}")
        return
    walls = {} if args.no_wall else aba(tuple(args.configs), args.rounds, args.wall_steps)
    shares = None if args.no_attribution else attribution(LAYERS, args.pairs, args.block_steps)
    counts = None if args.no_callgrind else instruction_counts(args.callgrind_configs, args.steps, args.warmup, args.calls, args.cache_sim)
    if args.json:
        args.json.write_text(json.dumps({"walls": walls, "counts": counts, "shares": shares, "loadavg": loadavg()}, indent=1))
    if args.annotate and counts is not None:
        for name, path in [*((c, r["file"]) for c, r in counts["per_step"].items()), *counts["files"].items()]:
            print(f"== {name}")
            for cost, function in top_functions(Path(path)):
                print(f"{cost:>14,} {function}")
    print_tables(counts, walls, shares)
    print(f"\nload average at the end: {loadavg()}")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
