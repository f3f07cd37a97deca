"""How long the leak finder takes on a big namespace: 10,000 loss tensors with their graphs plus
1,000,000 plain Python objects (the issue's target: under 1 s on this machine)."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import torch

from torchmem_magic.finder.scan.results import Budget, Root
from torchmem_magic.finder.scan.scanner import scan_roots
from torchmem_magic.finder.suspects import suspects_from_scan


def build_namespace() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []
    for _ in range(10_000):
        loss = model(torch.randn(8, 32)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss)  # the leak: each keeps its graph's nodes
    records = [{"id": i, "name": f"sample-{i}", "tags": (i % 7, i % 11)} for i in range(250_000)]  # 1M objects
    return {"model": model, "optimizer": optimizer, "history": history, "records": records, "loss": loss}


UNLIMITED = Budget(time_s=60, max_objects=10**8, max_objects_per_root=10**8, max_children=10**8)


def run(repeats: int = 5, budget: Budget | None = None, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Median time of `repeats` scans with `budget` (None: the default one %%memwatch uses)."""
    torch.set_num_threads(1)
    namespace = namespace if namespace is not None else build_namespace()
    times, result = [], None
    for _ in range(repeats):
        roots = [Root(name, "user", name, value) for name, value in namespace.items()]
        started = time.perf_counter()
        result = scan_roots(roots, budget)
        suspects = suspects_from_scan(result, [])
        times.append(time.perf_counter() - started)
    assert result is not None
    top = suspects[0]
    return {
        "median_s": statistics.median(times),
        "max_s": max(times),
        "objects": result.objects,
        "truncated": result.truncated,
        "top": f"{top.name} ({top.kind}, {top.tensors:,} tensors, ~{top.graph_nodes:,} nodes)",
        "estimated": any(r.graph_estimated for r in result.roots),
    }


def collect_s(repeats: int = 3) -> float:
    """What the `gc.collect()` a session runs before its first sample costs with this namespace alive."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


if __name__ == "__main__":
    ns = build_namespace()
    print("default budget:", run(namespace=ns))
    print("no limits:", run(repeats=3, budget=UNLIMITED, namespace=ns))
