"""The parts that meet a job's c10d store, against a real TCPStore served in this process (port 0):
the client that fails fast and quietly (a refused port, a server that is no store, a store that went
away), the rank's publisher, and the watcher's reader that keeps what it last read."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import pytest
from test_saved import _rank
from torch.distributed import TCPStore

from torchmem_magic.ranks.feed import RankFeeds
from torchmem_magic.ranks.job import JobStore, encode_death, encode_summary
from torchmem_magic.ranks.publisher import SummaryPublisher
from torchmem_magic.ranks.remote import RemoteRanks
from torchmem_magic.ranks.store_client import StoreClient, StoreUnavailable
from torchmem_magic.stream.transport import RankSender

def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def server() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _job(port: int, world_size: int = 2) -> JobStore:
    return JobStore("127.0.0.1", port, "test", 0, world_size, 1, 0)


def test_a_refused_store_fails_at_once_in_one_line_and_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        StoreClient("127.0.0.1", _closed_port())
    assert time.monotonic() - started < 0.5
    assert "cannot be reached" in str(caught.value) and "\n" not in str(caught.value)
    assert capfd.readouterr().err == ""


def _connecting() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "torchmem_magic-store-connect"]


def test_a_server_that_is_no_store_is_given_up_at_our_deadline(capfd: pytest.CaptureFixture[str]) -> None:
    accepted: list[tuple[socket.socket, object]] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            StoreClient("127.0.0.1", listener.getsockname()[1], timeout_s=0.5)
        assert time.monotonic() - started < 2.0  # torch's own client would wait on it for over a minute
        assert "does not answer as a c10d store" in str(caught.value) and "\n" not in str(caught.value)
        assert capfd.readouterr().err == ""
        # the abandoned connect wakes when the server hangs up: here, not while Python shuts down
        for connection, _ in accepted:
            connection.close()
    _until(lambda: not _connecting())
    capfd.readouterr()  # torch's own warnings of that late failure


def test_the_client_reads_only_keys_that_exist_and_stops_at_its_first_failure() -> None:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = StoreClient("127.0.0.1", server.port)
    server.set("a", b"1")
    # a set gets no reply: its round trip on the same connection makes the server have it before the client asks
    # (beside a CPU burner the client's check once came first, on its own connection, and read nothing)
    assert server.get("a") == b"1"
    assert client.read(["a", "missing"]) == {"a": b"1"}  # a missing key does not block
    client.set("b", b"2")
    assert client.read(["a", "b"]) == {"a": b"1", "b": b"2"}
    client.quiet = True
    del server  # the store goes away
    with pytest.raises(StoreUnavailable, match="went away"):
        client.read(["a"])
    with pytest.raises(StoreUnavailable):  # and no further call is tried
        client.set("a", b"x")


def test_the_publisher_writes_the_latest_offer_then_the_final_summary(server: TCPStore) -> None:
    publisher = SummaryPublisher("127.0.0.1", server.port, "k")
    publisher.start()
    publisher.offer(b"first")
    publisher.offer(b"second")  # replaces an offer not yet written
    _until(lambda: server.check(["k"]) and server.get("k") == b"second")
    assert publisher.finish(b"final") and server.get("k") == b"final"
    assert publisher.problem is None and 1 <= publisher.written <= 3 and publisher.cpu_s > 0


def test_a_publisher_without_a_store_ends_with_one_line_and_costs_nothing_more(capfd: pytest.CaptureFixture[str]) -> None:
    publisher = SummaryPublisher("127.0.0.1", _closed_port(), "k")
    publisher.start()
    _until(lambda: publisher.problem is not None)
    publisher.offer(b"ignored")
    started = time.monotonic()
    assert not publisher.finish(b"final") and time.monotonic() - started < 0.5
    assert "cannot be reached" in (publisher.problem or "") and capfd.readouterr().err == ""


def _publish(server: TCPStore, job: JobStore, rank: int, seq: int, final: bool = False, verdict: str = "leak",
             pid: int | None = None) -> None:
    summary = replace(_rank(rank, verdict, 65_536.0 if verdict == "leak" else None), status="ok" if final else "running")
    if pid is not None:
        summary = replace(summary, pid=pid)
    server.set(job.summary_key(rank), encode_summary(summary, seq, time.time(), final))


def test_a_rank_torchrun_restarted_is_two_entries_its_first_process_stopped(server: TCPStore) -> None:
    job = _job(server.port)
    _publish(server, job, 0, 0, verdict="clean")
    _publish(server, job, 1, 4)  # rank 1's first process
    remote = RemoteRanks(job, time.monotonic)
    remote.start()
    try:
        _until(lambda: [(s.rank, s.pid) for s in remote.summaries()] == [(0, 1000), (1, 1001)])
        _publish(server, job, 1, 0, pid=2001)  # a restart: its next process takes over the key
        _until(lambda: len(remote.summaries()) == 3)
        entries = [(s.rank, s.pid, s.attempt, s.status) for s in remote.summaries()]
        assert entries == [(0, 1000, None, "running"), (1, 1001, 0, "killed"), (1, 2001, 1, "running")]
    finally:
        remote.close()


def test_the_reader_keeps_every_ranks_last_summary_once_the_store_is_gone(capfd: pytest.CaptureFixture[str]) -> None:
    """In the `watch` command's own process (`silence_stderr`), even torch's warning is kept off stderr."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    job = _job(server.port)
    _publish(server, job, 0, 0, verdict="clean")
    _publish(server, job, 1, 4)
    remote = RemoteRanks(job, time.monotonic, silence_stderr=True)
    remote.start()
    try:
        _until(lambda: len(remote.summaries()) == 2)
        assert [(s.rank, s.status, s.via) for s in remote.summaries()] == [(0, "running", "store"), (1, "running", "store")]
        assert [s.rank for s in remote.summaries(skip={0})] == [1]
        del server
        _until(lambda: remote.lost)
        assert remote.problem is not None and "went away" in remote.problem and "\n" not in remote.problem
        gone = remote.summaries()
        assert [(s.rank, s.status, s.verdict) for s in gone] == [(0, "stale", "clean"), (1, "stale", "leak")]
        assert gone[1].heap is not None and gone[1].heap.end_bytes == 70 << 20  # its last figures
        assert capfd.readouterr().err == ""  # one line (ours), no warning of torch's
    finally:
        remote.close()


def test_in_a_users_process_the_reader_never_points_fd_2_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """fd 2 is process-wide: the user's threads write to it (and a kernel captures it), so a session in their
    process reads the store without ever redirecting it, also when the store goes away; our line says why."""
    from torchmem_magic.ranks import store_client

    redirected: list[str] = []
    monkeypatch.setattr(store_client, "stderr_silenced", lambda: redirected.append("fd 2") or contextlib.nullcontext())
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    job = _job(server.port)
    _publish(server, job, 0, 0, verdict="clean")
    feeds = RankFeeds()
    remote = RemoteRanks(job, time.monotonic)
    remote.start()
    try:
        _until(lambda: len(remote.summaries()) == 1)
        del server
        _until(lambda: remote.lost)
        assert remote.problem is not None and "went away" in remote.problem
        assert redirected == [] and feeds._own_process is False
    finally:
        remote.close()
        feeds.close()


def test_deaths_reach_the_other_nodes_and_final_summaries_end_the_reading(server: TCPStore) -> None:
    job = _job(server.port)
    _publish(server, job, 0, 0, verdict="clean")
    _publish(server, job, 1, 2)
    here, there = RemoteRanks(job, time.monotonic), RemoteRanks(job, time.monotonic)
    here.start()
    there.start()
    try:
        here.report_death(1, 1001, "SIGKILL")  # node 0's watcher saw its rank 1 killed
        _until(lambda: server.check([job.events_key]) and server.get(job.events_key) == encode_death(1, 1001, "SIGKILL"))
        _until(lambda: there.reads > 0)
        reads = there.reads
        there.ending()  # this node's ranks are done: the others' finals may come any moment, the store go soon after
        _until(lambda: there.reads >= reads + 5, timeout_s=1.0)  # far more often than once a second
        _until(lambda: [s.status for s in there.summaries()] == ["running", "killed"])
        assert there.summaries()[1].ended == "SIGKILL"
        _publish(server, job, 0, 1, final=True, verdict="clean")
        _publish(server, job, 1, 3, final=True)
        _until(lambda: not there._thread.is_alive())  # every rank is final: nothing more to read
        assert [s.status for s in there.summaries()] == ["ok", "ok"] and not there.lost
    finally:
        here.close()
        there.close()


def test_a_watcher_whose_ranks_name_an_unreachable_store_says_so_once_and_keeps_its_ranks() -> None:
    feeds = RankFeeds()
    try:
        feeds.start(0.0)
        sender = RankSender(feeds.address)
        job = _job(_closed_port())
        assert sender.send({"k": "hello", "pid": os.getpid(), "rank": 0, "local_rank": 0, "host": "here",
                            "started_wall_s": time.time(), "job": job.fields()})
        sender.close()
        _until(lambda: feeds.poll(force=True) is None and feeds.store_problem is not None)
        assert "cannot be reached" in (feeds.store_problem or "")
        summaries = feeds.summaries()
        assert summaries is not None and [(s.rank, s.via, s.node) for s in summaries] == [(0, "stream", 0)]
    finally:
        feeds.close()


def _ended_of(feeds: RankFeeds, rank: int) -> str | None:
    """How rank `rank` ended, as the feeds say after a forced poll (None: not yet)."""
    feeds.poll(force=True)
    return {s.rank: s.ended for s in feeds.summaries() or ()}[rank]


def _sleeping_ranks(feeds: RankFeeds) -> list[subprocess.Popen[bytes]]:
    """Two child processes the feeds know as ranks 0 and 1."""
    victims = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    for rank, victim in enumerate(victims):
        feeds._apply({"k": "hello", "pid": victim.pid, "rank": rank, "host": "a"}, 0.0)
    return victims


def test_a_rank_sigkilled_while_the_oom_kill_counters_rose_died_by_the_oom_killer() -> None:
    counts = {"system": 7, "cgroup:/job": 2}
    feeds = RankFeeds(oom_counts=lambda: dict(counts))
    victims = _sleeping_ranks(feeds)
    try:
        victims[0].kill()  # the kill counters have not moved: a kill from outside
        _until(lambda: _ended_of(feeds, 0) is not None)
        counts["cgroup:/job"] += 1  # the kernel's OOM killer, in this job's cgroup
        victims[1].kill()
        _until(lambda: _ended_of(feeds, 1) is not None)
        ended = {s.rank: (s.status, s.ended) for s in feeds.summaries() or ()}
        assert ended == {0: ("killed", "SIGKILL"), 1: ("killed", "SIGKILL, by the OOM killer")}
    finally:
        for victim in victims:
            victim.kill()
        feeds.close()


def test_a_rank_whose_exit_came_from_waitid_before_the_witness_is_not_judged_again_when_the_witness_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = {"system": 7}
    feeds = RankFeeds(oom_counts=lambda: dict(counts))
    witness_late = threading.Event()  # set: the exit witness reports what it saw
    seen = feeds._exits.ended
    monkeypatch.setattr(feeds._exits, "ended", lambda pid: seen(pid) if witness_late.is_set() else None)
    victims = _sleeping_ranks(feeds)
    try:
        victims[0].kill()  # from outside: the counters have not moved
        _until(lambda: _ended_of(feeds, 0) is not None)  # known from waitid alone
        assert feeds.feeds[victims[0].pid].exited_s is None  # the premise: the witness has not said it yet
        counts["system"] += 1  # the OOM killer, for rank 1
        victims[1].kill()
        witness_late.set()
        _until(lambda: _ended_of(feeds, 1) is not None and feeds.feeds[victims[0].pid].exited_s is not None)
        ended = {s.rank: s.ended for s in feeds.summaries() or ()}
        assert ended == {0: "SIGKILL", 1: "SIGKILL, by the OOM killer"}
    finally:
        for victim in victims:
            victim.kill()
            victim.wait()
        feeds.close()
