"""The reading side: the record of a run whose process died, rebuilt into a Report.

A record whose writer still runs is another kernel's live run, and one removed at the end of its
run was never a crash: what is left are the runs that did not end. Each is replayed through the
same code that rebuilds a killed rank's report from its stream, then told as a death: when, the
last readings against their limits, and what most likely killed it.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..core.resources import RAM, SHM, VRAM_RESERVED
from ..analysis.forensics import death_explanation
from ..render.advice import advice_lines
from ..core.model import DeviceMemory
from ..core.schema import from_dict
from ..stream.feed import RankFeed, apply_message
from ..report.assemble import assemble_report
from ..render.results import Report
from .place import SHOWN_SUFFIX, SUFFIX, notebook_identity, process_alive, records_dir
from ..probes.oom_kills import oom_kill_counts


@dataclass
class CrashRecord:
    """One record of a run that did not end, read back."""

    path: Path
    hello: dict[str, Any]
    feed: RankFeed
    verdict: dict[str, Any] | None = None
    skipped_lines: int = 0  # lines that did not parse (a write the kill cut short)
    devices: tuple[DeviceMemory, ...] = field(default=())
    terminated_by: str | None = None  # the signal's name when the process was terminated (SIGTERM), not killed
    terminated_wall_s: float | None = None

    @property
    def shown(self) -> bool:
        return self.path.name.endswith(SHOWN_SUFFIX)

    @property
    def started_wall_s(self) -> float:
        return float(self.hello.get("started_wall_s", 0.0))

    @property
    def died_wall_s(self) -> float:
        """When its last line was written: it died within a flush period (half a second) after (at
        once, for a termination: its handler wrote the last line)."""
        if self.terminated_wall_s is not None:
            return self.terminated_wall_s
        return self.started_wall_s + self.feed.elapsed_s


def read_record(path: Path) -> CrashRecord | None:
    """The record at `path`, or None when it is not one (no `hello` line)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    hello: dict[str, Any] | None = None
    feed = RankFeed(pid=0)
    verdict = None
    terminated: tuple[str, float] | None = None
    skipped = 0
    for line in data.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if not isinstance(message, dict) or not isinstance(message.get("k"), str):
            skipped += 1
            continue
        if message["k"] == "hello":
            hello = message
            feed.pid = int(message.get("pid", 0))
        elif message["k"] == "verdict":
            verdict = message
        elif message["k"] == "terminated":
            terminated = (str(message.get("signal", "SIGTERM")), float(message.get("wall_s", 0.0)))
        if isinstance(message.get("pid"), int):
            apply_message(feed, message, now_s=feed.elapsed_s, watcher_started_wall_s=0.0)
    if hello is None:
        return None
    devices = tuple(from_dict(DeviceMemory, d) for d in hello.get("devices", ()))
    record = CrashRecord(path, hello, feed, verdict, skipped, devices)
    if terminated is not None:
        record.terminated_by, record.terminated_wall_s = terminated
    return record


def _own(path: Path) -> bool:
    try:
        return not hasattr(os, "getuid") or path.stat().st_uid == os.getuid()
    except OSError:
        return False


def crash_records(all_notebooks: bool = False, directory: Path | None = None) -> list[CrashRecord]:
    """The records of runs that did not end, newest first: this notebook's (or every notebook's),
    this user's only, none whose writer still runs."""
    directory = directory if directory is not None else records_dir()
    try:
        paths = [p for p in directory.iterdir() if p.name.endswith(SUFFIX) and _own(p)]
    except OSError:
        return []
    identity = notebook_identity()
    records = []
    for path in paths:
        record = read_record(path)
        if record is None:
            continue
        hello = record.hello
        if not all_notebooks and hello.get("notebook") != identity:
            continue
        if process_alive(int(hello.get("pid", 0)), hello.get("proc_start")):
            continue
        records.append(record)
    return sorted(records, key=lambda r: -r.started_wall_s)


def crash_report(record: CrashRecord) -> Report:
    """The report of the run up to its death, with the death told first in its advice."""
    feed = record.feed
    report = assemble_report(feed.evidence())
    hello = record.hello
    timeline = feed.timeline.by_time
    shm_total = hello.get("shm_total_bytes")
    lines = advice_lines(death_explanation(
        died_at=datetime.datetime.fromtimestamp(record.died_wall_s).strftime("%Y-%m-%d %H:%M:%S"),
        ran_s=feed.elapsed_s,
        steps=feed.steps,
        ram_bytes=timeline.last_value(RAM.column),
        ram_limit_bytes=int(hello.get("ram_limit_bytes") or 0),
        ram_limit_source=str(hello.get("ram_limit_source", "system")),
        shm_bytes=timeline.last_value(SHM.column),
        shm_total_bytes=None if shm_total is None else int(shm_total),
        vram_reserved_bytes=timeline.last_value(VRAM_RESERVED.column),
        vram_total_bytes=sum(d.total_bytes or 0 for d in record.devices) or None,
        oom_kills_before=dict(hello.get("oom_kills", {})),
        oom_kills_now=oom_kill_counts(),
        last_verdict=None if record.verdict is None else str(record.verdict.get("text")),
        terminated_by=record.terminated_by,
    ))
    advice = tuple(a for a in report.advice if "is OOM-killed in" not in a)  # a projection: it came true
    error = "the death of its kernel" if record.terminated_by is None else f"its kernel's termination ({record.terminated_by})"
    return replace(
        report, status="killed", error=error, advice=(*lines, *advice),
        steps_to_exhaustion=None, seconds_to_exhaustion=None,
    )


def last_crash(all_notebooks: bool = False) -> Report | None:
    """The report of the newest `%%memwatch` run of this notebook whose kernel died before the run
    ended (status "killed"), else None. Records stay on disk until `clear_crashes()`."""
    records = crash_records(all_notebooks)
    return crash_report(records[0]) if records else None


def clear_crashes(all_notebooks: bool = False) -> int:
    """Delete this notebook's crash records (every notebook's with `all_notebooks`); how many."""
    removed = 0
    for record in crash_records(all_notebooks):
        try:
            record.path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def unshown_crash() -> tuple[Report, CrashRecord] | None:
    """The newest record of this notebook not shown yet (what the first `%load_ext` of a new kernel
    tells once: `mark_shown` once it was shown, so that a display cut short shows it again)."""
    for record in crash_records():
        if not record.shown:
            return crash_report(record), record
    return None


def mark_shown(record: CrashRecord) -> None:
    """Rename the record as shown (it stays for `last_crash()` until `clear_crashes()`)."""
    if record.shown:
        return
    shown = record.path.with_name(record.path.name[: -len(SUFFIX)] + SHOWN_SUFFIX)
    try:
        os.replace(record.path, shown)
    except OSError:
        return
    record.path = shown
