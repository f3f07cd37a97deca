"""Report.to_dict() against SPEC.md schema 1, with every optional part present."""

import json

from torchmem_magic.model import (
    DeviceMemory,
    HeapSummary,
    RamSummary,
    Report,
    ShmSummary,
    Suspect,
    VramSummary,
    WorkerSummary,
)


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
    } <= set(data) and "timeline" not in data
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
    }]
    assert data["advice"] == ["use loss.item()"] and data["schema"] == 1 and data["verdict"] == "unknown"


def test_text_and_html_reprs() -> None:
    report = full_report()
    text = str(report)
    assert text.startswith("memwatch: ok · 10 steps · 2 epochs · 1.5 s")
    for label in ("RAM (process tree)", "heap in use", "VRAM allocated", "shm (/dev/shm)", "DataLoader workers"):
        assert label in text and label in report._repr_html_()
    assert "<script" not in report._repr_html_()


def test_ipython_pretty_printing_uses_the_text_report() -> None:
    from IPython.lib.pretty import pretty

    assert pretty(full_report()).startswith("memwatch: ok · 10 steps")
    assert repr(full_report()) == str(full_report())
