"""The flight recorder in process: what a record holds, that it stays bounded, that a cut-short record
reads back, and what a death is explained as (the kernel tests kill real kernels)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from torchmem_magic import MemwatchSession
from torchmem_magic.flight import recorder as recorder_module
from torchmem_magic.flight.crashes import crash_records, crash_report, read_record
from torchmem_magic.flight.place import ENV_RECORD_DIR, process_alive, process_start_ticks, records_dir
from torchmem_magic.flight.recorder import FlightRecorder
from torchmem_magic.analysis.forensics import death_explanation
from torchmem_magic.render.advice import advice_lines
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.finder.leak_finder import LeakSearch
from torchmem_magic.core.options import SessionOptions

GIB = 1 << 30


@pytest.fixture
def record_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(ENV_RECORD_DIR, str(tmp_path))
    return tmp_path


def _recorded_session(recorder: FlightRecorder, search: LeakSearch | None = None) -> MemwatchSession:
    return MemwatchSession(SessionOptions(10), recorder=recorder, search=search)


def test_the_records_directory_follows_the_platform_and_the_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_RECORD_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if sys.platform.startswith("linux"):
        assert records_dir() == tmp_path / "cache" / "torchmem_magic" / "flight"
    monkeypatch.setenv(ENV_RECORD_DIR, str(tmp_path / "mine"))
    assert records_dir() == tmp_path / "mine"


def test_a_run_writes_its_record_as_it_goes_and_removes_it_when_it_ends(record_dir: Path) -> None:
    kept: list[torch.Tensor] = []
    recorder = FlightRecorder("for step in range(n): ...")
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with _recorded_session(recorder, LeakSearch(lambda: [Root("kept", "user", "kept", kept)])) as session:
        for _ in range(40):
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            kept.append(torch.ones(1 << 14))
            time.sleep(0.02)
        assert recorder.path is not None and recorder.path.exists()
        lines = [json.loads(line) for line in recorder.path.read_text().splitlines()]
        record = read_record(recorder.path)
    assert not recorder.path.exists() and list(record_dir.iterdir()) == []  # a normal end leaves nothing
    assert lines[0]["k"] == "hello" and lines[0]["pid"] == os.getpid() and lines[0]["cell"].startswith("for step")
    assert {"events", "holders"} <= {line["k"] for line in lines}
    assert record is not None and record.feed.steps >= 20  # the last flush: at most half a second behind
    assert session.report is not None and record.feed.steps <= session.report.steps
    text = json.dumps(lines)
    assert "kept" in text and "tensor(" not in text  # names and figures, no tensor data


def test_a_long_run_keeps_a_bounded_file(record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder_module, "MAX_BYTES", 64 << 10)
    recorder = FlightRecorder()  # a timeline of 200 rows at most: what a rewrite holds fits well in 64 KiB
    session = MemwatchSession(SessionOptions(10, watch_ranks=False, timeline_rows=200), recorder=recorder)
    session.start()
    try:
        assert session._sampler is not None and recorder.path is not None
        session._sampler.stop()  # the test feeds the rows, a long run's worth, at simulated times
        for i in range(20_000):
            row = session.background.row()
            row["t_s"] = i * 0.1
            session.timeline.by_time.append(row)
            recorder._next_flush_s = 0.0
            assert session.view is not None
            recorder.on_sample(session.view, i * 0.1)
        size = recorder.path.stat().st_size
        record = read_record(recorder.path)
    finally:
        session.stop()
    assert size < 2 * (64 << 10) and recorder.errors.count == 0
    assert record is not None and record.feed.timeline.by_time.count >= 100  # rewritten, not truncated
    assert record.feed.timeline.by_time.last_value("t_s") == pytest.approx(19_999 * 0.1, abs=30)


def test_a_record_cut_short_mid_line_reads_back_without_its_last_line(record_dir: Path) -> None:
    recorder = FlightRecorder()
    with _recorded_session(recorder):
        time.sleep(1.2)
        assert recorder.path is not None
        whole = recorder.path.read_bytes()
    cut = record_dir / "cut.jsonl"
    cut.write_bytes(whole + b'{"k":"events","pid":1,"ev')  # a write the kill cut short
    record = read_record(cut)
    assert record is not None and record.skipped_lines == 1 and record.feed.timeline.by_time.count >= 5


def test_only_records_of_dead_processes_of_this_notebook_count(record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/train.ipynb")

    def write(name: str, pid: int, notebook: str) -> None:
        hello = {"k": "hello", "pid": pid, "proc_start": process_start_ticks(pid), "notebook": notebook,
                 "started_wall_s": time.time(), "interval_s": 0.1, "ram_limit_bytes": GIB}
        events = {"k": "events", "pid": pid, "clock": "optimizer", "counts": {"optimizer": 3}, "t_s": 1.0,
                  "events": [["s", [0.5, 3, 1e8, 1e8, 5e7, 0, 0, None, None, 0]]]}
        (record_dir / name).write_text(json.dumps(hello) + "\n" + json.dumps(events) + "\n")

    write("mine.jsonl", dead_pid, "/home/me/train.ipynb")
    write("other-notebook.jsonl", dead_pid, "/home/me/eval.ipynb")
    write("alive.jsonl", os.getpid(), "/home/me/train.ipynb")  # a run still going on
    assert [r.path.name for r in crash_records()] == ["mine.jsonl"]
    assert {r.path.name for r in crash_records(all_notebooks=True)} == {"mine.jsonl", "other-notebook.jsonl"}
    report = crash_report(crash_records()[0])
    assert report.status == "killed" and report.steps == 3
    assert report.advice[0].startswith("the kernel died during this run")
    assert process_alive(os.getpid(), process_start_ticks(os.getpid())) and not process_alive(dead_pid, None)


def _explain(**overrides: object) -> list[str]:
    facts: dict[str, object] = dict(
        died_at="2026-11-30 12:00:00", ran_s=95.0, steps=1200, ram_bytes=1.0 * GIB, ram_limit_bytes=4 * GIB,
        ram_limit_source="cgroup v2", shm_bytes=0.0, shm_total_bytes=GIB, vram_reserved_bytes=float("nan"),
        vram_total_bytes=None, oom_kills_before={"system": 3}, oom_kills_now={"system": 3}, last_verdict=None,
    )
    facts.update(overrides)
    return list(advice_lines(death_explanation(**facts)))  # type: ignore[arg-type]


def test_a_death_is_explained_by_the_limit_it_was_at_and_plainly_when_it_cannot_be_known() -> None:
    assert _explain(ram_bytes=3.9 * GIB)[-1] == "RAM was at 98% of its limit (cgroup v2): most likely the OOM killer"
    counted = _explain(ram_bytes=3.9 * GIB, oom_kills_now={"system": 4})[-1]
    assert counted.startswith("the OOM killer killed processes since the run began (1 in the system)")
    assert "cannot be known" in _explain()[-1]
    assert "/dev/shm was 95% full" in _explain(shm_bytes=0.95 * GIB)[-1]
    lines = _explain(last_verdict="leak: per-iteration in heap")
    assert lines[0] == "the kernel died during this run, at about 2026-11-30 12:00:00, 1.6 min and 1,200 steps in"
    assert "the live verdict then: leak: per-iteration in heap" in lines


class _FullDisk:
    """The recorder's `os`, on a disk that takes a new file but no byte more (a full tmpfs)."""

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    @staticmethod
    def write(fd: int, data: bytes) -> int:
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_leaves_no_empty_record_and_says_why_the_run_is_not_recorded(
    record_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    monkeypatch.setattr(recorder_module, "os", _FullDisk())
    handler = signal.getsignal(signal.SIGTERM)
    recorder = FlightRecorder("x = 1")
    with _recorded_session(recorder) as session:
        assert signal.getsignal(signal.SIGTERM) == handler  # nothing to mark on a termination
        assert list(record_dir.iterdir()) == []  # no empty record for the next kernel to stumble on
    assert session.report is not None and session.report.status == "ok"
    assert recorder.unavailable is not None and recorder.unavailable.startswith("no flight record: [Errno 28]")
    assert list(record_dir.iterdir()) == []
    said = [line for line in session.report.advice if line.startswith("the flight record failed")]
    assert len(said) == 1 and "No space left on device" in said[0] and "this report is whole" in said[0], said
    assert [(e.source, e.count) for e in session.report.source_errors] == [("flight record", 1)]


def test_a_record_that_fails_mid_run_is_counted_in_the_report(record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush that raises (not only a full disk) is counted, never swallowed: the run and its report go on."""
    recorder = FlightRecorder("loop")

    def broken_flush(run: object) -> None:
        raise ValueError("injected fault")

    with _recorded_session(recorder) as session:
        monkeypatch.setattr(recorder, "_flush", broken_flush)
        recorder.on_sample(session.view, 1e9)  # type: ignore[arg-type]
    assert session.report is not None and session.report.status == "ok"
    failed = [e for e in session.report.source_errors if e.source == "flight record"]
    assert failed and failed[0].last == "ValueError: injected fault"
    assert list(record_dir.iterdir()) == []  # removed when the run ended, as always


def test_a_sigterm_is_written_to_the_record_then_handed_to_the_handler_it_replaced(record_dir: Path) -> None:
    import signal

    terminations: list[int] = []
    saved = signal.signal(signal.SIGTERM, lambda signum, frame: terminations.append(signum))
    try:
        recorder = FlightRecorder("loop")
        with _recorded_session(recorder):
            signal.raise_signal(signal.SIGTERM)
            assert terminations == [signal.SIGTERM]  # chained, never swallowed
            assert recorder.path is not None
            record = read_record(recorder.path)
        assert record is not None and record.terminated_by == "SIGTERM"
        report = crash_report(record)
        assert report.status == "killed" and "termination (SIGTERM)" in (report.error or "")
        assert any(a.startswith("SIGTERM ended it from outside") for a in report.advice)
        assert signal.getsignal(signal.SIGTERM) is not recorder._on_sigterm  # put back when the run ended
        signal.raise_signal(signal.SIGTERM)
        assert terminations == [signal.SIGTERM] * 2
    finally:
        signal.signal(signal.SIGTERM, saved)


TERMINATED_RUN = """
import os, signal, time, torch
from torchmem_magic import MemwatchSession
from torchmem_magic.flight.recorder import FlightRecorder
from torchmem_magic.core.options import SessionOptions
with MemwatchSession(SessionOptions(10), recorder=FlightRecorder("terminated")):
    for step in range(10**6):
        torch.ones(64).sum()
        if step == 200:
            os.kill(os.getpid(), signal.SIGTERM)  # the default handler before the run: the process dies
print("survived the termination")
"""


def test_a_process_terminated_mid_run_dies_of_it_and_its_record_says_terminated(record_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", TERMINATED_RUN], capture_output=True, text=True, timeout=120)
    assert done.returncode == -15, done.stderr[-2000:]
    assert "survived" not in done.stdout
    records = crash_records(all_notebooks=True, directory=record_dir)
    assert len(records) == 1 and records[0].terminated_by == "SIGTERM"
    assert crash_report(records[0]).status == "killed"
