"""The fixed cost of a `%%memwatch` cell: what a cell whose body is `pass` costs over a bare `pass` cell,
in a real kernel whose namespace holds 500,000 small dicts and a list of 10,000 small tensors (1.5 M
objects: the dicts, their strings and ints), and what the first watched cell of such a kernel pays for
its whole-namespace scan.

Each cell's time is taken inside the kernel, from IPython's `pre_run_cell` to its `post_run_cell`
event (the magic, its scans, the live figure's widgets and the report's display included; the
messages' trip to the client not). Bare and watched cells alternate. The first-cell figure is a
`-q` cell after the leak finder's memo of earlier scans was emptied (what a new kernel's first
watched cell meets), again minus a bare cell, repeated.

With `--against DIR` (a checkout of another version, e.g. `git worktree add /tmp/base main`) a kernel
of each version runs side by side, their cells interleaved (A, B, B, A, ...), so that the machine's
noise hits both alike; the table then gives both medians and their ratio.

Run: python bench/cell_cost.py [ROUNDS] [--against DIR]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernel"))

from kernel_client import SETUP, Kernel  # noqa: E402

HERE = Path(__file__).resolve().parents[1]
NAMESPACE = """
records = [{"i": i, "s": str(i)} for i in range(500_000)]
tensors = [torch.zeros(4) for _ in range(10_000)]
"""
CELL_TIMER = """
import time as _t
_cell_times = []
_ip = get_ipython()
_ip.events.register("pre_run_cell", lambda info: _cell_times.append(-_t.perf_counter()))
_ip.events.register("post_run_cell", lambda result: _cell_times.append(_cell_times.pop() + _t.perf_counter()))
"""
#: what a new kernel's first watched cell meets: no scan of earlier cells to reuse
FORGET_SCANS = "__import__('torchmem_magic.session.run', fromlist=['_registry'])._registry.scan_memo.clear()"
CONFIGS = {"live figure (default)": "%%memwatch\npass", "-q (no output)": "%%memwatch -q\npass",
           "--no-scan": "%%memwatch --no-scan\npass"}
FIRST_CELL = "first cell (whole-namespace scan, -q)"
FIRST_ROUNDS = 5


def _cell_s(kernel: Kernel, code: str) -> float:
    kernel.ok(code, timeout_s=300)
    return float(kernel.value("_cell_times[-2]", store_history=False))  # [-1]: this very cell, running


def _extra_s(kernel: Kernel, code: str) -> float:
    bare = _cell_s(kernel, "pass")
    return _cell_s(kernel, code) - bare


def _first_cell_s(kernel: Kernel) -> float:
    kernel.ok(FORGET_SCANS, store_history=False)
    return _extra_s(kernel, CONFIGS["-q (no output)"])


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def _start(tree: Path) -> Kernel:
    """A kernel that imports torchmem_magic from `tree` (its working directory comes first on sys.path)."""
    kernel = Kernel(cwd=str(tree))
    kernel.ok(SETUP)
    found = Path(kernel.value("torchmem_magic.__file__", store_history=False)).resolve()
    if not found.is_relative_to(tree.resolve()):
        raise RuntimeError(f"the kernel for {tree} imported torchmem_magic from {found}")
    kernel.ok(CELL_TIMER, store_history=False)
    kernel.ok(NAMESPACE, timeout_s=300)
    return kernel


def run(rounds: int = 9, trees: dict[str, Path] | None = None, first_rounds: int = FIRST_ROUNDS) -> dict[str, Any]:
    """Each tree's extra time per configuration, its cells interleaved with the other trees' cells
    (`rounds` of the later cells, `first_rounds` of the first cell's)."""
    trees = trees or {"this checkout": HERE}
    kernels = {name: _start(tree) for name, tree in trees.items()}
    try:
        samples: dict[str, dict[str, list[float]]] = {
            name: {config: [] for config in [FIRST_CELL, *CONFIGS]} for name in kernels
        }

        def interleaved(measure: Any, config: str, round_: int) -> None:
            order = list(kernels) if round_ % 2 == 0 else list(reversed(kernels))
            for name in order:
                samples[name][config].append(measure(kernels[name]))

        for round_ in range(first_rounds):
            interleaved(_first_cell_s, FIRST_CELL, round_)
        for kernel in kernels.values():  # the live figure's first cell imports the widget libraries
            kernel.ok(CONFIGS["live figure (default)"], timeout_s=300)
        for round_ in range(rounds):
            for config, code in CONFIGS.items():
                interleaved(lambda kernel, code=code: _extra_s(kernel, code), config, round_)
        objects = next(iter(kernels.values())).value(
            "len(records) + sum(1 for r in records for v in r.values() if type(v) is str or v > 256)"
            " + len(tensors) + 2", store_history=False,
        )
    finally:
        for kernel in kernels.values():
            kernel.shutdown()
    return {"objects": objects, "rounds": rounds, "first_rounds": first_rounds,
            "extra_s": {name: {config: _quartiles(v) if len(v) > 1 else (v[0],) * 3 for config, v in by.items()}
                        for name, by in samples.items()}}


def _ms(figures: tuple[float, float, float]) -> str:
    low, mid, high = figures
    return f"{mid * 1e3:.1f} ms ({low * 1e3:.1f} … {high * 1e3:.1f})"


def render(result: dict[str, Any] | None = None) -> str:
    result = result or run()
    names = list(result["extra_s"])
    lines = [
        f"A kernel holding 500,000 small dicts and 10,000 small tensors ({result['objects']:,} objects alive); "
        f"a cell's time from IPython's `pre_run_cell` to `post_run_cell`, watched `pass` cell minus the bare "
        f"`pass` cell before it, median of {result['rounds']} (quartiles; the first cell: of "
        f"{result['first_rounds']}, each after the memo of earlier scans was emptied). Goals: 20 ms with the "
        f"live figure, 5 ms with `-q`, 0.3 s for the first cell.",
        "",
        "| `%%memwatch` cell | " + " | ".join(names) + (" | ratio |" if len(names) == 2 else ""),
        "|---|" + "---|" * (len(names) + (len(names) == 2)),
    ]
    for config in [*CONFIGS, FIRST_CELL]:
        cells = [_ms(result["extra_s"][name][config]) for name in names]
        if len(names) == 2:
            a, b = (result["extra_s"][name][config][1] for name in names)
            cells.append(f"{b / a:.2f}" if a > 0 else "–")
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _arguments(argv: list[str]) -> tuple[int, dict[str, Path] | None]:
    rounds, trees = 9, None
    if "--against" in argv:
        at = argv.index("--against")
        trees = {"before (" + Path(argv[at + 1]).name + ")": Path(argv[at + 1]), "after (this checkout)": HERE}
        argv = argv[:at] + argv[at + 2:]
    if argv:
        rounds = int(argv[0])
    return rounds, trees


if __name__ == "__main__":
    rounds_, trees_ = _arguments(sys.argv[1:])
    print(render(run(rounds_, trees_)))
