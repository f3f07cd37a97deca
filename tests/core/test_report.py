"""Report assembly, the verdict and the live status line as pure functions of what a run gathered."""

from __future__ import annotations

import json
import signal

import pytest

from torchmem_magic.core.ended import ended_by
from torchmem_magic.analysis.forensics import WorkerExit
from torchmem_magic.core.model import DeviceMemory, SourceErrors, Suspect
from torchmem_magic.render.text import status_line
from torchmem_magic.report.assemble import assemble_report, diagnose
from torchmem_magic.report.evidence import RunEvidence, ShmEvidence, WorkerEvidence
from torchmem_magic.report.summaries import vram_headroom_bytes
from torchmem_magic.report.live_status import live_status
from torchmem_magic.core.timeline import Timeline

MIB = 1 << 20
GIB = 1 << 30


def timeline(steps: int, heap_per_step: float = 0.0, shm_used: float | None = None, workers_bytes: float = 0.0) -> Timeline:
    """`steps` step-aligned rows (and as many background rows) of a run whose heap grows linearly."""
    tl = Timeline()
    for step in range(steps + 1):
        heap = 400 * MIB + heap_per_step * step + (step % 3) * 4096  # a little noise
        row = {
            "t_s": step * 0.01, "step": float(step), "rss_bytes": heap + 200 * MIB, "heap_bytes": heap,
            "ram_bytes": heap + 200 * MIB + workers_bytes, "workers_bytes": workers_bytes,
            "workers": 2.0 if workers_bytes else 0.0,
        }
        if shm_used is not None:
            row["shm_used_bytes"] = shm_used
        tl.by_time.append(row)
        if step:
            tl.by_step.append(row)
    return tl


def evidence(tl: Timeline, steps: int, **changes: object) -> RunEvidence:
    base = RunEvidence(
        timeline=tl, steps=steps, wall_s=steps * 0.01, interval_s=0.1,
        ram_limit_bytes=16 * GIB, ram_limit_source="cgroup v2", heap_available=True,
    )
    return RunEvidence(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_a_linear_heap_leak_is_a_per_iteration_leak_with_its_rate_in_every_figure() -> None:
    report = assemble_report(evidence(timeline(200, heap_per_step=MIB), 200))
    assert (report.verdict, report.leak_kind, report.resource) == ("leak", "per-iteration", "heap")
    assert report.heap is not None and report.heap.per_step_bytes == pytest.approx(MIB, rel=0.01)
    assert report.ram.per_step_bytes == pytest.approx(MIB, rel=0.01)
    assert (report.ram.start_bytes, report.ram.end_bytes) == (600 * MIB, 800 * MIB + 2 * 4096)
    assert report.ram.peak_bytes == report.ram.end_bytes and report.ram.limit_source == "cgroup v2"
    # headroom: the limit minus what RSS holds beyond the heap, at 1 MiB a step
    assert report.steps_to_exhaustion == pytest.approx((16 * GIB - 800 * MIB - 200 * MIB) / MIB, rel=0.02)
    assert report.seconds_to_exhaustion == pytest.approx(report.steps_to_exhaustion * 0.01, rel=0.01)
    assert report.advice[0].startswith("per-iteration leak in heap: 1.0 MiB/step")
    assert report.status == "ok" and report.error is None and report.samples == 201


def test_a_flat_run_is_clean_and_a_run_without_steps_is_unknown() -> None:
    clean = assemble_report(evidence(timeline(200), 200))
    assert (clean.verdict, clean.leak_kind, clean.advice) == ("clean", None, ())
    empty = Timeline()
    empty.by_time.append({"t_s": 0.0, "step": 0.0, "ram_bytes": 600 * MIB, "rss_bytes": 600 * MIB, "heap_bytes": 400 * MIB})
    unknown = assemble_report(evidence(empty, 0))
    assert unknown.verdict == "unknown"
    assert unknown.advice[0] == "too few steps for a verdict: needs at least 12 sampled steps"


def test_holders_whose_graphs_grew_make_a_flat_run_suspect() -> None:
    holder = Suspect("history", "history[0]", "autograd-graph", 100, 1000, 700_000, True, "history.append(loss.item())")
    report = assemble_report(evidence(timeline(200), 200, suspects=(holder,)))
    assert report.verdict == "suspect" and report.advice[0].startswith("history holds autograd graphs")
    assert report.suspects == (holder,)


def test_a_worker_death_is_explained_from_its_exit_status_whatever_the_loop_saw() -> None:
    tl = timeline(50, shm_used=15.5 * MIB, workers_bytes=80 * MIB)
    shm = ShmEvidence("/mnt/small-shm", 16 * MIB, "file_descriptor", 3)
    report = assemble_report(evidence(
        tl, 50, shm=shm, ended=ended_by(ConnectionResetError(104, "Connection reset by peer")),
        worker_exits=(WorkerExit(4242, signal.SIGBUS, None), WorkerExit(4243, signal.SIGTERM, None)),
        workers=WorkerEvidence(2, 2, ((4242, 80 * MIB, 60 * MIB), (4243, 70 * MIB, 50 * MIB))),
    ))
    assert report.status == "error" and report.error == "ConnectionResetError: [Errno 104] Connection reset by peer"
    assert report.advice[0] == (
        "DataLoader worker 4242 died (Bus error): /mnt/small-shm was 97% full (15.5 MiB of 16.0 MiB) — "
        "workers pass batches through shared memory and a full /dev/shm ends in a bus error"
    )
    assert "--shm-size" in report.advice[1]
    assert report.shm is not None and report.shm.path == "/mnt/small-shm" and report.shm.torch_segments == 3
    assert report.workers is not None and report.workers.per_worker[0] == {"pid": 4242, "pss_peak": 80 * MIB, "uss_peak": 60 * MIB}


def test_workers_that_ended_normally_explain_nothing_and_unknown_workers_fall_back_to_the_message() -> None:
    tl = timeline(50)
    normal = assemble_report(evidence(tl, 50, worker_exits=(WorkerExit(1, None, 0),)))
    assert not any("DataLoader worker" in a for a in normal.advice)
    message = RuntimeError("DataLoader worker (pid(s) 77) exited unexpectedly")
    unseen = assemble_report(evidence(tl, 50, ended=ended_by(message)))
    assert unseen.advice[0].startswith("DataLoader worker 77 died: neither memory nor /dev/shm was near its limit")


def test_sources_that_failed_are_in_the_report_and_its_advice() -> None:
    errors = (SourceErrors("heap probe", 12, "OSError: boom"),)
    report = assemble_report(evidence(timeline(40), 40, source_errors=errors))
    assert report.advice[-1] == "the heap probe failed 12 times (last: OSError: boom): its figures in this report are incomplete"
    data = json.loads(json.dumps(report.to_dict()))
    assert data["errors"] == [{"source": "heap probe", "count": 12, "last": "OSError: boom", "cost": None}]


def test_vram_from_device_counters_and_its_headroom() -> None:
    tl = timeline(40)
    for row_step in (1.0, 2.0):
        tl.by_time.append({"t_s": 1.0 + row_step, "step": 40.0, "vram_allocated_bytes": row_step * GIB, "vram_reserved_bytes": 3 * GIB})
    start = DeviceMemory("cuda:0", GIB, 3 * GIB, 2 * GIB, 3 * GIB, 1, 80 * GIB, 70 * GIB)
    end = DeviceMemory("cuda:0", 2 * GIB, 3 * GIB, 5 * GIB, 3 * GIB, 4, 80 * GIB, 60 * GIB)
    report = assemble_report(evidence(tl, 40, devices_start=(start,), devices_end=(end,)))
    vram = report.vram
    assert vram is not None and vram.devices == ("cuda:0",) and vram.limit_bytes == 80 * GIB
    assert (vram.allocated_start_bytes, vram.allocated_end_bytes) == (0, 2 * GIB)  # CUDA came into use mid-run
    assert vram.allocated_peak_bytes == 5 * GIB  # the allocator's peak counter rose in this run
    assert vram.num_alloc_retries == 3 and vram_headroom_bytes(vram) == 63 * GIB


def test_the_status_line_quotes_the_live_verdict_and_its_rates() -> None:
    tl = timeline(120, heap_per_step=MIB)
    live = diagnose(tl, 120, 1.2, 16 * GIB, max_points=64)
    status = live_status(tl, 120, 1.2, 0, live)
    assert status.verdict == "leak: per-iteration in heap"
    assert status.heap_per_step == pytest.approx(MIB, rel=0.01)
    line = status_line(status)
    assert "heap 520.0 MiB (+1.0 MiB/step)" in line and line.endswith("verdict so far: leak: per-iteration in heap")
    early = live_status(tl, 20, 0.2, 0, None)
    assert early.verdict is None and early.heap_per_step == pytest.approx(MIB, rel=0.01)  # a first figure


def test_epochs_are_the_passes_of_the_loader_that_carries_the_steps() -> None:
    from torchmem_magic.report.assemble import epoch_starts, training_loader

    tl = Timeline()
    for epoch in range(3):  # loader 1 (train) carries 8 steps a pass; loader 2 (validation) none
        tl.add_pass(epoch * 1.0, 1, (8 * epoch, 8 * epoch, 10 * epoch, 0))
        tl.add_pass(epoch * 1.0 + 0.8, 2, (8 * epoch + 8, 8 * epoch + 8, 10 * epoch + 8, 0))
    credits = {("optimizer", 1): 24, ("batch", 1): 24, ("batch", 2): 6}
    assert training_loader("optimizer", credits, tl.passes) == 1
    assert epoch_starts(tl, "optimizer", 1) == [0.0, 8.0, 16.0] and tl.epoch_count(1) == 3
    assert training_loader("forward", {}, {1: 3, 2: 5}) == 2  # no steps carried: the loader with most passes
    assert training_loader("time", {}, {}) is None and tl.epoch_count(None) == 6


def test_dataloader_workers_joining_the_process_tree_are_not_its_growth() -> None:
    """The tree's RAM jumps when the workers start (their PSS is added from their first reading): a flat
    run stays clean and its RAM rate stays near zero."""
    tl = Timeline()
    for step in range(201):
        workers = 300 * MIB if step >= 60 else 0.0
        heap = 400 * MIB + (step % 3) * 4096
        row = {"t_s": step * 0.01, "step": float(step), "rss_bytes": heap + 200 * MIB, "heap_bytes": heap,
               "ram_bytes": heap + 200 * MIB + workers, "workers_bytes": workers, "workers": 2.0 if workers else 0.0}
        tl.by_time.append(row)
        if step:
            tl.by_step.append(row)
    report = assemble_report(evidence(tl, 200))
    assert report.verdict == "clean", report.advice
    assert report.ram.per_step_bytes is not None and abs(report.ram.per_step_bytes) < 4096
