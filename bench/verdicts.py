"""The seeds' two crude rules against our detector, on synthetic series and on real training loops.

Seed rule A: warn when RSS grew more than 100 MB since the previous step.
Seed rule B: a snapshot every 50 steps; warn when the mean of the last 5 is 15% above the first 5
(so it can say nothing before 10 snapshots = 500 steps).
Ours: torchmem_magic.analysis.verdict.decide on the step-aligned series (plus the leak finder's evidence for
the real loops, as %%memwatch uses it).
"""

from __future__ import annotations

import gc
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from leaky_loops import CLEAN, LEAKS, SETUP  # noqa: E402

from torchmem_magic import MemwatchSession  # noqa: E402
from torchmem_magic.analysis.findings import Series  # noqa: E402
from torchmem_magic.analysis.verdict import MIB, decide  # noqa: E402
from torchmem_magic.finder.scan.results import Root  # noqa: E402
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.finder.leak_finder import LeakSearch


def rule_a(ram: list[float]) -> str:
    return "leak" if any(b - a > 100e6 for a, b in zip(ram, ram[1:])) else "clean"


def rule_b(steps: list[float], ram: list[float], total_steps: int) -> str:
    snapshots = [r for s, r in zip(steps, ram) if int(s) % 50 == 0]
    if len(snapshots) < 10:
        return f"— (needs 500 steps, had {total_steps})"
    first, last = sum(snapshots[:5]) / 5, sum(snapshots[-5:]) / 5
    return "leak" if last > 1.15 * first else "clean"


def _ours(verdict: Any) -> str:
    return str(verdict.verdict) + (f" ({verdict.leak_kind})" if verdict.leak_kind else "")


def synthetic_cases(n: int) -> list[tuple[str, str, list[float], list[float]]]:
    """(name, truth, heap series, RSS series) over n steps, 600 MB base, realistic noise."""
    rng = random.Random(n)
    base = 600 * MIB

    def noise(scale: float = 64 * 1024) -> float:
        return rng.gauss(0, scale)

    cases = []
    slow = [base + 0.2 * MIB * i + noise() for i in range(n)]
    cases.append(("linear 0.2 MB/step", "leak", slow, slow))
    fast = [base + 2 * MIB * i + noise() for i in range(n)]
    cases.append(("linear 2 MB/step", "leak", fast, fast))
    stairs = [base + (i // 50) * 40 * MIB + noise() for i in range(n)]
    cases.append(("staircase 40 MB/epoch", "leak", stairs, stairs))
    sporadic = [base + (i // 40) * 30 * MIB + noise() for i in range(n)]
    cases.append(("30 MB every 40th step", "leak", sporadic, sporadic))
    warm = [base + (150 * MIB if i > 0 else 0) + noise() for i in range(n)]
    cases.append(("warm-up then plateau", "clean", warm, warm))
    saw = [base + (300 * MIB if i % 10 in (4, 5) else 0) + noise() for i in range(n)]
    cases.append(("sawtooth 300 MB temporaries", "clean", saw, saw))
    heap_flat = [base + noise() for i in range(n)]
    rss_creep = [base + 0.4 * MIB * i + noise() for i in range(n)]
    cases.append(("RSS creep, heap flat (fragmentation)", "clean", heap_flat, rss_creep))
    noisy = [base + noise(8 * MIB) for i in range(n)]
    cases.append(("noise only, 8 MB", "clean", noisy, noisy))
    return cases


def run_loop(body: str) -> tuple[Any, list[float], list[float], int]:
    # the previous loop's namespace is a reference cycle (its functions' globals): free it now, as a fresh
    # cell would find it, not in the middle of this loop's series
    gc.collect()
    namespace: dict[str, Any] = {}
    exec(SETUP, namespace)
    roots = lambda: [Root(k, "user", k, v) for k, v in list(namespace.items()) if not k.startswith("_")]  # noqa: E731
    session = MemwatchSession(SessionOptions(50), search=LeakSearch(roots, [body]))
    with session:
        exec(body, namespace)
    report = session.report
    assert report is not None
    namespace.clear()
    columns = session.timeline.by_step.columns("step", "ram_bytes")
    return report, list(columns["step"]), list(columns["ram_bytes"]), report.steps


def main() -> str:
    torch.set_num_threads(1)
    lines = [
        "| case | truth | seed rule A (>100 MB in a step) | seed rule B (last 5 vs first 5 snapshots) | ours |",
        "|---|---|---|---|---|",
    ]
    for n in (300, 1200):
        for name, truth, heap, ram in synthetic_cases(n):
            steps = [float(i + 1) for i in range(len(heap))]
            epochs = [float(e) for e in range(51, n, 50)] if "staircase" in name else []
            ours = decide([Series("heap", steps, heap, 24e9), Series("ram", steps, ram, 24e9)], epoch_steps=epochs)
            lines.append(
                f"| synthetic ({n} steps): {name} | {truth} | {rule_a(ram)} | {rule_b(steps, ram, n)} | {_ours(ours)} |"
            )
    for name, (body, kind) in sorted(LEAKS.items()):
        report, steps, ram, n = run_loop(body)
        lines.append(f"| real loop ({n} steps): {name} | leak ({kind}) | {rule_a(ram)} | {rule_b(steps, ram, n)} | "
                     f"{report.verdict}" + (f" ({report.leak_kind})" if report.leak_kind else "") + " |")
    for name, body in sorted(CLEAN.items()):
        report, steps, ram, n = run_loop(body)
        lines.append(f"| real loop ({n} steps): {name} | clean | {rule_a(ram)} | {rule_b(steps, ram, n)} | "
                     f"{report.verdict}" + (f" ({report.leak_kind})" if report.leak_kind else "") + " |")
    return "\n" + "\n".join(lines) + "\n"  # blank lines around it: a table right after an HTML comment is no table


if __name__ == "__main__":
    print(main())
