"""The fixed cost of a `%%memwatch` cell: what a cell whose body is `pass` costs over a bare `pass` cell,
in a real kernel whose namespace holds 500,000 small dicts (1 M+ objects) and 10,000 tensors.

Each cell's time is taken inside the kernel, from IPython's `pre_run_cell` to its `post_run_cell`
event (the magic, its scans, the live figure's widgets and the report's display included; the
messages' trip to the client not). Bare and watched cells alternate, after one watched cell that
pays the first scan of the namespace (listed on its own).

Run: python bench/cell_cost.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernel"))

from kernel_client import SETUP, Kernel  # noqa: E402

NAMESPACE = """
records = [{"id": i, "name": f"sample-{i}"} for i in range(500_000)]
tensors = [torch.randn(16) for _ in range(10_000)]
"""
CELL_TIMER = """
import time as _t
_cell_times = []
_ip = get_ipython()
_ip.events.register("pre_run_cell", lambda info: _cell_times.append(-_t.perf_counter()))
_ip.events.register("post_run_cell", lambda result: _cell_times.append(_cell_times.pop() + _t.perf_counter()))
"""
CONFIGS = {"live figure (default)": "%%memwatch\npass", "-q (no output)": "%%memwatch -q\npass",
           "--no-scan": "%%memwatch --no-scan\npass"}


def _cell_s(kernel: Kernel, code: str) -> float:
    kernel.ok(code, timeout_s=300)
    return float(kernel.value("_cell_times[-2]", store_history=False))  # [-1]: this very cell, running


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def run(rounds: int = 9) -> dict[str, Any]:
    kernel = Kernel()
    try:
        kernel.ok(SETUP)
        kernel.ok(CELL_TIMER, store_history=False)
        kernel.ok(NAMESPACE, timeout_s=300)
        objects = kernel.value("len(__import__('gc').get_objects())", store_history=False)
        first_s = _cell_s(kernel, CONFIGS["live figure (default)"]) - _cell_s(kernel, "pass")
        extra: dict[str, list[float]] = {name: [] for name in CONFIGS}
        for _ in range(rounds):
            for name, code in CONFIGS.items():
                bare = _cell_s(kernel, "pass")
                extra[name].append(_cell_s(kernel, code) - bare)
        return {"objects": objects, "first_s": first_s, "rounds": rounds,
                "extra_s": {name: _quartiles(values) for name, values in extra.items()}}
    finally:
        kernel.shutdown()


def render(result: dict[str, Any] | None = None) -> str:
    result = result or run()
    lines = [
        f"A kernel holding 500,000 small dicts and 10,000 tensors ({result['objects']:,} objects the collector "
        f"tracks); a cell's time from IPython's `pre_run_cell` to `post_run_cell`, watched `pass` cell minus the "
        f"bare `pass` cell before it, median of {result['rounds']} (quartiles). Goal: 20 ms.",
        "",
        "| `%%memwatch` cell | fixed cost |",
        "|---|---|",
    ]
    for name, (low, mid, high) in result["extra_s"].items():
        lines.append(f"| {name} | {mid * 1e3:.1f} ms ({low * 1e3:.1f} … {high * 1e3:.1f}) |")
    lines += ["", f"The first watched cell in a kernel scans the whole namespace once: {result['first_s'] * 1e3:.0f} ms."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(run(rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 9)))
