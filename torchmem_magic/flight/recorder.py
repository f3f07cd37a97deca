"""The writing side: while a `%%memwatch` run goes, its record grows on disk, line by line.

A record is a file of JSON lines in the messages a rank streams to its watcher (`hello`, `events`,
`holders`), plus `verdict` (the live verdict when the live figure computed one). It holds figures,
step counts and names, never tensor data. The sampler thread writes it, at most every
`FLUSH_PERIOD_S`, with one `write()` per line to a file opened for appending: the lines are in the
operating system's page cache the moment the call returns, so a SIGKILL of the process loses only
what came after the last write, and a line is never half there (a reader skips one that is). When the
file passes `MAX_BYTES` it is rewritten from the session's own bounded timeline (written aside, then
renamed over the old one: at every moment one whole record exists), so a day-long run keeps a file
of a few hundred KiB. When the run ends, in any way the process survives, the record is removed.

A SIGTERM (how Jupyter's shutdown and job schedulers end a kernel) ends the process as before, but
first writes a line saying so, so that the record tells a termination from a kill: the recorder's
handler runs on the main thread, writes that line, then hands the signal on to the handler it
replaced (by default: the process dies of it), and is put back when the run ends.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from ..stream.protocol import events_message, row_values
from ..stream.transport import Outbox
from ..core.timeline import COLUMNS, DecimatingSeries
from ..probes.base import ErrorCount
from ..probes.oom_kills import oom_kill_counts
from .place import SUFFIX, identity_key, notebook_identity, process_start_ticks, records_dir

if TYPE_CHECKING:
    from ..core.model import Clock, DeviceMemory, Suspect
    from ..probes.limits import MemoryLimit
    from ..probes.shm import ShmReading
    from ..core.timeline import Timeline


class RecordedRun(Protocol):
    """What the recorder reads of the run it records (the session's live view)."""

    @property
    def started_wall_s(self) -> float: ...
    @property
    def interval_s(self) -> float: ...
    @property
    def shm_path(self) -> str: ...
    @property
    def timeline(self) -> Timeline: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def clock_counts(self) -> dict[Clock, int]: ...
    @property
    def ram_limit(self) -> MemoryLimit: ...
    @property
    def heap_available(self) -> bool: ...
    @property
    def devices_at_start(self) -> tuple[DeviceMemory, ...]: ...
    @property
    def elapsed_s(self) -> float: ...
    @property
    def holder_scans_so_far(self) -> int: ...
    def shm_usage(self) -> ShmReading | None: ...
    def holders_so_far(self) -> tuple[dict[str, list[tuple[int, int]]], tuple[Suspect, ...]]: ...
    def last_live_verdict(self) -> tuple[float, str] | None: ...

FORMAT = 1
FLUSH_PERIOD_S = 0.5  # at most this much of a run is lost when the process is killed
MAX_BYTES = 2 << 20
RECORD_SOURCE = "flight record"  # its failures, as the report counts them
#: what a failed record costs: had the kernel died, the report shown afterwards would miss what was not written
RECORD_COST = "had the kernel died, this run could not have been shown in full afterwards (this report is whole)"


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _series_events(kind: str, series: DecimatingSeries) -> list[Any]:
    columns = series.columns(*COLUMNS)
    rows = len(columns[COLUMNS[0]])
    return [[kind, row_values({name: columns[name][i] for name in COLUMNS})] for i in range(rows)]


class FlightRecorder:
    """Writes one run's record (see the module's docstring). Everything but `__init__` and `start`
    runs on the session's sampler thread, or after it stopped."""

    def __init__(self, cell: str = "", directory: Path | None = None) -> None:
        self.outbox = Outbox()  # the session's relayed timeline fills it (see RelayTimeline)
        self.cell = cell
        self.directory = directory if directory is not None else records_dir()
        self.path: Path | None = None
        self.bytes_written = 0
        self.errors = ErrorCount(RECORD_SOURCE, cost=RECORD_COST)  # a full disk: the run goes on, its report says so
        self.unavailable: str | None = None  # why there is no record at all
        self._fd: int | None = None
        self._hello: dict[str, Any] = {}
        self._holders: dict[str, Any] | None = None
        self._verdict: dict[str, Any] | None = None
        self._holder_scans = -1
        self._next_flush_s = 0.0
        self._rewrite_at_bytes = MAX_BYTES
        self._pid = os.getpid()
        self._sigterm_installed = False
        self._previous_sigterm: Any = None  # the handler this run's replaced (None: one not set from Python)

    def start(self, run: RecordedRun) -> None:
        """Create the record and write who, where and under which limits (after the run's start)."""
        identity = notebook_identity()
        pid = os.getpid()
        started_ns = time.time_ns()
        self.path = self.directory / f"{identity_key(identity)}-{pid}-{started_ns}{SUFFIX}"
        limit = run.ram_limit
        shm = run.shm_usage()
        self._hello = {
            "k": "hello", "format": FORMAT, "pid": pid, "proc_start": process_start_ticks(pid),
            "uid": os.getuid() if hasattr(os, "getuid") else None, "host": socket.gethostname(),
            "notebook": identity, "cell": self.cell[:2000], "started_wall_s": run.started_wall_s,
            "interval_s": run.interval_s, "ram_limit_bytes": limit.limit_bytes,
            "ram_limit_source": limit.source, "heap_available": run.heap_available,
            "shm_path": run.shm_path, "shm_total_bytes": None if shm is None else shm.total_bytes,
            "devices": [d.to_dict() for d in run.devices_at_start],
            "oom_kills": oom_kill_counts(),
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:  # a read-only home, a full disk: the run goes on, unrecorded
            self.unavailable = f"no flight record: {exc}"
            self.errors.record(exc)
            return
        self._write(_line(self._hello))
        if self.bytes_written == 0:  # a full disk takes the file but not its first line: no record at all
            self.close()
            return
        self._watch_sigterm()

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, data)
            self.bytes_written += len(data)
        except OSError as exc:
            self.errors.record(exc)
            if self.unavailable is None:
                what = "no flight record" if self.bytes_written == 0 else "the flight record stops early"
                self.unavailable = f"{what}: {exc}"

    def _watch_sigterm(self) -> None:
        """Install the SIGTERM handler (see the module's docstring); only the main thread can."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):  # no signals here (an embedded interpreter)
            return
        self._sigterm_installed = True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """The record says the process was terminated, then the signal goes where it went before."""
        previous = self._previous_sigterm
        if os.getpid() == self._pid:  # not in a forked child (a DataLoader worker inherits the handler)
            self._write(_line({"k": "terminated", "signal": signal.Signals(signum).name, "wall_s": time.time()}))
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default (or a handler not set from Python): die of it
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def _restore_sigterm(self) -> None:
        """Put back the handler this run replaced, unless another one replaced this run's since."""
        if not self._sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        self._sigterm_installed = False
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous_sigterm is None else self._previous_sigterm)

    def on_sample(self, run: RecordedRun, now_s: float) -> None:
        """Called after each background reading: every FLUSH_PERIOD_S, append what is new. Never raises
        (the reading it follows must not be lost to a failure here)."""
        if self._fd is None or now_s < self._next_flush_s:
            return
        self._next_flush_s = now_s + FLUSH_PERIOD_S
        try:
            self._flush(run)
        except Exception as exc:
            self.errors.record(exc)

    def _flush(self, run: RecordedRun) -> None:
        lines = []
        while len(self.outbox):
            lines.append(_line(self._events(run, self.outbox.take())))
        if run.holder_scans_so_far != self._holder_scans:
            self._holder_scans = run.holder_scans_so_far
            series, suspects = run.holders_so_far()
            self._holders = {
                "k": "holders", "pid": self._hello["pid"],
                "series": {name: [list(p) for p in points] for name, points in series.items()},
                "suspects": [s.to_dict() for s in suspects],
            }
            lines.append(_line(self._holders))
        verdict = run.last_live_verdict()
        if verdict is not None and (self._verdict is None or self._verdict["text"] != verdict[1]):
            self._verdict = {"k": "verdict", "pid": self._hello["pid"], "t_s": verdict[0], "text": verdict[1]}
            lines.append(_line(self._verdict))
        if lines:
            self._write(b"".join(lines))
        if self.bytes_written > self._rewrite_at_bytes:
            self._rewrite(run)

    def _events(self, run: RecordedRun, events: list[Any]) -> dict[str, Any]:
        return events_message(
            self._hello["pid"], run.clock, run.clock_counts, run.elapsed_s, self.outbox.dropped, events
        )

    def _rewrite(self, run: RecordedRun) -> None:
        """The record again from the run's bounded timeline: written aside, then renamed over."""
        assert self.path is not None and self._fd is not None
        timeline = run.timeline
        events = [*_series_events("t", timeline.by_time), *_series_events("s", timeline.by_step)]
        events += [["p", m.t_s, m.loader, list(m.steps)] for m in timeline.epochs]
        self.outbox.take(len(self.outbox))  # all of it is in the timeline already
        body = [_line(self._hello), _line(self._events(run, events))]
        body += [_line(m) for m in (self._holders, self._verdict) if m is not None]
        aside = self.path.with_name(self.path.name + ".tmp")
        fd = -1
        try:
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
            os.write(fd, b"".join(body))
            os.replace(aside, self.path)
        except OSError as exc:  # a full disk: the old record stays, and so does its descriptor
            self.errors.record(exc)
            if fd >= 0:
                os.close(fd)
            return
        old_fd, self._fd, self.bytes_written = self._fd, fd, sum(len(b) for b in body)
        if old_fd is not None:  # swapped first: a Ctrl-C here never leaves a closed number to close again
            os.close(old_fd)
        # a timeline that alone fills most of MAX_BYTES is not rewritten at every flush
        self._rewrite_at_bytes = max(MAX_BYTES, 2 * self.bytes_written)

    def close(self) -> None:
        """The run ended and this process lives on: its record is not needed (idempotent)."""
        self._restore_sigterm()
        fd, self._fd = self._fd, None  # forgotten first: a close repeated after a Ctrl-C never closes it twice
        if fd is not None:
            os.close(fd)
        if self.path is not None:
            for path in (self.path, self.path.with_name(self.path.name + ".tmp")):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    self.errors.record(exc)
