"""Quick runs of the benchmarks, each figure judged against its goal and baseline (`bench/goals.json`).

Prints one table (figure, measured, baseline, goal, status) and exits non-zero when a figure passes its
goal, regresses past its baseline's tolerance, or is not measured. Each benchmark group runs a shorter
version of what `make bench` runs (fewer rounds, the tiny MLP only), through the same functions.

Run: make bench-check
     python bench/check.py [--only GROUP,...] [--update-baselines]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from goals import GOALS_PATH, Measured, Skipped, failed, judge_all, load, save, table, unknown, with_baselines  # noqa: E402

Figures = dict[str, Measured | Skipped]

#: the quick versions' sizes (what `make bench` runs in parentheses)
OVERHEAD_ROUNDS = 5  # A-B-A rounds, tiny MLP only (5, both workloads, 3 configurations)
CELL_ROUNDS, FIRST_CELL_ROUNDS = 7, 4  # (9, 5)
LIVE_REPEATS = 15  # recomputes on the full timeline (41); the simulated runs last 50 s and 15 min (24 h)
SCAN_ROUNDS = 3  # scan and gc.collect() in alternation (5 scans, 3 unlimited)
HOOK_ROUNDS = 7
INSTRUCTION_CALLS = 100  # calls of each component under callgrind (300)


def _quartiles_text(low: float, high: float, unit: str) -> str:
    return f"quartiles {low:.1f} … {high:.1f}{unit}"


def overhead_figures() -> Figures:
    """The A-B-A overhead at 100 ms and 10 ms, process CPU per step (and the tiny MLP's wall time too), and
    memwatch's own CPU share, on the tiny MLP and the DataLoader loop."""
    import overhead

    configs = {"100 ms (default)": "memwatch 100 ms (default)", "10 ms": "memwatch 10 ms"}
    figures: Figures = {}
    for workload, short in ((overhead.TINY, "tiny MLP"), (overhead.LOADER, "DataLoader loop")):
        rows = {row["config"]: row for row in overhead.run(OVERHEAD_ROUNDS, workloads=(workload,), configs=tuple(configs.values()))}
        for label, config in configs.items():
            row = rows[config]
            low, high = row["cpu_overhead_iqr_pct"]
            figures[f"CPU overhead, {short}, {label}"] = Measured(row["cpu_overhead_pct"], detail=_quartiles_text(low, high, " %"))
            if workload == overhead.TINY:
                low, high = row["overhead_iqr_pct"]
                figures[f"overhead, tiny MLP, {label}"] = Measured(row["overhead_pct"], detail=_quartiles_text(low, high, " %"))
            figures[f"own CPU, {short}, {label}"] = Measured(row["own_cpu_pct"])
    return figures


def cell_figures() -> Figures:
    """A cell's fixed cost (live figure, -q) and the first cell's whole-namespace scan, in a real kernel."""
    import cell_cost

    result = cell_cost.run(CELL_ROUNDS, first_rounds=FIRST_CELL_ROUNDS)
    extra = result["extra_s"]["this checkout"]

    def ms(config: str) -> Measured:
        low, mid, high = extra[config]
        return Measured(mid * 1e3, detail=_quartiles_text(low * 1e3, high * 1e3, " ms"))

    low, mid, high = extra[cell_cost.FIRST_CELL]
    return {
        "fixed cost of a cell, live figure": ms("live figure (default)"),
        "fixed cost of a cell, -q": ms("-q (no output)"),
        "first cell's whole-namespace scan (1.5 M objects), -q": Measured(mid, detail=f"quartiles {low:.2f} … {high:.2f} s"),
    }


def live_figures() -> Figures:
    """The live verdict's recompute on a full timeline; the longest gap between redraws of two short
    simulated runs."""
    import live_cost

    full = live_cost.full_timeline_costs(repeats=LIVE_REPEATS)
    figures: Figures = {
        "live verdict, one recompute on a full timeline": Measured(
            statistics.median(full["verdict_s"]) * 1e3, detail=f"p95 {statistics.quantiles(full['verdict_s'], n=20)[-1] * 1e3:.2f} ms"),
    }
    for label, hours, interval_ms in (("50 s at 10 ms", 50 / 3600, 10.0), ("15 min at 1 s", 0.25, 1000.0)):
        run = live_cost.simulated_run(hours, interval_ms)
        longest_s = round(max(run["gaps_s"]), 6)  # differences of simulated times: float noise below a µs
        figures[f"longest gap between redraws, {label}"] = Measured(
            longest_s, detail=f"{run['redraws']:,} redraws, median gap {statistics.median(run['gaps_s']):.2f} s")
    return figures


def scan_figures() -> Figures:
    """The leak finder's whole scan of the 1.25 M-object namespace, against a gc.collect() of it."""
    import scan_speed

    namespace = scan_speed.build_namespace()
    scans_s, collects_s = [], []
    result = None
    for _ in range(SCAN_ROUNDS):
        result = scan_speed.run(repeats=1, budget=scan_speed.UNLIMITED, namespace=namespace)
        scans_s.append(result["median_s"])
        collects_s.append(scan_speed.collect_s(repeats=1))
    assert result is not None
    ratio = statistics.median(s / c for s, c in zip(scans_s, collects_s))
    truncated = ", truncated" if result["truncated"] else ""
    return {"leak finder scan, 1.25 M objects, no limits": Measured(
        statistics.median(scans_s), vs_reference=ratio,
        detail=f"gc.collect() {statistics.median(collects_s):.2f} s; {result['objects']:,} containers{truncated}")}


def memory_figures() -> Figures:
    import own_memory

    result = own_memory.session_memory(1.0)
    return {"memwatch's own memory after a simulated hour at 10 ms": Measured(
        result["kept_kib"], detail=f"buffers {result['buffers_kib']:.0f} KiB, traced peak {result['traced_peak_kib']:.0f} KiB")}


def hook_figures() -> Figures:
    import costs
    import torch

    torch.set_num_threads(1)
    hook_us, reference_us, ratio = costs.unsampled_step_vs_reference(HOOK_ROUNDS)
    return {"step hook, step not sampled": Measured(hook_us, vs_reference=ratio, detail=f"sum(range(50)) {reference_us:.2f} µs")}


SAMPLER_SECONDS = 10.0  # each part of bench/sampler_cost.py (`make bench`: the same)


def sampler_figures() -> Figures:
    """The sampler thread's CPU, the scans' share of the run's, and the GIL wait a reading makes."""
    import sampler_cost
    import torch

    torch.set_num_threads(1)
    shares = sampler_cost.cpu_shares(SAMPLER_SECONDS)
    waits = sampler_cost.gil_wait(SAMPLER_SECONDS)
    readings = f"{shares['readings']:.0f} readings in {SAMPLER_SECONDS:g} s"
    return {
        "sampler thread's CPU, default interval": Measured(shares["sampler_core_pct"], detail=readings),
        "leak finder scans' share of a run's CPU, default interval": Measured(
            shares["scans_run_pct"], detail="the tiny loop's namespace: its step function, model, optimizer, batch"),
        "training thread's wait for the GIL, a reading": Measured(
            waits["wait_per_reading_us"],
            detail=f"stalls {waits['stalled_bare_ms']:.1f} ms bare, {waits['stalled_watched_ms']:.1f} ms watched"),
    }


COUNT_FIGURES = {loop: (f"Python calls a step, {loop}", f"Python lines a step, {loop}", f"scans' Python lines a step, {loop}")
                 for loop in ("plain loop", "DataLoader loop")}


def count_figures() -> Figures:
    """memwatch's Python calls and lines a step on the training thread (counts: load does not move them)."""
    import step_counts
    import torch

    torch.set_num_threads(1)
    figures: Figures = {}
    for loop, (calls, lines, scan_lines) in COUNT_FIGURES.items():
        counted = step_counts.counts(loop)
        figures[calls] = Measured(counted["calls"], detail=f"over {step_counts.COUNTED_STEPS:,} settled steps")
        figures[lines] = Measured(counted["lines"], detail=counted["where"].split(", ")[0])
        figures[scan_lines] = Measured(counted["scan lines"], detail=f"{counted['scan calls']:.2f} calls a step")
    return figures


INSTRUCTION_FIGURES = ("instructions: a step's memwatch path, nothing due", "instructions: optimizer tick, not sampled",
                       "instructions: optimizer tick, sampled", "instructions: sampler reading")


def instruction_figures() -> Figures:
    """Callgrind's counts of the session's parts (deterministic); skipped where valgrind is missing."""
    import instructions

    with tempfile.TemporaryDirectory() as directory:
        if shutil.which("valgrind") is None or instructions.client_library(Path(directory)) is None:
            reason = "needs valgrind, valgrind/callgrind.h and a C compiler"
            return {name: Skipped(reason) for name in INSTRUCTION_FIGURES}
    per_call = instructions.instruction_counts([], 0, 0, INSTRUCTION_CALLS)["per_call"]
    bare = instructions.bare_step(per_call)
    path, not_sampled, sampled, reading = INSTRUCTION_FIGURES
    return {
        path: Measured(per_call["step in a session, nothing due"] - bare, detail=f"bare step {bare:,.0f}"),
        not_sampled: Measured(per_call["optimizer tick, not sampled"]),
        sampled: Measured(per_call["optimizer tick, sampled"]),
        reading: Measured(per_call["sampler reading"]),
    }


#: each group's quick run, in the order they run (the cheap and the memory-sensitive first)
MEASURERS: dict[str, Callable[[], Figures]] = {
    "hooks": hook_figures,
    "memory": memory_figures,
    "live": live_figures,
    "cell": cell_figures,
    "overhead": overhead_figures,
    "scan": scan_figures,
    "instructions": instruction_figures,
    "counts": count_figures,
    "sampler": sampler_figures,
}


def _load_text(load: tuple[float, float, float] | None = None) -> str:
    one, five, fifteen = load or os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def measure(groups: list[str]) -> Figures:
    """Every figure of `groups`; a group that raises is reported and leaves its figures unmeasured."""
    figures: Figures = {}
    for group in groups:
        started = time.perf_counter()
        try:
            figures.update(MEASURERS[group]())
        except Exception:  # one broken benchmark must not hide the others' figures
            print(f"# {group}: the benchmark failed; its figures count as not measured", file=sys.stderr)
            traceback.print_exc()
        print(f"# {group}: {time.perf_counter() - started:.0f} s, {_load_text()}", file=sys.stderr, flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated groups to run: {','.join(MEASURERS)}")
    parser.add_argument("--update-baselines", action="store_true",
                        help="write this run's figures into goals.json as the new baselines (goals untouched)")
    parser.add_argument("--goals", type=Path, default=GOALS_PATH, help="the goals file (default: bench/goals.json)")
    args = parser.parse_args(argv)
    groups = args.only.split(",") if args.only else list(MEASURERS)
    unknown_groups = [group for group in groups if group not in MEASURERS]
    if unknown_groups:
        parser.error(f"unknown group(s) {', '.join(unknown_groups)}; known: {', '.join(MEASURERS)}")
    document, specs = load(args.goals)
    specs = [spec for spec in specs if spec.group in groups]
    load_before = os.getloadavg()
    started = time.perf_counter()
    figures = measure(groups)
    if args.update_baselines:
        document = with_baselines(document, specs, figures)
        save(document, args.goals)
        specs = [spec for spec in load(args.goals)[1] if spec.group in groups]
        print(f"Baselines rewritten in {args.goals} from this run.")
    rows = judge_all(specs, figures)
    load_after = os.getloadavg()
    print(f"bench-check: {', '.join(groups)}; {_load_text(load_before)} before, {_load_text(load_after)} after; "
          f"{time.perf_counter() - started:.0f} s\n")
    print(table(rows))
    if max(load_before[0], load_after[0]) > (os.cpu_count() or 1):
        print("\nThe load average passed the number of cores: the timed figures are noisier than their tolerances assume.")
    strays = unknown(specs, figures)
    for name in strays:
        print(f"FAIL: {name!r} was measured but goals.json does not list it")
    return 1 if failed(rows) or strays else 0


if __name__ == "__main__":
    sys.exit(main())
