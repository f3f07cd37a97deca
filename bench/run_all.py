"""Runs the benchmarks and rewrites the table between the bench markers in README.md.

Run: make bench   (figures depend on the machine; the README says which one produced them)
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import costs  # noqa: E402
import holder_tracking  # noqa: E402
import overhead  # noqa: E402
import scan_speed  # noqa: E402
import torch  # noqa: E402
import verdicts  # noqa: E402

README = Path(__file__).resolve().parent.parent / "README.md"


def machine_speed() -> str:
    """Two calibration figures, so runs on the same (shared, noisy) machine on different days compare."""
    python_ns = min(timeit.repeat("sum(range(50))", number=100_000, repeat=5)) / 100_000 * 1e9
    with open("/proc/self/statm", "rb", buffering=0) as statm:
        proc_us = min(timeit.repeat(lambda: (statm.seek(0), statm.read()), number=10_000, repeat=5)) / 10_000 * 1e6
    return f"`sum(range(50))` {python_ns:.0f} ns, a kept-open /proc read {proc_us:.1f} µs"


def render() -> str:
    torch.set_num_threads(1)
    lines = [
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"one torch thread; its speed that day: {machine_speed()}. Produced by `make bench` on {datetime.date.today()}.",
        "",
        "**Training-loop overhead** in the steady state, after the first 64 steps (9 rounds of "
        "baseline–memwatch–baseline; median of per-round ratios and their quartiles; *own CPU*: the CPU time "
        "memwatch's sampler thread and step samples used, as a share of the run's wall time — the part of the "
        "cost that the machine's noise does not blur; *dense start*: the one-off CPU time of sampling the "
        "first 64 steps):",
        "",
        "| workload | configuration | ms/step | overhead (quartiles) | own CPU | dense start |",
        "|---|---|---|---|---|---|",
    ]
    for row in overhead.run():
        if row["config"] == "baseline":
            lines.append(f"| {row['workload']} | without memwatch | {row['ms_per_step']:.3f} | — | — | — |")
        else:
            low, high = row["overhead_iqr_pct"]
            lines.append(
                f"| {row['workload']} | {row['config']} | {row['ms_per_step']:.3f} | {row['overhead_pct']:+.1f}% "
                f"({low:+.1f}% … {high:+.1f}%) | {row['own_cpu_pct']:.2f}% | {row['dense_start_ms']:.1f} ms |"
            )
    lines += ["", "**Hot-path costs** (median µs per call):", "", "| path | µs |", "|---|---|"]
    for name, us in costs.hot_path_costs().items():
        lines.append(f"| {name} | {us:.2f} |")
    day = costs.day_long_buffers()
    lines += [
        "",
        f"**Sampler memory over 24 h** at the default 100 ms interval: {day['rows_fed']:,} samples fed, "
        f"{day['rows_kept']:,} rows kept, buffers {day['buffer_kib']:.0f} KiB "
        f"(tracemalloc peak while feeding {day['traced_peak_kib']:.0f} KiB).",
    ]
    namespace = scan_speed.build_namespace()
    default = scan_speed.run(namespace=namespace)
    full = scan_speed.run(repeats=3, budget=scan_speed.UNLIMITED, namespace=namespace)
    lines += [
        "",
        "**Leak finder speed**: a namespace with 10,000 kept loss tensors (with graphs) and 250,000 records "
        "(~1.25 M Python objects, 500 k of them containers; target: under 1 s). Median of 5 scans (3 without limits):",
        "",
        "| budget | time | containers reached | truncated | top suspect |",
        "|---|---|---|---|---|",
        f"| default (what `%%memwatch` / `%memcheck` use) | {default['median_s']:.2f} s | {default['objects']:,} "
        f"| {'yes' if default['truncated'] else 'no'} | {default['top']} |",
        f"| no limits | {full['median_s']:.2f} s | {full['objects']:,} | {'yes' if full['truncated'] else 'no'} "
        f"| {full['top']} |",
        "",
        f"With this namespace alive, the `gc.collect()` a session runs before its first sample takes "
        f"{scan_speed.collect_s():.2f} s.",
    ]
    return "\n".join(lines)


def render_holders() -> str:
    rows = holder_tracking.run(rounds=3)
    lines = [
        f"Loop: MLP 256-1024-10, batch 128, {holder_tracking.STEPS} steps, with 10,000 graph-holding losses and "
        "500,000 small dicts alive beside it; median of 3 runs. *Scans' share*: the mid-run scans' wall time "
        "over the loop's (the one-off 30 ms start allowance included, so short runs show more than 1%).",
        "",
        "| loop | wall time | scans | scans' share | holder named live at step | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        named = "—" if r["named_at_step"] < 0 else f"{r['named_at_step']:.0f}"
        lines.append(
            f"| {name} | {r['wall_s']:.1f} s | {r['scans']:.0f} | {r['scan_share_pct']:.2f}% | {named} | "
            f"{'leak' if r['verdict_leak'] else 'not a leak'} |"
        )
    return "\n".join(lines)


def replace_section(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no {start} ... {end} section")
    return pattern.sub(lambda _: f"{start}\n{body}\n{end}", text)


def main() -> None:
    """All tables, or only those named on the command line (`python bench/run_all.py verdicts`)."""
    makers = {"bench": render, "holders": render_holders, "verdicts": verdicts.main}
    wanted = sys.argv[1:] or list(makers)
    unknown = set(wanted) - set(makers)
    if unknown:
        raise SystemExit(f"unknown table(s) {sorted(unknown)}; known: {', '.join(makers)}")
    tables = {name: makers[name]() for name in wanted}
    text = README.read_text()
    for name, body in tables.items():
        text = replace_section(text, name, body)
        print(body)
    README.write_text(text)


if __name__ == "__main__":
    main()
