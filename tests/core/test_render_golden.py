"""Every text and HTML renderer against stored output: a changed character anywhere fails.

The inputs below are synthetic and complete (every table row, a leak verdict with advice, two
suspects, an error, grouped memcheck findings), with distinct, round numbers so that a reader of a
golden file can check each figure sits in its column. Expected outputs live in `golden/` next to
this module, one file per case, and are compared whole.

After an intended change to what a renderer prints, rewrite the files and review their diff:

    TORCHMEM_UPDATE_GOLDEN=1 python -m pytest tests/core/test_render_golden.py

In that mode each test writes its file and is reported as skipped, since it checked nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from torchmem_magic.core.model import (
    DeviceMemory,
    HeapSummary,
    LiveStatus,
    RamSummary,
    ShmSummary,
    Suspect,
    TensorFinding,
    VramSummary,
    WorkerSummary,
)
from torchmem_magic.render.text import status_line
from torchmem_magic.render.results import MemcheckResult, Report

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("TORCHMEM_UPDATE_GOLDEN") == "1"
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
NAN = math.nan


def check_golden(name: str, rendered: str) -> None:
    """`rendered` must equal the stored file `name` exactly (the file adds one final newline)."""
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes((rendered + "\n").encode("utf-8"))
        pytest.skip(f"rewrote {path.name}")
    assert path.exists(), f"{path} is missing: run with TORCHMEM_UPDATE_GOLDEN=1 to write it"
    assert rendered + "\n" == path.read_bytes().decode("utf-8")


# ----------------------------------------------------------------------------- inputs

SUSPECTS = (
    Suspect(
        name="val_outputs", path="val_outputs[0]", kind="autograd-graph", tensors=200, graph_nodes=1_004,
        retained_bytes=200 * MIB, new_in_cell=True,
        fix="wrap the code that fills val_outputs in `with torch.no_grad():`",
    ),
    Suspect(
        name="cache", path="cache['batch']", kind="tensor-cache", tensors=1, graph_nodes=0,
        retained_bytes=3 * MIB, new_in_cell=False, fix="cache.clear() when len(cache) > 100",
    ),
)


def full_report() -> Report:
    """Every row, a leak verdict with advice, two suspects, stopped by an error."""
    return Report(
        status="error", wall_s=86.4, samples=864, interval_s=0.1, steps=200, epochs=3,
        ram=RamSummary(
            start_bytes=1 * GIB, end_bytes=3 * GIB // 2, peak_bytes=2 * GIB, per_step_bytes=1.5 * MIB,
            limit_bytes=16 * GIB, limit_source="cgroup v2",
        ),
        heap=HeapSummary(start_bytes=100 * MIB, end_bytes=300 * MIB, peak_bytes=320 * MIB, per_step_bytes=1.0 * MIB),
        vram=VramSummary(
            allocated_start_bytes=2 * GIB, allocated_end_bytes=3 * GIB, allocated_peak_bytes=7 * GIB // 2,
            reserved_end_bytes=4 * GIB, reserved_peak_bytes=9 * GIB // 2, per_step_bytes=512.0 * KIB,
            limit_bytes=80 * GIB, devices=("cuda:0", "cuda:1"), num_alloc_retries=2,
            per_device=(DeviceMemory("cuda:0", 3 * GIB, 4 * GIB, 7 * GIB // 2, 9 * GIB // 2, 2, 80 * GIB, 60 * GIB),),
        ),
        shm=ShmSummary(
            start_bytes=0, end_bytes=64 * MIB, peak_bytes=128 * MIB, limit_bytes=8 * GIB,
            strategy="file_descriptor", per_step_bytes=-2.0 * KIB, path="/dev/shm", torch_segments=3,
        ),
        workers=WorkerSummary(max_count=4, peak_bytes=5 * GIB // 2, pids_seen=8),
        verdict="leak", leak_kind="per-iteration", resource="heap", steps_to_exhaustion=12_000.0,
        suspects=SUSPECTS,
        advice=(
            "per-iteration leak in heap: 1.0 MiB/step ± 17.1 KiB",
            "at 1.0 MiB/step this kernel is OOM-killed in ~12,000 steps (~86 min)",
        ),
        error="RuntimeError: CUDA out of memory",
    )


def minimal_report() -> Report:
    """Only RAM measured, one step (no growth figures), no verdict."""
    return Report(
        status="ok", wall_s=0.5, samples=5, interval_s=0.1, steps=1, epochs=1,
        ram=RamSummary(
            start_bytes=500 * MIB, end_bytes=501 * MIB, peak_bytes=502 * MIB, per_step_bytes=None,
            limit_bytes=8 * GIB, limit_source="system",
        ),
        heap=None, vram=None, shm=None, workers=None,
    )


def batch_clock_report() -> Report:
    """An inference loop without an optimizer: steps are DataLoader batches, a per-epoch leak."""
    return Report(
        status="ok", wall_s=12.0, samples=120, interval_s=0.1, steps=600, epochs=6,
        ram=RamSummary(
            start_bytes=1 * GIB, end_bytes=1 * GIB + 60 * MIB, peak_bytes=1 * GIB + 60 * MIB,
            per_step_bytes=100 * KIB, limit_bytes=16 * GIB, limit_source="cgroup v2",
        ),
        heap=HeapSummary(start_bytes=400 * MIB, end_bytes=460 * MIB, peak_bytes=460 * MIB, per_step_bytes=100 * KIB),
        vram=None, shm=None, workers=None, verdict="leak", leak_kind="per-epoch", resource="heap",
        advice=("per-epoch leak in heap: 10.0 MiB per epoch",), clock="batch", optimizer_steps=0,
        per_epoch_bytes=10 * MIB,
    )


def time_clock_report() -> Report:
    """No step clock at all: rates per second."""
    return Report(
        status="ok", wall_s=3.0, samples=30, interval_s=0.1, steps=0, epochs=0,
        ram=RamSummary(
            start_bytes=500 * MIB, end_bytes=800 * MIB, peak_bytes=800 * MIB, per_step_bytes=100 * MIB,
            limit_bytes=8 * GIB, limit_source="system",
        ),
        heap=None, vram=None, shm=None, workers=None, verdict="leak", leak_kind="per-iteration", resource="ram",
        advice=("per-iteration leak in ram: 100.0 MiB/s ± 1.0 MiB", "at 100.0 MiB/s this kernel is OOM-killed in ~73 s"),
        clock="time",
    )


def _history(i: int) -> TensorFinding:
    """One kept model output with its graph: 64×10 float32 = 2,560 B, 5 nodes of ~700 B."""
    return TensorFinding(f"history[{i}]", (64, 10), "torch.float32", "cpu", 2_560, True, "AddmmBackward0", 5, 6_060)


def full_memcheck() -> MemcheckResult:
    """Grouped rows (`history[*]`, `batches[*]` of two shapes), a leaf on CUDA, a suspect, advice."""
    findings = (
        _history(0), _history(1), _history(2),
        TensorFinding("model.weight", (10, 512), "torch.float32", "cuda:0", 20 * KIB, True, None, 0, 20 * KIB),
        TensorFinding("batches[0]", (32, 3, 224, 224), "torch.uint8", "cpu", 4_816_896, False, None, 0, 4_816_896),
        TensorFinding("batches[1]", (16, 3, 224, 224), "torch.uint8", "cpu", 2_408_448, False, None, 0, 2_408_448),
    )
    return MemcheckResult(
        expr="state", tensors=6, bytes=sum(f.bytes for f in findings), graph_tensors=3, graph_nodes=15,
        retained_bytes=sum(f.retained_bytes for f in findings), devices=("cpu", "cuda:0"), truncated=True,
        findings=findings,
        advice=("history: history.append(loss.item())", "graph figures are estimates"),
        estimated=True, skipped_objects=1,
        suspects=(Suspect("history", "history[0]", "autograd-graph", 3, 15, 18_180, False, "history.append(loss.item())"),),
        elapsed_s=0.12,
    )


def empty_memcheck() -> MemcheckResult:
    """A namespace without tensors: headline and advice only."""
    return MemcheckResult(
        expr="", tensors=0, bytes=0, graph_tensors=0, graph_nodes=0, retained_bytes=0, devices=(),
        truncated=False, findings=(), advice=("the namespace holds no tensors",),
    )


STATUSES = {
    "full": LiveStatus(
        elapsed_s=20.0, steps=1_234, epochs=2, ram_bytes=1.5 * GIB, heap_bytes=300.0 * MIB,
        vram_allocated_bytes=3.0 * GIB, vram_reserved_bytes=4.0 * GIB, shm_used_bytes=64.0 * MIB, workers=4,
        ram_per_step=1.5 * MIB, heap_per_step=1.0 * MIB, vram_per_step=-512.0, verdict="leak: per-iteration in heap",
    ),
    "cpu": LiveStatus(
        elapsed_s=4.0, steps=10, epochs=0, ram_bytes=500.0 * MIB, heap_bytes=120.0 * MIB,
        vram_allocated_bytes=NAN, vram_reserved_bytes=NAN, shm_used_bytes=NAN, workers=0,
        ram_per_step=2.0 * KIB, heap_per_step=0.0, vram_per_step=None,
    ),
    "forward_clock": LiveStatus(
        elapsed_s=5.0, steps=250, epochs=0, ram_bytes=600.0 * MIB, heap_bytes=200.0 * MIB,
        vram_allocated_bytes=NAN, vram_reserved_bytes=NAN, shm_used_bytes=NAN, workers=0,
        ram_per_step=1.0 * MIB, heap_per_step=1.0 * MIB, vram_per_step=None, verdict="leak: per-iteration in heap",
        clock="forward",
    ),
    "time_clock": LiveStatus(
        elapsed_s=90.0, steps=0, epochs=0, ram_bytes=600.0 * MIB, heap_bytes=200.0 * MIB,
        vram_allocated_bytes=NAN, vram_reserved_bytes=NAN, shm_used_bytes=NAN, workers=0,
        ram_per_step=64.0 * KIB, heap_per_step=0.0, vram_per_step=None, verdict="clean", clock="time",
    ),
    "ram_only": LiveStatus(
        elapsed_s=0.0, steps=0, epochs=0, ram_bytes=500.0 * MIB, heap_bytes=NAN,
        vram_allocated_bytes=NAN, vram_reserved_bytes=NAN, shm_used_bytes=NAN, workers=0,
        ram_per_step=None, heap_per_step=None, vram_per_step=None,
    ),
}

REPORTS = {
    "report_full": full_report, "report_minimal": minimal_report,
    "report_batch_clock": batch_clock_report, "report_time_clock": time_clock_report,
}
MEMCHECKS = {"memcheck_full": full_memcheck, "memcheck_empty": empty_memcheck}


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_report_text(name: str) -> None:
    check_golden(f"{name}.txt", str(REPORTS[name]()))


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_report_html(name: str) -> None:
    check_golden(f"{name}.html", REPORTS[name]()._repr_html_())


@pytest.mark.parametrize("name", sorted(MEMCHECKS))
def test_memcheck_text(name: str) -> None:
    check_golden(f"{name}.txt", str(MEMCHECKS[name]()))


@pytest.mark.parametrize("name", sorted(MEMCHECKS))
def test_memcheck_html(name: str) -> None:
    check_golden(f"{name}.html", MEMCHECKS[name]()._repr_html_())


@pytest.mark.parametrize("name", sorted(STATUSES))
def test_status_line(name: str) -> None:
    check_golden(f"status_{name}.txt", status_line(STATUSES[name]))


@pytest.mark.parametrize("build", [full_report, full_memcheck], ids=["report", "memcheck"])
def test_repr_is_one_line_and_ipython_pretty_prints_the_text_form(build: Callable[[], Report | MemcheckResult]) -> None:
    pretty = pytest.importorskip("IPython.lib.pretty").pretty  # the core runs without IPython too

    result = build()
    assert pretty(result) == str(result)  # no timeline: no sparklines
    assert "\n" in str(result)
    assert "\n" not in repr(result) and repr(result).startswith(f"<{type(result).__name__}: ")
