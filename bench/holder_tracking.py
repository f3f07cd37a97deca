"""What tracking holders during the run costs, and how soon it names a leaking one.

A training loop (MLP 256-1024-10, batch 128) runs under a session whose leak finder looks at this
module's globals, with 10,000 loss tensors with graphs and 500,000 small dicts (1 M+ objects) alive
beside it. Reported: the mid-run scans' wall time as a share of the loop's (the one-off start
allowance included), how many scans ran, and the step at which a 1 MiB/step leak's holder was
first clearly growing (what the live status line names), median of several runs.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch

from torchmem_magic import MemwatchSession
from torchmem_magic.api import _module_roots
from torchmem_magic.finder.leak_finder import LeakSearch

STEPS = 400


def _crowd() -> dict[str, Any]:
    """What a long notebook session holds: 10,000 graph-holding losses and 1 M+ plain objects."""
    weight = torch.randn(8, 8, requires_grad=True)
    return {
        "old_losses": [(weight * float(i)).sum() for i in range(10_000)],
        "records": [{"id": i, "label": f"r{i}"} for i in range(500_000)],
    }


def run_once(leak: bool) -> dict[str, float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(128, 256)
    namespace: dict[str, Any] = {**_crowd(), "kept": []}
    session = MemwatchSession(search=LeakSearch(lambda: _module_roots(namespace)))
    started = time.perf_counter()
    with session:
        for _ in range(STEPS):
            optimizer.zero_grad()
            model(batch).square().mean().backward()
            optimizer.step()
            if leak:
                namespace["kept"].append(torch.ones(1 << 18))  # 1 MiB a step
    wall_s = time.perf_counter() - started
    report, finder = session.report, session.finder
    assert report is not None and finder is not None
    return {
        "wall_s": wall_s,
        "named_at_step": float(report.live_suspects_at_step or -1),
        "scan_share_pct": 100 * finder.spent_s / wall_s,
        "scans": float(finder.scans),
        "verdict_leak": float(report.verdict == "leak"),
    }


def run(rounds: int = 3) -> dict[str, dict[str, float]]:
    torch.set_num_threads(1)
    out = {}
    for leak in (True, False):
        results = [run_once(leak) for _ in range(rounds)]
        out["1 MiB/step leak" if leak else "clean"] = {k: statistics.median(r[k] for r in results) for k in results[0]}
    return out


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for name, figures in run(rounds).items():
        print(name, figures)
