"""Runs the benchmarks and rewrites each table between its markers in the docs pages (`PAGES`).

Run: make bench   (figures depend on the machine; each table says which one produced it)
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

import cell_cost  # noqa: E402
import costs  # noqa: E402
import holder_search  # noqa: E402
import holder_tracking  # noqa: E402
import live_cost  # noqa: E402
import overhead  # noqa: E402
import own_memory  # noqa: E402
import peers  # noqa: E402
import ranks  # noqa: E402
import scale  # noqa: E402
import scan_speed  # noqa: E402
import store_scale  # noqa: E402
import torch  # noqa: E402
import verdicts  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: the docs page that holds each table, between `<!-- NAME:start -->` and `<!-- NAME:end -->`
PAGES = {
    "bench": DOCS / "benchmarks.md",
    "holders": DOCS / "leak-finder.md",
    "search": DOCS / "leak-finder.md",
    "verdicts": DOCS / "verdicts.md",
    "ranks": DOCS / "benchmarks.md",
    "peers": DOCS / "benchmarks.md",
    "live": DOCS / "benchmarks.md",
    "scale": DOCS / "benchmarks.md",
    "store": DOCS / "benchmarks.md",
}


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
        "**Training-loop overhead** in the steady state, with the leak finder and the flight recorder on as in "
        "`%%memwatch`: each run first makes half as many untimed steps inside the block (about a second), then "
        "times ~1.3 s of steps (5 rounds of baseline–memwatch–baseline in one process; median of per-round ratios "
        "and their quartiles, of the wall time and of the process's CPU time per step; *own CPU*: the CPU time memwatch's sampler thread, step samples and holder scans used in "
        "the timed part, as a share of its wall time — the part of the cost that the machine's noise does not "
        "blur; *start*: the one-off CPU time of the untimed first second: the dense samples of the first 64 "
        "steps and the leak finder's first scans):",
        "",
        "| workload | configuration | ms/step | wall overhead (quartiles) | CPU overhead (quartiles) | own CPU | start |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in overhead.run():
        if row["config"] == "baseline":
            lines.append(f"| {row['workload']} | without memwatch | {row['ms_per_step']:.3f} | — | — | — | — |")
        else:
            (low, high), (cpu_low, cpu_high) = row["overhead_iqr_pct"], row["cpu_overhead_iqr_pct"]
            lines.append(
                f"| {row['workload']} | {row['config']} | {row['ms_per_step']:.3f} | {row['overhead_pct']:+.1f}% "
                f"({low:+.1f}% … {high:+.1f}%) | {row['cpu_overhead_pct']:+.1f}% ({cpu_low:+.1f}% … {cpu_high:+.1f}%) "
                f"| {row['own_cpu_pct']:.2f}% | {row['dense_start_ms']:.1f} ms |"
            )
    lines += ["", "**Hot-path costs** (median µs per call):", "", "| path | µs |", "|---|---|"]
    for name, us in costs.hot_path_costs().items():
        lines.append(f"| {name} | {us:.2f} |")
    lines += [
        "",
        "**Memory of memwatch itself**: a session's run simulated on its own code paths (real probes, a simulated "
        "clock; 200 optimizer steps a second); *alive*: what memwatch's modules allocated and still hold at the end "
        "(tracemalloc). A day's readings are too many to take one by one: past the first hour, the rest of the day "
        "is fed to the time series directly.",
        "",
        own_memory.render(),
        "",
        "**Fixed cost of a cell** (`bench/cell_cost.py`): " + cell_cost.render(),
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


def render_live() -> str:
    """The live view's cost on a full timeline, and its redraws over a simulated day (~13 min to run)."""
    runs = [live_cost.simulated_run(24.0, 1000.0), live_cost.simulated_run(50 / 3600, 10.0)]
    return live_cost.render(live_cost.full_timeline_costs(), runs)


def render_holders() -> str:
    rows = holder_tracking.run(rounds=3)
    lines = [
        f"Loop: MLP 256-1024-10, batch 128, {holder_tracking.STEPS} steps, with 10,000 graph-holding losses and "
        "500,000 small dicts alive beside it; median of 3 runs. *Scans' share*: the mid-run scans' wall time "
        "over the loop's (the one-off start allowance included, 60 ms of CPU time, so short runs show more than 1%).",
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


def _q(quartiles: tuple[float, float, float], fmt: str, scale: float = 1.0, shift: float = 0.0) -> str:
    """A median with its quartiles: `1.23 (1.10 … 1.40)`."""
    low, mid, high = ((v + shift) * scale for v in quartiles)
    return f"{mid:{fmt}} ({low:{fmt}} … {high:{fmt}})"


def render_ranks() -> str:
    load_before = os.getloadavg()[0]
    results = ranks.run()
    long_run = results["long_run"]
    cores = results["cores"]
    lines = [
        f"Machine: {cores} cores, Python {platform.python_version()}, torch {torch.__version__}; load average "
        f"{load_before:.1f} before the runs and {os.getloadavg()[0]:.1f} after (other work on the machine shows "
        f"there); produced by `make bench` on {datetime.date.today()}. A DDP loop (gloo on CPU, MLP 128-256-10, batch 32) forked with "
        f"`torch.multiprocessing.start_processes`, bare and under `memwatch(quiet=True)` at the default interval, "
        f"in rounds of bare–watched–bare launches; each rank times its own {ranks.TIMED_STEPS} steps after the "
        f"first {ranks.DENSE_START_STEPS}. Step times: medians of each rank's median, with quartiles; *ratio*: "
        "watched over bare, per round and rank; *own CPU*: the CPU time each watched rank's session used "
        "(sampler thread, step samples, holder scans) as a share of its timed loop's wall time.",
        "",
        "| ranks | rank-runs | bare ms/step | watched ms/step | watched / bare | own CPU per rank |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["overhead"]:
        share = "—" if row["own_cpu_share"] is None else _q(row["own_cpu_share"], ".2f", 100) + " %"
        crowded = " (more processes than cores)" if row["world"] > cores else ""
        lines.append(
            f"| {row['world']}{crowded} | {row['rank_runs']} | {_q(row['bare_ms'], '.3f')} | "
            f"{_q(row['watched_ms'], '.3f')} | {_q(row['ratio'], '.3f')} | {share} |"
        )
    lines += [
        "",
        f"With {cores} cores, 4 ranks oversubscribe the machine: every rank waits in each all-reduce for the "
        "others to be scheduled, so its step time measures the machine's crowding as much as memwatch. The "
        "own-CPU column is the figure that crowding does not blur.",
        "",
        f"Over a longer run (2 ranks, {long_run['steps']:,} timed steps, {long_run['wall_s']:.0f} s) a rank's own CPU "
        f"is {long_run['own_cpu_share'] * 100:.2f}%: the start's one-off costs (the holder scans' first allowance, the "
        "dense first samples) weigh on a loop of a second, not on one of minutes.",
        "",
        "**Transport** (forked `RankSender`s sending as fast as a `RankSink` takes their messages; receive and "
        "JSON decode included, as the watcher's sampler thread does them; *drained*: continuously, or once per "
        "default interval as the watcher does):",
        "",
        "| senders | events per message | bytes per message | drained | messages/s | MB/s |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["throughput"]:
        drained = f"every {row['poll_s'] * 1e3:.0f} ms" if row["poll_s"] else "continuously"
        lines.append(
            f"| {row['senders']} | {row['events']} | {row['bytes']:,} | {drained} | {row['messages_per_s']:,.0f} | "
            f"{row['mb_per_s']:.1f} |"
        )
    codec = results["codec_us"]
    stream = results["stream"]
    queue = results["queue_length"]
    lines += [
        "",
        "One message costs its rank " + ", ".join(f"{codec[e][0]:.0f} µs to encode" + f" ({e} events)" for e in codec)
        + " and the watcher " + ", ".join(f"{codec[e][1]:.0f} µs to decode ({e} events)" for e in codec) + ".",
    ]
    if queue is not None:
        lines.append(
            f"Linux queues at most {queue + 1} datagrams on the watcher's socket (`net.unix.max_dgram_qlen` = {queue} "
            "here; the socket's 4 MiB buffer does not raise it). A read goes on while senders refill the queue, so big "
            "messages (slow to decode) drain almost as fast once per interval as continuously, while small ones come "
            "about a queue's worth per read; whatever does not fit waits in the ranks' outboxes for their next send, a "
            "quarter second later."
        )
    lines += [
        "",
        f"What a watched rank of the loop above streams at the default interval: {stream['bytes_per_s'] / 1024:.1f} KiB/s "
        f"in {stream['messages_per_s']:.1f} messages/s ({stream['bytes_per_message']:,.0f} B each; its start, "
        "dense first steps and final message included).",
    ]
    return "\n".join(lines)


def render_store() -> str:
    """The job store's load from 8 to 1,024 ranks, simulated at the real rate (~3 min)."""
    load_before = os.getloadavg()[0]
    results = store_scale.run()
    return store_scale.render(results, load_before, os.getloadavg()[0])


def replace_section(text: str, name: str, body: str, where: str = "the page") -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{where} has no {start} ... {end} section")
    return pattern.sub(lambda _: f"{start}\n{body}\n{end}", text)


def write_tables(tables: dict[str, str]) -> None:
    """Each table into its page (`PAGES`), between its markers; a page is written once, after all its tables."""
    for page in dict.fromkeys(PAGES[name] for name in tables):
        text = page.read_text()
        for name, body in tables.items():
            if PAGES[name] == page:
                text = replace_section(text, name, body, where=str(page.relative_to(DOCS.parent)))
        page.write_text(text)


def main() -> None:
    """All tables, or only those named on the command line (`python bench/run_all.py verdicts`)."""
    makers = {"bench": render, "holders": render_holders, "search": holder_search.render, "verdicts": verdicts.main, "ranks": render_ranks,
              "peers": peers.render, "live": render_live, "scale": scale.render, "store": render_store}
    wanted = sys.argv[1:] or list(makers)
    unknown = set(wanted) - set(makers)
    if unknown:
        raise SystemExit(f"unknown table(s) {sorted(unknown)}; known: {', '.join(makers)}")
    tables = {name: makers[name]() for name in wanted}
    for body in tables.values():
        print(body)
    write_tables(tables)


if __name__ == "__main__":
    main()
