"""What finding a holder no scan reaches costs (the search back from live tensors, run only where a leak has
no holder): a namespace of ~1 M Python objects the collector tracks (250,000 records), a model and its optimizer, and 150 kept
tensors (256 KiB each) that only a C object holds (a `functools.lru_cache`), the leak's memory."""

from __future__ import annotations

import datetime
import functools
import gc
import os
import statistics
import time
from typing import Any

import torch

from torchmem_magic.finder.scan.referrers import live_storages, named_roots, search_back
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.finder.scan.scanner import scan_roots

KEPT = 150


def build_namespace() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    optimizer = torch.optim.Adam(model.parameters())
    # four objects the collector tracks a record (a dict of atomic values alone is not tracked)
    records = [{"id": i, "tags": [i % 7, i % 11], "meta": {"seen": [i]}} for i in range(250_000)]

    @functools.lru_cache(maxsize=None)
    def features(step: int) -> torch.Tensor:
        return torch.randn(128, 512)

    for step in range(KEPT):
        features(step)
    return {"model": model, "optimizer": optimizer, "records": records, "features": features}


def run(repeats: int = 3) -> dict[str, Any]:
    """The end scan's storages excluded, as the leak finder does; median of `repeats` searches."""
    namespace = build_namespace()
    roots = [Root(name, "user", name, value) for name, value in namespace.items()]
    counted = scan_roots(roots).storages
    named = named_roots(roots)
    times, found = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        found = search_back(live_storages(counted), named)
        times.append(time.perf_counter() - started)
    assert found is not None
    top = found.held[0] if found.held else None
    return {
        "objects": len(gc.get_objects()),
        "median_s": statistics.median(times),
        "max_s": max(times),
        "levels": found.levels,
        "storages": found.storages_searched,
        "cut_short": found.cut_short,
        "top": "none" if top is None else f"{top.name} ({top.tensors} tensors, {top.tensor_bytes / 2**20:.1f} MiB)",
    }


def render() -> str:
    r = run()
    return (
        f"Namespace: {r['objects']:,} objects the garbage collector tracks (250,000 records, a model and its "
        f"optimizer), and {KEPT} tensors of 256 KiB that only a `functools.lru_cache` holds. The search back from "
        f"the {r['storages']} storages no scan reached took {r['median_s']:.2f} s (median of 3, at most "
        f"{r['max_s']:.2f} s; goal: at most 1 s), {r['levels']} levels up, and named {r['top']}"
        f"{' (cut short)' if r['cut_short'] else ''}. A cell with a holder, or with no leak, does not search. "
        f"({os.cpu_count()} cores, torch {torch.__version__}, `make bench` on {datetime.date.today()}.)"
    )


if __name__ == "__main__":
    print(render())
