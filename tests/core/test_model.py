"""Report.to_dict() in the report's documented JSON schema, version 2, with every optional part present.

What the reports print and display is pinned by test_render_golden.py."""

import json

from torchmem_magic.core.model import (
    DeviceMemory,
    HeapSummary,
    RamSummary,
    ShmSummary,
    Suspect,
    TensorFinding,
    VramSummary,
    WorkerSummary,
)
from torchmem_magic.render.results import MemcheckResult, Report


def full_report() -> Report:
    device = DeviceMemory("cuda:0", 10, 20, 30, 40, 2, 80 << 30, 70 << 30)
    return Report(
        status="ok", wall_s=1.5, samples=15, interval_s=0.1, steps=10, epochs=2,
        ram=RamSummary(1, 2, 3, 0.5, 1 << 30, "cgroup v2"),
        heap=HeapSummary(1, 2, 3, 0.25),
        vram=VramSummary(1, 2, 3, 4, 5, 0.1, 80 << 30, ("cuda:0",), 2, (device,)),
        shm=ShmSummary(0, 1, 2, 64 << 20, "file_descriptor", 0.0, "/dev/shm"),
        workers=WorkerSummary(2, 123, 4),
        suspects=(Suspect("history", "history[3]", "autograd-graph", 4, 40, 1000, True, "history.append(loss.item())"),),
        advice=("use loss.item()",),
        timeline=object(),
    )


def test_keys_and_values_follow_the_spec() -> None:
    data = full_report().to_dict()
    assert json.loads(json.dumps(data)) == data  # plain JSON, timeline left out
    assert {
        "schema", "status", "wall_s", "samples", "interval_s", "steps", "epochs", "ram", "heap", "vram", "shm",
        "workers", "verdict", "leak_kind", "resource", "steps_to_exhaustion", "suspects", "advice",
        "clock", "optimizer_steps", "live_suspects_at_step", "ranks", "worst_rank",
    } <= set(data) and "timeline" not in data
    assert (data["clock"], data["ranks"], data["worst_rank"]) == ("optimizer", None, None)
    assert data["ram"] == {"start": 1, "end": 2, "peak": 3, "per_step": 0.5, "limit": 1 << 30, "limit_source": "cgroup v2"}
    assert data["heap"] == {"start": 1, "end": 2, "peak": 3, "per_step": 0.25}
    vram = data["vram"]
    assert {k: vram[k] for k in ("allocated_start", "allocated_end", "allocated_peak", "reserved_end", "per_step", "limit")} == {
        "allocated_start": 1, "allocated_end": 2, "allocated_peak": 3, "reserved_end": 4, "per_step": 0.1, "limit": 80 << 30,
    }
    assert vram["per_device"][0]["free"] == 70 << 30 and vram["per_device"][0]["num_alloc_retries"] == 2
    assert {"start", "end", "peak", "limit", "strategy"} <= set(data["shm"])
    assert data["workers"] == {"max": 2, "peak": 123, "pids_seen": 4, "per_worker": []}
    assert data["suspects"] == [{
        "name": "history", "path": "history[3]", "kind": "autograd-graph", "tensors": 4, "graph_nodes": 40,
        "retained_bytes": 1000, "new_in_cell": True, "fix": "history.append(loss.item())",
        "growth_per_step": None, "series": [], "first_seen_step": None, "rank": None, "growth_share": None,
        "retained_by_resource": {},
    }]
    assert data["advice"] == ["use loss.item()"] and data["schema"] == 2 and data["verdict"] == "unknown"



def test_memcheck_to_dict_is_versioned_plain_data() -> None:
    finding = TensorFinding("history[0]", (64, 10), "torch.float32", "cpu", 2560, True, "AddmmBackward0", 5, 6060)
    result = MemcheckResult(
        expr="history", tensors=1, bytes=2560, graph_tensors=1, graph_nodes=5, retained_bytes=6060,
        devices=("cpu",), truncated=False, findings=(finding,), advice=("use loss.item()",),
    )
    data = result.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["schema"] == 1 and data["retained_bytes"] == 6060 and data["bytes"] == 2560
    assert data["findings"] == [{
        "path": "history[0]", "shape": [64, 10], "dtype": "torch.float32", "device": "cpu", "bytes": 2560,
        "requires_grad": True, "grad_fn": "AddmmBackward0", "graph_nodes": 5, "retained_bytes": 6060,
    }]
