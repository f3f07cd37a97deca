"""The watcher's side: what each rank streamed, rebuilt into its timeline, and judged at the end.

`RankFeeds` owns the socket the ranks send to. The watcher's sampler thread drains it every tick
(`poll`), so ranks never wait; at the end, every rank's report is assembled from its stream with
the same `assemble_report` a single process uses (on at most RANK_VERDICT_ROWS rows of each series:
the block's end waits for every rank's). A rank that stopped sending without its final
message was killed: its report is what it sent until then, with how it ended where that can be
known (its exit status, read when it ended even if it is not our child, or the launcher's exception).
The ranks of a multi-node job's other nodes join from the job's store (`remote.RemoteRanks`), once
a rank of this node says where that is.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from ..core.ended import Ended
from ..core.model import RankSummary
from ..probes.oom_kills import oom_kill_counts
from ..probes.exits import ExitWitness
from ..probes.nvml import NvmlProcesses
from ..probes.process import exit_of
from ..report.assemble import RANK_VERDICT_POINTS, RANK_VERDICT_ROWS, assemble_report
from ..report.merge import summary_of
from .job import job_from_fields
from ..stream.feed import RankFeed, apply_message
from .remote import RankHistory, RemoteRanks
from ..stream.transport import RankSink

if TYPE_CHECKING:
    from ..render.results import Report

NVML_PERIOD_S = 2.0
POLL_PERIOD_S = 0.1


def rank_numbers(feeds: Sequence[RankFeed]) -> dict[int, int]:
    """pid -> rank number; a process that has not said its rank yet gets the next free number, in
    order of arrival (as in the final report)."""
    taken = {f.rank for f in feeds if f.rank is not None}
    numbers: dict[int, int] = {}
    free = 0
    for feed in feeds:
        if feed.rank is not None:
            numbers[feed.pid] = feed.rank
            continue
        while free in taken:
            free += 1
        numbers[feed.pid] = free
        taken.add(free)
    return numbers


def attempt_numbers(feeds: Sequence[RankFeed], numbers: dict[int, int]) -> dict[int, int | None]:
    """pid -> its attempt: where torchrun restarted a rank (several processes of one rank number), 0, 1,
    ... in the order they started; None for a rank that ran once."""
    by_rank: dict[int, list[RankFeed]] = {}
    for feed in feeds:
        by_rank.setdefault(numbers[feed.pid], []).append(feed)
    out: dict[int, int | None] = {}
    for group in by_rank.values():
        ordered = sorted(group, key=lambda f: (f.started_wall_s, f.pid))
        for attempt, feed in enumerate(ordered):
            out[feed.pid] = attempt if len(group) > 1 else None
    return out


def last_processes(feeds: Sequence[RankFeed], numbers: dict[int, int]) -> set[int]:
    """The pids that are their rank's last process (a restart's earlier ones aside)."""
    latest: dict[int, int] = {}
    for feed in sorted(feeds, key=lambda f: (f.started_wall_s, f.pid)):
        latest[numbers[feed.pid]] = feed.pid
    return set(latest.values())


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            state = file.read().rpartition(b")")[2].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def died_of(feed: RankFeed) -> str | None:
    """How a rank that ended abnormally died: its signal's name ("SIGKILL, by the OOM killer" where the
    kernel's OOM-kill counters rose meanwhile), else its exit code."""
    exit_info = feed.exit
    if exit_info is None:
        return None
    if exit_info.signal_number is not None:
        import signal

        try:
            name = signal.Signals(exit_info.signal_number).name
        except ValueError:
            return f"signal {exit_info.signal_number}"
        return f"{name}, by the OOM killer" if feed.oom_killed else name
    return f"exit code {exit_info.exit_code}" if exit_info.exit_code else None


def rank_report(feed: RankFeed) -> Report:
    """A rank's report from what it streamed: its own session's report, assembled on the bounded rows a
    watcher judges every rank on (the block's end waits for all of them)."""
    return assemble_report(feed.evidence(), max_rows=RANK_VERDICT_ROWS, max_points=RANK_VERDICT_POINTS)


def _signal_name(name: str | None) -> str | None:
    return name if not name or name.startswith("SIG") else f"SIG{name}"


class RankFeeds:
    """Every rank's feed, by pid (a process is one rank; its rank number may come later)."""

    def __init__(
        self, clock: Callable[[], float] = time.perf_counter, oom_counts: Callable[[], dict[str, int]] = oom_kill_counts,
        own_process: bool = False,
    ) -> None:
        self._own_process = own_process  # the `watch` command's process, not a user's (see RemoteRanks)
        self._sink = RankSink()
        self.address = self._sink.address
        self._clock = clock
        self._started_s = clock()
        self._started_wall_s = time.time()
        self.feeds: dict[int, RankFeed] = {}
        try:  # what is made after the sink: a Ctrl-C here must not leave the sink's directory behind
            self._nvml = NvmlProcesses()
            self._exits = ExitWitness(clock)
        except BaseException:
            self._sink.close()
            raise
        self._oom_counts = oom_counts  # the kernel's OOM-kill counters (the system's, each cgroup's)
        self._oom_before: dict[str, int] | None = None  # read when the first rank reports
        self._next_nvml_s = 0.0
        self._next_poll_s = 0.0
        self._lock = threading.Lock()  # polled by the sampler thread, read by the live figure and at the end
        self.remote: RemoteRanks | None = None  # the other nodes' ranks, once a rank names a multi-node job

    def start(self, started_s: float) -> None:
        """The watcher's t_s = 0 (its session's start), on `clock` and on the wall clock."""
        self._started_s, self._started_wall_s = started_s, time.time()

    def poll(self, force: bool = False) -> None:
        """Drain the socket (sampler thread), at most every POLL_PERIOD_S unless `force`d: ranks send
        four times a second, and every read is a system call that lets go of the GIL."""
        now_s = self._clock() - self._started_s
        if not force and now_s < self._next_poll_s:
            return
        self._next_poll_s = now_s + POLL_PERIOD_S
        messages = self._sink.receive()
        with self._lock:
            for message in messages:
                self._apply(message, now_s)
            for feed in self.feeds.values():
                self._note_exit(feed)
            self._follow_job()
            if now_s >= self._next_nvml_s and any(f.cuda_devices for f in self.feeds.values()):
                self._next_nvml_s = now_s + NVML_PERIOD_S
                self._read_contexts()

    def _follow_job(self) -> None:
        """Read the other nodes' ranks from the job's store once a rank of this node names it; say
        when this node's ranks are done, and which of them died."""
        if self.remote is None:
            named = next((f.job for f in self.feeds.values() if f.job is not None), None)
            job = job_from_fields(named)
            if job is None:
                return
            self.remote = RemoteRanks(job, lambda: self._clock() - self._started_s, silence_stderr=self._own_process)
            self.remote.start()
        feeds = list(self.feeds.values())
        for feed in feeds:
            if feed.final is None and feed.exit is not None and feed.exit.abnormal and feed.rank is not None:
                self.remote.report_death(feed.rank, feed.pid, died_of(feed))
        last = last_processes(feeds, rank_numbers(feeds))
        if any(f.final is not None or f.exit is not None for f in feeds if f.pid in last):  # not a restart's past
            self.remote.ending()

    @property
    def store_problem(self) -> str | None:
        """One line when the other nodes' ranks could not be read from the job's store."""
        return None if self.remote is None else self.remote.problem

    def _read_contexts(self) -> None:
        """Which devices each rank holds a context on, as the driver sees it (only once a rank uses CUDA:
        a context is gone when its process ends, so this runs during the run)."""
        seen = self._nvml.read()
        for uuid, processes in (seen or {}).items():
            for pid, used in processes.items():
                feed = self.feeds.get(pid)
                if feed is not None:
                    feed.cuda_contexts[uuid] = max(used, feed.cuda_contexts.get(uuid, 0))

    def _apply(self, message: dict[str, Any], now_s: float) -> None:
        pid = message["pid"]
        feed = self.feeds.get(pid)
        if feed is None:
            feed = self.feeds[pid] = RankFeed(pid)
            self._exits.watch(pid)
            if self._oom_before is None:
                self._oom_before = self._oom_counts()
        apply_message(feed, message, now_s, self._started_wall_s)

    def snapshot(self) -> list[RankFeed]:
        with self._lock:
            return list(self.feeds.values())

    def summaries(self, ended_by: Ended | None = None) -> tuple[RankSummary, ...] | None:
        """Every rank's summary (None when no rank reported: a single-process run).

        `ended_by` is what ended the watched block; a launcher's exception naming a process
        (torch's `ProcessExitedException`) tells how that rank ended."""
        with self._lock:
            if not self.feeds:
                return None
            numbers = rank_numbers(list(self.feeds.values()))
            attempts = attempt_numbers(list(self.feeds.values()), numbers)
            out = []
            for pid, feed in self.feeds.items():
                self._note_exit(feed)
                status, ended = self._ending(feed, ended_by)
                # bounded: every rank is judged here, on one thread, while the block's end waits
                report = rank_report(feed)
                out.append(summary_of(
                    report, rank=numbers[pid], pid=pid, host=feed.host, status=status, ended=ended,
                    last_seen_s=feed.last_seen_s, stalled_s=feed.last_seen_s - feed.progress_s, exited_s=feed.exited_s,
                    local_rank=feed.local_rank, dropped=feed.dropped,
                    cuda_contexts=tuple(
                        {"device": uuid, "used": used, "own": uuid in feed.cuda_devices}
                        for uuid, used in sorted(feed.cuda_contexts.items())
                    ),
                    node=None if feed.job is None else feed.job.get("node"), attempt=attempts[pid],
                ))
            # the other nodes' ranks, as the store last showed them; where the block failed (the job did), one
            # that never finished was stopped with it
            out.extend(self._remote_summaries(numbers, job_failed=ended_by is not None))
            return tuple(out)

    def remote_summaries(self) -> tuple[RankSummary, ...]:
        """The other nodes' ranks as the job's store last showed them (none outside a multi-node
        job); this node's own ranks are left out (their stream says more)."""
        with self._lock:
            return self._remote_summaries(rank_numbers(list(self.feeds.values())))

    def _remote_summaries(self, numbers: dict[int, int], job_failed: bool = False) -> tuple[RankSummary, ...]:
        return () if self.remote is None else self.remote.summaries(skip=set(numbers.values()), job_failed=job_failed)

    def remote_histories(self, skip: Collection[int]) -> tuple[RankHistory, ...]:
        """The other nodes' ranks' points, one each time the job's store showed a new summary: what
        their live curves are drawn from (none outside a multi-node job)."""
        return () if self.remote is None else self.remote.histories(skip=skip)

    def _note_exit(self, feed: RankFeed) -> None:
        """When and how a rank that has not finished ended: from the exit witness, else from `waitid`
        (only a child of the watcher, such as a rank its notebook started)."""
        if feed.final is not None or feed.exited_s is not None:
            return
        seen = self._exits.ended(feed.pid)
        if seen is not None:
            feed.exited_s = seen[0] - self._started_s
            feed.exit = feed.exit or seen[1]
        if feed.exit is None:
            feed.exit = exit_of(feed.pid)
            if feed.exit is None:
                return
        if feed.exit.signal_number == 9 and not feed.oom_decided and self._oom_before is not None:  # SIGKILL
            feed.oom_decided = True
            now = self._oom_counts()
            feed.oom_killed = any(now.get(where, 0) > count for where, count in self._oom_before.items())

    @staticmethod
    def _ending(feed: RankFeed, ended_by: Ended | None) -> tuple[str | None, str | None]:
        """(status, how it ended) for a rank without its final message; (None, ...) keeps the report's."""
        ended = died_of(feed)
        if ended is None and ended_by is not None and ended_by.error_pid == feed.pid:
            signal_name = _signal_name(ended_by.signal_name)
            code = ended_by.exit_code
            ended = signal_name or (f"exit code {code}" if code else "raised an exception")
        if feed.final is not None:  # it finished its run; a failure its launcher saw still counts
            return ("error" if ended is not None else None), ended
        if _alive(feed.pid):
            return "running", None
        return "killed", ended

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
        self._exits.close()
        self._sink.close()
        self._nvml.close()
