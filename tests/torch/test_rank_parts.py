"""The parts of rank watching that need no second process: the stream's encoding and replay, the
bounded outbox, the socket that never blocks a sender, merging per-rank reports, the driver's view
of CUDA contexts, and where a rank's holders are looked for."""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from test_report import GIB, MIB, evidence, timeline

from torchmem_magic.core.ended import ended_by
from torchmem_magic.tracing.hooks import TrainingHooks
from torchmem_magic.core.model import DeviceMemory, RankSummary, SourceErrors, Suspect
from torchmem_magic.probes.nvml import NvmlProcesses, normalized_uuid
from torchmem_magic.stream.relay import RelayTimeline
from torchmem_magic.finder.stack_roots import is_user_code
from torchmem_magic.report.merge import (
    first_to_die,
    rank_lines,
    summary_of,
    with_ranks,
    worst_of,
)
from torchmem_magic.stream.protocol import (
    apply_events,
    decode,
    encode,
    evidence_fields,
    evidence_from,
)
from torchmem_magic.stream.transport import Outbox, RankSender, RankSink
from torchmem_magic.render.text import report_text
from torchmem_magic.report import assemble as report_module
from torchmem_magic.ranks.feed import RankFeeds
from torchmem_magic.stream.feed import RankFeed
from torchmem_magic.report.assemble import RANK_VERDICT_POINTS, RANK_VERDICT_ROWS, assemble_report
from torchmem_magic.core.timeline import Timeline
from torchmem_magic.report.evidence import RunEvidence
from torchmem_magic.core.units import format_bytes

HOLDER = Suspect("outputs", "outputs[0]", "autograd-graph", 40, 80, 3 * MIB, True, "outputs.append(out.detach())",
                 growth_per_step=65536.0, series=tuple((s, 65536 * s) for s in (0, 10, 20, 30, 40, 50)), first_seen_step=1)


# ----------------------------------------------------------------------------- the stream


def test_a_relayed_timeline_replays_into_an_equal_timeline_and_the_same_report() -> None:
    outbox = Outbox()
    relayed = RelayTimeline(outbox)
    source = timeline(120, heap_per_step=MIB)
    relayed.add_pass(0.0, 1, (0, 0, 0, 0))
    for row in _rows(source.by_time):
        relayed.by_time.append(row)
    relayed.restart_steps()  # a better clock appeared: the step rows so far are dropped on both sides
    for row in _rows(source.by_step):
        relayed.by_step.append(row)
    replayed = Timeline()
    while len(outbox):
        apply_events(replayed, decode(encode({"k": "events", "pid": 1, "events": outbox.take()}))["events"])  # type: ignore[index]
    for name in ("t_s", "step", "heap_bytes", "ram_bytes", "vram_allocated_bytes"):
        assert list(replayed.by_time.column(name)) == pytest.approx(list(relayed.by_time.column(name)), nan_ok=True)
        assert list(replayed.by_step.column(name)) == pytest.approx(list(relayed.by_step.column(name)), nan_ok=True)
    assert replayed.passes == {1: 1}
    original = evidence(relayed, 120, suspects=(HOLDER,), clock="optimizer",
                        devices_start=(DeviceMemory("cuda:0", 1, 2, 3, 4, None, 8 * GIB, 7 * GIB),),
                        source_errors=(SourceErrors("heap probe", 2, "OSError: x"),),
                        holder_series={"outputs": list(HOLDER.series)})
    fields = decode(encode({"k": "final", "pid": 1, "evidence": evidence_fields(original)}))["evidence"]  # type: ignore[index]
    assert assemble_report(evidence_from(fields, replayed)) == assemble_report(original)


def _every_field_set(tl: Timeline) -> RunEvidence:
    """Evidence with every field away from its default, so a field the stream leaves out shows."""
    from torchmem_magic.analysis.forensics import WorkerExit
    from torchmem_magic.analysis.holders import HolderSearch
    from torchmem_magic.analysis.phases import PhasePass
    from torchmem_magic.report.evidence import ShmEvidence, WorkerEvidence

    rank = summary_of(assemble_report(evidence(timeline(10), 10)), rank=1, pid=7, host="node1")
    values: dict[str, Any] = {
        "wall_s": 3.5, "interval_s": 0.02, "ram_limit_bytes": 8 * GIB, "ram_limit_source": "cgroup v1",
        "heap_available": False, "shm": ShmEvidence("/dev/shm", 64 * MIB, "file_descriptor", 3),
        "workers": WorkerEvidence(2, 4, ((11, 5 * MIB, 2 * MIB), (12, 6 * MIB, 3 * MIB))),
        "worker_exits": (WorkerExit(11, 9, None), WorkerExit(12, None, 0)),
        "devices_start": (DeviceMemory("cuda:0", 1, 2, 3, 4, None, 8 * GIB, 7 * GIB),),
        "devices_end": (DeviceMemory("cuda:0", 5, 6, 7, 8, 9, 8 * GIB, 6 * GIB),),
        "first_pass_batches": 40, "suspects": (HOLDER,), "ended": ended_by(ValueError("bad batch")),
        "source_errors": (SourceErrors("heap probe", 2, "OSError: x"),), "clock": "backward",
        "optimizer_steps": 30, "training_loader": 1, "holder_series": {"outputs": list(HOLDER.series)},
        "live_suspects_at_step": 40, "holders_on_accelerator": frozenset({"outputs", "cache"}), "ranks": (rank,),
        "holders_in_shared_memory": frozenset({"batches"}),
        "guard_advice": ("memwatch guard: stopped at 90 % of the RAM limit",),
        "holder_search": HolderSearch((HOLDER,), 3, 12, 40, True, 0.25),
        "phase_passes": (PhasePass("validation", 60, {"heap_bytes": 1.0}, {"heap_bytes": 5.0 * MIB}),),
    }
    return evidence(tl, 121, **values)


def test_a_rank_streams_every_field_of_its_evidence_as_a_saved_report_reads_it() -> None:
    """Field by field, through JSON: a field added to RunEvidence must travel (or this test names it)."""
    from dataclasses import fields

    tl = timeline(120, heap_per_step=MIB)
    original = _every_field_set(tl)
    defaults = RunEvidence(tl, 120, 0.0, 0.1, 0, "system", True)
    unset = [f.name for f in fields(RunEvidence)
             if f.name != "timeline" and getattr(original, f.name) == getattr(defaults, f.name)]
    assert unset == [], "give these fields a value above, away from their default"
    sent = decode(encode({"k": "final", "pid": 1, "evidence": evidence_fields(original)}))["evidence"]  # type: ignore[index]
    received = evidence_from(sent, tl)
    assert {f.name: getattr(received, f.name) for f in fields(RunEvidence) if getattr(received, f.name) != getattr(original, f.name)} == {}
    assert assemble_report(received).to_dict() == assemble_report(original).to_dict()


def _rows(series: Any) -> list[dict[str, float]]:
    columns = series.columns("t_s", "step", "ram_bytes", "rss_bytes", "heap_bytes", "workers_bytes", "workers")
    return [{name: values[i] for name, values in columns.items()} for i in range(len(columns["t_s"]))]


def test_the_exception_that_ended_a_rank_keeps_its_type_name_and_message() -> None:
    ended = evidence(timeline(10), 10, ended=ended_by(ValueError("bad batch")))
    report = assemble_report(evidence_from(evidence_fields(ended), timeline(10)))
    assert (report.status, report.error) == ("error", "ValueError: bad batch")
    interrupted = evidence_from(evidence_fields(evidence(timeline(10), 10, ended=ended_by(KeyboardInterrupt()))), timeline(10))
    assert assemble_report(interrupted).status == "interrupted"


def test_stray_datagrams_are_ignored() -> None:
    assert decode(b"not json") is None and decode(b"[1, 2]") is None and decode(b'{"k": "hello"}') is None
    assert decode(encode({"k": "hello", "pid": 3})) == {"k": "hello", "pid": 3}


def test_a_full_outbox_drops_the_oldest_events_and_counts_them() -> None:
    outbox = Outbox(capacity=5)
    for n in range(8):
        outbox.append(n)
    assert (outbox.take(), outbox.dropped) == ([3, 4, 5, 6, 7], 3)
    for n in range(4):
        outbox.append(n)
    outbox.put_back(["a", "b"])  # undelivered events go back in front; the bound still holds
    assert (outbox.take(), outbox.dropped) == (["b", 0, 1, 2, 3], 4)


def test_a_sender_never_blocks_when_the_watcher_does_not_read() -> None:
    sink = RankSink()
    sender = RankSender(sink.address)
    message = {"k": "events", "pid": os.getpid(), "events": [["t", [1.0] * 10]] * 200}
    results = [sender.send(message) for _ in range(2000)]  # far more than the socket buffers
    assert results[0] and not all(results) and sender.failed == results.count(False)
    received = sink.receive()
    assert 0 < len(received) == results.count(True)
    sink.close()
    assert not os.path.exists(sink.address)
    assert sender.send(message) is False and sender.gone  # the watcher is gone: no exception, no wait
    started = time.monotonic()
    assert sender.send_patiently(message, timeout_s=5.0) is False
    assert time.monotonic() - started < 0.5  # a rank exiting after its watcher does not hang
    sender.close()


# ----------------------------------------------------------------------------- merging ranks


def _rank(number: int, heap_per_step: float = 0.0, **changes: Any) -> RankSummary:
    suspects = (HOLDER,) if heap_per_step else ()
    report = assemble_report(evidence(timeline(200, heap_per_step=heap_per_step), 200, suspects=suspects,
                                      holder_series={"outputs": list(HOLDER.series)} if suspects else {},
                                      clock="optimizer"))
    return replace(summary_of(report, rank=number, pid=1000 + number, host="node0"), **changes)


def _watcher(steps: int = 0) -> Any:
    """The watcher's own report: a process that made no steps (clock time) whose RAM includes its ranks'."""
    return assemble_report(evidence(timeline(steps, heap_per_step=MIB), steps, clock="time" if not steps else "optimizer"))


def _shaped_timeline(shape: str, rows: int, stride: int, seed: int) -> Timeline:
    """`rows` step rows `stride` steps apart (a long run's thinned sampling), 600 MiB at the start with
    64 KiB of noise, the heap shaped as `shape` (RSS too, but for "fragmentation", where only RSS creeps)."""
    rng = random.Random(seed)
    tl = Timeline(capacity=2 * rows)

    def heap_at(i: int) -> float:
        return 600 * MIB + {
            "slow leak": 0.2 * MIB * i, "fast leak": 2 * MIB * i, "staircase": (i // 50) * 40 * MIB,
            "sporadic": (i // 40) * 30 * MIB, "warm-up": 150 * MIB if i else 0.0,
            "sawtooth": 300 * MIB if i % 10 in (4, 5) else 0.0,
        }.get(shape, 0.0) + rng.gauss(0.0, 8 * MIB if shape == "noise" else 64 * 1024)

    for i in range(1, rows + 1):
        heap = heap_at(i)
        rss = heap + 200 * MIB + (0.4 * MIB * i if shape == "fragmentation" else 0.0)
        row = {"t_s": i * 0.1, "step": float(i * stride), "heap_bytes": heap, "rss_bytes": rss, "ram_bytes": rss}
        tl.by_time.append(row)
        tl.by_step.append(row)
    return tl


SHAPES = ("slow leak", "fast leak", "staircase", "sporadic", "warm-up", "sawtooth", "fragmentation", "noise", "flat")


@pytest.mark.parametrize("stride", [1, 7])
def test_a_ranks_verdict_on_its_bounded_rows_is_the_verdict_on_every_row(stride: int) -> None:
    """A report of many ranks judges each on RANK_VERDICT_ROWS rows: over full timelines of the detector's
    shapes it says what the full verdict says, a leak at the same rate (a thinned series is the same line)."""
    for seed, shape in enumerate(SHAPES):
        tl = _shaped_timeline(shape, 1800, stride, seed)
        run = evidence(tl, 1800 * stride, wall_s=180.0, clock="optimizer")
        full, bounded = assemble_report(run), assemble_report(run, RANK_VERDICT_ROWS, RANK_VERDICT_POINTS)
        judged = [(r.verdict, r.leak_kind, r.resource) for r in (full, bounded)]
        assert judged[0] == judged[1], shape
        if full.verdict == "leak" and full.resource is not None:
            rates = [getattr(r, full.resource).per_step_bytes for r in (full, bounded)]
            assert rates[1] == pytest.approx(rates[0], rel=0.05), shape


def test_the_final_report_of_ranks_judges_each_rank_on_bounded_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows the detector sees for a rank with a full timeline: RANK_VERDICT_ROWS, not the timeline's 1,800."""
    seen: list[int] = []
    real_decide = report_module.decide

    def decide(series: Any, **kwargs: Any) -> Any:
        seen.extend(len(s.steps) for s in series)
        return real_decide(series, **kwargs)

    monkeypatch.setattr(report_module, "decide", decide)
    feeds = RankFeeds()
    try:
        feed = RankFeed(pid=1, rank=0, timeline=_shaped_timeline("slow leak", 1800, 7, 0), clock="optimizer",
                        counts={"optimizer": 1800 * 7}, elapsed_s=180.0, heap_available=True, ram_limit_bytes=16 << 30)
        feed.final = evidence_fields(feed.evidence())
        feeds.feeds = {1: feed}
        summaries = feeds.summaries()
    finally:
        feeds.close()
    assert summaries is not None and summaries[0].verdict == "leak"
    assert seen and max(seen) <= RANK_VERDICT_ROWS and not math.isnan(summaries[0].per_step_bytes or math.nan)


def test_the_leaking_rank_is_the_worst_and_decides_the_verdict() -> None:
    ranks = (_rank(0), _rank(1, heap_per_step=64 * 1024), _rank(2), _rank(3))
    report = with_ranks(_watcher(), ranks)
    assert (report.worst_rank, report.verdict, report.leak_kind, report.resource) == (1, "leak", "per-iteration", "heap")
    assert (report.steps, report.clock) == (200, "optimizer")
    assert report.ram.per_step_bytes is None  # the watcher's own rate was per second: not mixed with steps
    assert report.advice[0] == "rank 1: leak (per-iteration), heap +64.0 KiB/step; outputs grows +64.0 KiB/step"
    assert report.advice[1] == "ranks 0, 2, 3: clean"
    assert [(s.name, s.rank) for s in report.suspects] == [("outputs", 1)]
    text = report_text(report)
    assert "verdict: leak (worst rank: 1)" in text and "rank 1: outputs (autograd-graph)" in text
    table = text.split("  ranks:\n")[1].splitlines()
    assert table[0].split()[:3] == ["rank", "pid", "steps"] and table[2].split()[:3] == ["1", "1001", "200"]
    assert "leak (per-iteration)" in table[2] and "clean" in table[1]
    leaking = ranks[1]
    assert leaking.heap is not None
    ram_at, heap_at = table[2].index(format_bytes(leaking.ram.peak_bytes)), table[2].index(format_bytes(leaking.heap.peak_bytes))
    assert ram_at < heap_at and table[0].index("RAM peak") < table[0].index("heap peak")  # each under its header


def test_all_clean_ranks_make_a_clean_run_and_a_single_process_run_has_no_ranks() -> None:
    report = with_ranks(_watcher(), (_rank(0), _rank(1)))
    assert (report.verdict, report.worst_rank, report.advice[0]) == ("clean", 0, "ranks 0, 1: clean")
    alone = _watcher(50)
    assert with_ranks(alone, None) is alone and alone.to_dict()["ranks"] is None


def test_a_watcher_that_trained_itself_keeps_its_own_verdict_when_it_is_worse() -> None:
    own = _watcher(200)  # leaks 1 MiB/step itself
    report = with_ranks(own, (_rank(0), _rank(1)))
    assert (report.verdict, report.resource, report.clock) == ("leak", own.resource, "optimizer")
    assert report.ram.per_step_bytes == own.ram.per_step_bytes


def test_the_rank_that_died_first_is_the_worst_and_the_ones_its_launcher_stopped_are_told_apart() -> None:
    died = _rank(1, status="killed", ended="SIGKILL", last_seen_s=5.0)
    stopped = _rank(0, status="killed", ended="SIGTERM", last_seen_s=4.9)  # silent a little earlier
    unknown = _rank(2, status="killed", ended=None, last_seen_s=4.95)
    assert first_to_die((died, stopped, unknown)) is died
    assert worst_of((died, stopped, _rank(3, heap_per_step=MIB))) is died
    lines = rank_lines((died, stopped))
    assert lines[0].startswith("rank 1 (pid 1001) stopped without finishing (SIGKILL) at 5.0 s; last readings: RAM")
    assert lines[1].endswith("(after another rank died: launchers stop the rest)")
    assert first_to_die((stopped, unknown)) is stopped  # no witness: the first to go silent
    # no exit status (torchrun reaps its workers): the one still stepping when it went silent died; the
    # other was waiting for it in an all-reduce until its launcher stopped it, a little after
    waiting = _rank(0, status="killed", ended=None, last_seen_s=4.9, stalled_s=0.5)
    stepping = _rank(1, status="killed", ended=None, last_seen_s=5.0, stalled_s=0.0)
    assert first_to_die((waiting, stepping)) is stepping


def test_when_the_watcher_saw_each_rank_end_that_order_decides_and_beats_the_streams() -> None:
    # the streams say rank 0 went silent first, while still stepping; their processes' ends say rank 1 died first
    first = _rank(1, status="killed", ended=None, last_seen_s=5.0, stalled_s=0.0, exited_s=5.31)
    later = _rank(0, status="killed", ended=None, last_seen_s=4.9, stalled_s=0.0, exited_s=5.37)
    assert first_to_die((later, first)) is first and worst_of((later, first)) is first
    # a witnessed signal still comes before any timing; an unseen end falls back on the streams
    assert first_to_die((replace(later, ended="SIGKILL"), first)).rank == 0
    assert first_to_die((replace(first, exited_s=None), later)).rank == 0
    assert summary_of(assemble_report(evidence(timeline(10), 10)), rank=0, pid=1, host="h", exited_s=2.5).to_dict()["exited_s"] == 2.5


def test_a_rank_at_its_ram_limit_when_it_died_was_most_likely_oom_killed() -> None:
    rank = _rank(1, status="killed", ended="SIGKILL")
    at_limit = replace(rank, ram=replace(rank.ram, limit_bytes=int(rank.ram.end_bytes / 0.95)))
    assert rank_lines((at_limit,))[0].endswith("RAM was at its limit: most likely the OOM killer")
    unknown = replace(rank, ended=None)
    assert "cannot be known" in rank_lines((unknown,))[0]


def test_imbalance_is_named_when_one_rank_peaks_well_above_the_median() -> None:
    heavy = _rank(2)
    heavy = replace(heavy, ram=replace(heavy.ram, peak_bytes=heavy.ram.peak_bytes * 2))
    lines = rank_lines((_rank(0), _rank(1), heavy))
    assert any(line.startswith("imbalance: peak RAM") and "on rank 2" in line and "(+100%)" in line for line in lines)
    assert not any(line.startswith("imbalance") for line in rank_lines((_rank(0), _rank(1))))


def test_a_cuda_context_on_a_device_that_is_not_the_ranks_own_is_flagged() -> None:
    contexts = ({"device": "aaaa1111-2222", "used": 500 * MIB, "own": False},
                {"device": "bbbb", "used": 2 * GIB, "own": True})
    lines = rank_lines((_rank(0), _rank(1, cuda_contexts=contexts)))
    stray = [line for line in lines if "CUDA context" in line]
    assert stray == [("rank 1 holds a CUDA context on GPU-aaaa1111 (500.0 MiB), a device its own tensors are not on: "
                      "it touched CUDA before torch.cuda.set_device(local_rank) (call that first in each rank)")]


# ----------------------------------------------------------------------------- the driver's view


def test_nvml_processes_are_read_by_device_uuid() -> None:
    devices = {0: ("GPU-AAAA", [SimpleNamespace(pid=11, usedGpuMemory=300 * MIB)]),
               1: (b"GPU-bbbb", [SimpleNamespace(pid=12, usedGpuMemory=None)])}
    calls: list[str] = []
    fake = SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: devices[h][0], nvmlDeviceGetComputeRunningProcesses=lambda h: devices[h][1],
    )
    reader = NvmlProcesses(fake)
    assert reader.read() == {"aaaa": {11: 300 * MIB}, "bbbb": {12: 0}}
    reader.close()
    assert calls == ["init", "shutdown"] and normalized_uuid("GPU-AB") == normalized_uuid("ab")


def test_without_a_driver_nvml_says_nothing_rather_than_zero() -> None:
    reader = NvmlProcesses()  # the real bindings; this machine has no NVIDIA driver
    if reader.read() is not None:
        pytest.skip("this machine has an NVIDIA driver")
    assert reader.unavailable


# ----------------------------------------------------------------------------- where a rank's holders are


def test_library_code_is_not_where_a_ranks_holders_are_looked_for() -> None:
    assert is_user_code("<ipython-input-3-abc>") and is_user_code("/tmp/ipykernel_1/2.py")
    assert not is_user_code(os.__file__) and not is_user_code(pytest.__file__) and not is_user_code("<frozen runpy>")
    assert not is_user_code(RelayTimeline.__init__.__code__.co_filename)  # this package's own frames
    # a package installed outside this environment's own paths (PYTHONPATH, pip --target, the user site)
    assert not is_user_code("/opt/other-env/lib/python3.11/site-packages/ipykernel/kernelbase.py")
    assert not is_user_code("/usr/lib/python3/dist-packages/foo/bar.py")
    assert is_user_code("/home/me/project/train.py")


def test_hooks_firing_in_a_forked_process_go_to_that_process_watcher_only() -> None:
    ticks: list[str] = []
    foreign: list[Any] = []
    hooks = TrainingHooks(ticks.append, lambda p: None, lambda h, clock: foreign.append(clock))
    hooks.active = True
    hooks._tick("optimizer")
    hooks.pid = -1  # as seen from a process forked after the hooks were installed
    hooks._tick("backward")
    assert (ticks, foreign) == (["optimizer"], ["backward"])
    hooks.adopt(lambda clock: ticks.append("adopted " + clock), lambda p: None, None)
    hooks._tick("batch")
    assert ticks[-1] == "adopted batch" and hooks.pid == os.getpid()
    unwatched = TrainingHooks(ticks.append, lambda p: None)
    unwatched.active, unwatched.pid = True, -1
    unwatched._tick("optimizer")
    assert not unwatched.active  # nobody watches that process: its copy of the hooks turns inert


def test_how_a_rank_ended_comes_from_its_exit_status_or_its_launchers_exception() -> None:
    from torchmem_magic.analysis.forensics import WorkerExit
    from torchmem_magic.ranks.feed import RankFeeds
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    from torchmem_magic.stream.feed import RankFeed

    gone = 2**22 + 12345  # no such process
    finished = RankFeed(gone, final={"steps": 10})
    assert RankFeeds._ending(finished, None) == (None, None)  # the report's own status stands
    finished.exit = WorkerExit(gone, None, 1)
    assert RankFeeds._ending(finished, None) == ("error", "exit code 1")
    raised = RankFeed(gone, final={"steps": 10})
    launcher = ended_by(ProcessRaisedException("boom", 1, gone))  # torch's launcher names the process
    assert RankFeeds._ending(raised, launcher) == ("error", "raised an exception")
    killed = RankFeed(gone, exit=WorkerExit(gone, 9, None))
    assert RankFeeds._ending(killed, None) == ("killed", "SIGKILL")
    silent = RankFeed(gone)
    bus_error = ended_by(ProcessExitedException("died", 1, gone, -7, "SIGBUS"))
    assert RankFeeds._ending(silent, bus_error) == ("killed", "SIGBUS")
    assert RankFeeds._ending(RankFeed(os.getpid()), None) == ("running", None)


def test_state_messages_wait_for_room_and_only_the_latest_of_each_kind_is_sent() -> None:
    from torchmem_magic.agent.rank import RankAgent
    from torchmem_magic.ranks.settings import RankSettings

    sink = RankSink()
    agent = RankAgent(RankSettings(sink.address, 100.0))
    filler = {"k": "events", "pid": 1, "events": []}
    while agent.sender.send(filler):  # the watcher is busy: its socket's queue is full
        pass
    agent._offer({"k": "hello", "pid": 7, "rank": 1})
    agent._offer({"k": "holders", "pid": 7, "series": {"outputs": [[1, 10]]}})
    agent._offer({"k": "holders", "pid": 7, "series": {"outputs": [[1, 10], [2, 20]]}})
    assert agent._send_offered() is False
    assert all(m["k"] == "events" for m in sink.receive())  # the watcher catches up
    assert agent._send_offered() is True
    delivered = sink.receive()
    assert [m["k"] for m in delivered] == ["hello", "holders"]
    assert delivered[1]["series"] == {"outputs": [[1, 10], [2, 20]]}
    assert agent._send_offered() is True and sink.receive() == []  # each delivered once
    agent.sender.close()
    sink.close()
