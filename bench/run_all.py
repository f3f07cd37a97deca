"""Runs the benchmarks and rewrites the table between the bench markers in README.md.

Run: make bench   (figures depend on the machine; the README says which one produced them)
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import costs  # noqa: E402
import overhead  # noqa: E402
import scan_speed  # noqa: E402
import torch  # noqa: E402
import verdicts  # noqa: E402

README = Path(__file__).resolve().parent.parent / "README.md"


def render() -> str:
    torch.set_num_threads(1)
    lines = [
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
        "one torch thread. Produced by `make bench`.",
        "",
        "**Training-loop overhead** (9 rounds of baseline–memwatch–baseline; median of per-round ratios):",
        "",
        "| workload | configuration | ms/step | overhead |",
        "|---|---|---|---|",
    ]
    for row in overhead.run():
        if row["config"] == "baseline":
            lines.append(f"| {row['workload']} | without memwatch | {row['ms_per_step']:.3f} | — |")
        else:
            lines.append(
                f"| {row['workload']} | {row['config']} | {row['ms_per_step']:.3f} | {row['overhead_pct']:+.1f}% |"
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
        "(~1.25 M Python objects, 500 k of them containers). Median of 5 scans:",
        "",
        "| budget | time | objects visited | truncated | top suspect |",
        "|---|---|---|---|---|",
        f"| default (what `%%memwatch` / `%memcheck` use) | {default['median_s']:.2f} s | {default['objects']:,} "
        f"| {'yes' if default['truncated'] else 'no'} | {default['top']} |",
        f"| no limits | {full['median_s']:.2f} s | {full['objects']:,} | {'yes' if full['truncated'] else 'no'} "
        f"| {full['top']} |",
    ]
    return "\n".join(lines)


def replace_section(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no {start} ... {end} section")
    return pattern.sub(lambda _: f"{start}\n{body}\n{end}", text)


def main() -> None:
    tables = {"bench": render(), "verdicts": verdicts.main()}
    text = README.read_text()
    for name, body in tables.items():
        text = replace_section(text, name, body)
        print(body)
    README.write_text(text)


if __name__ == "__main__":
    main()
