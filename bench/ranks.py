"""What watching ranks costs: each rank's own step time with and without memwatch, and the transport.

Overhead: a fork-launched DDP loop (gloo on CPU, a small model) runs bare and under
`torchmem_magic.memwatch(quiet=True)`, in rounds of bare–watched–bare launches (A-B-A, so drift of
the machine cancels). Every rank times its own steps after the first 64 (the densely sampled start,
a one-off) and writes them to a file; the figure per launch is the median over its ranks of each
rank's median step time. Under memwatch a rank also says how much CPU its own session used: it ends
its session itself once the timed loop is done (what its exit would do a moment later), because the
sampler thread's CPU time is known only then.

Transport: forked senders push typical `events` messages at a `RankSink` as fast as it drains them,
drained continuously and, as the watcher does, once per sampling interval (a Unix datagram socket
queues only a few datagrams: what waits beyond that stays in the ranks' outboxes); the encode and
decode cost of one message; and what real ranks sent per second at the default interval, counted
where the watcher decodes.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torchmem_magic
from torchmem_magic.stream import transport
from torchmem_magic.stream.protocol import MAX_EVENTS_PER_MESSAGE, decode, encode
from torchmem_magic.core.options import DEFAULT_INTERVAL_MS
from torchmem_magic.core.timeline import COLUMNS

DENSE_START_STEPS = 64  # sampled densely by every rank's session: a one-off, not timed
TIMED_STEPS = 800


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rank_loop(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank: a small DDP model (about 1 ms a step here), its timed steps written to `out_dir`."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(32, 128)

    def step() -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    for _ in range(DENSE_START_STEPS):
        step()
    times_s = []
    started_s = time.perf_counter()
    for _ in range(TIMED_STEPS):
        t0 = time.perf_counter()
        step()
        times_s.append(time.perf_counter() - t0)
    wall_s = time.perf_counter() - started_s
    own_cpu_s = session_s = None
    from torchmem_magic.agent import rank as rank_agent

    if rank_agent._agent is not None and rank_agent._agent[0] == os.getpid():
        watcher = rank_agent._agent[1]
        watcher.finish()  # what the process's exit would do next; the sampler's CPU is known after it
        if watcher.session is not None:
            own_cpu_s, session_s = watcher.session.own_cpu_s, watcher.session.runtime.elapsed_s()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
        "pid": os.getpid(), "times_s": times_s, "wall_s": wall_s, "own_cpu_s": own_cpu_s, "session_s": session_s,
    }))
    dist.barrier()
    dist.destroy_process_group()


def launch(world: int, watched: bool) -> list[dict[str, Any]]:
    """One fork launch of `world` ranks, bare or under memwatch; what each rank measured."""
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as out_dir:
        context = torchmem_magic.memwatch(quiet=True) if watched else nullcontext()
        with context:
            # torch's launcher is untyped and reached through torch.multiprocessing's star import
            mp.start_processes(  # type: ignore[attr-defined, no-untyped-call]
                rank_loop, args=(world, _free_port(), out_dir), nprocs=world, start_method="fork")
        return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def overhead(world: int, rounds: int = 5) -> dict[str, Any]:
    """Rounds of bare–watched–bare launches: step times (each rank's median, then over ranks and
    rounds), the watched/bare ratio per round and rank, and each watched rank's own CPU share."""
    bare_ms: list[float] = []
    watched_ms: list[float] = []
    ratios: list[float] = []
    own_shares: list[float] = []
    for _ in range(rounds):
        before = launch(world, watched=False)
        during = launch(world, watched=True)
        after = launch(world, watched=False)
        for r in range(world):
            bare = (statistics.median(before[r]["times_s"]) + statistics.median(after[r]["times_s"])) / 2
            watched = statistics.median(during[r]["times_s"])
            bare_ms += [statistics.median(before[r]["times_s"]) * 1e3, statistics.median(after[r]["times_s"]) * 1e3]
            watched_ms.append(watched * 1e3)
            ratios.append(watched / bare)
            if during[r]["own_cpu_s"] is not None:
                own_shares.append(during[r]["own_cpu_s"] / during[r]["wall_s"])
    return {
        "world": world, "rounds": rounds, "bare_ms": _quartiles(bare_ms), "watched_ms": _quartiles(watched_ms),
        "ratio": _quartiles(ratios), "own_cpu_share": _quartiles(own_shares) if own_shares else None,
        "own_cpu_reported": len(own_shares), "rank_runs": len(ratios),
    }


# ----------------------------------------------------------------------------- transport


def events_message(events: int, pid: int = 1) -> dict[str, Any]:
    """An `events` message as a rank's flush sends it: `events` timeline rows (floats, some absent)."""
    row = [12.345678, 1234.0, 3.1e8, 2.9e8, 1.2e8, None, 0.0, None, None, None, None, None]
    row = (row + [None] * len(COLUMNS))[: len(COLUMNS)]
    return {
        "k": "events", "pid": pid, "rank": 1, "local_rank": 1, "clock": "optimizer",
        "counts": {"optimizer": 1234, "backward": 1234, "batch": 0, "forward": 1234},
        "t_s": 12.345678, "dropped": 0, "events": [["s" if i % 2 else "t", row] for i in range(events)],
    }


def _send_all(address: str, message: dict[str, Any], count: int) -> None:
    """A sender process: `count` messages, retried while the watcher's buffer is full (none lost)."""
    sender = transport.RankSender(address)
    for _ in range(count):
        while not sender.send(message):
            time.sleep(0.0002)
    sender.close()
    os._exit(0)


def datagram_queue_length() -> int | None:
    """How many datagrams a Unix datagram socket queues before senders get EAGAIN (Linux; its
    SO_RCVBUF does not raise it)."""
    try:
        return int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    except (OSError, ValueError):
        return None


def codec_us(events: int) -> tuple[float, float]:
    """(encode, decode) µs of one `events` message: the rank's and the watcher's CPU per message."""
    message = events_message(events)
    data = encode(message)
    repeat = 2000 // events + 20
    best = []
    for work in (lambda: encode(message), lambda: decode(data)):
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(repeat):
                work()
            runs.append((time.perf_counter() - started) / repeat * 1e6)
        best.append(min(runs))
    return best[0], best[1]


def throughput(senders: int, events: int, seconds: float = 2.0, poll_s: float = 0.0) -> dict[str, float]:
    """Messages and MB a `RankSink` receives (and decodes) per second from `senders` processes at once,
    draining continuously (`poll_s` 0) or once every `poll_s`, as the watcher's sampler thread does."""
    message = events_message(events)
    size = len(encode(message))
    per_sender = max(50, int(seconds * 40e6 / size / senders))  # at most ~40 MB/s: enough to saturate
    if poll_s:
        per_sender = max(20, int(seconds / poll_s * 12 / senders))
    sink = transport.RankSink()
    try:
        pids = []
        for _ in range(senders):
            pid = os.fork()
            if pid == 0:
                _send_all(sink.address, message, per_sender)
            pids.append(pid)
        expected, received = senders * per_sender, 0
        started_s = time.perf_counter()
        deadline_s = started_s + 60
        while received < expected and time.perf_counter() < deadline_s:
            got = sink.receive()
            received += len(got)
            if poll_s:
                time.sleep(poll_s)
            elif not got:
                time.sleep(0.0005)
        elapsed_s = time.perf_counter() - started_s
        for pid in pids:
            os.waitpid(pid, 0)
    finally:
        sink.close()
    return {
        "senders": senders, "events": events, "bytes": size, "received": received, "expected": expected, "poll_s": poll_s,
        "messages_per_s": received / elapsed_s, "mb_per_s": received * size / elapsed_s / 1e6,
        "us_per_message": elapsed_s / max(received, 1) * 1e6,
    }


@contextmanager
def _counting_decode() -> Iterator[dict[int, list[int]]]:
    """Count, per sending pid, the messages and bytes the watcher decodes (pid -> [messages, bytes])."""
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    original: Callable[[bytes], dict[str, Any] | None] = getattr(transport, "decode")  # what the sink calls

    def counting(data: bytes) -> dict[str, Any] | None:
        message = original(data)
        if message is not None:
            entry = counts[message["pid"]]
            entry[0] += 1
            entry[1] += len(data)
        return message

    setattr(transport, "decode", counting)
    try:
        yield counts
    finally:
        setattr(transport, "decode", original)


def stream_rate(world: int = 2, launches: int = 3) -> dict[str, float]:
    """What one rank sends per second at the default interval, from real watched launches."""
    rates, message_rates, sizes = [], [], []
    for _ in range(launches):
        with _counting_decode() as counts:
            results = launch(world, watched=True)
        for result in results:
            # everything the rank's session sent (its hello and final included) over the session's seconds
            messages, sent = counts[result["pid"]]
            rates.append(sent / result["session_s"])
            message_rates.append(messages / result["session_s"])
            sizes.append(sent / messages)
    return {
        "bytes_per_s": statistics.median(rates), "messages_per_s": statistics.median(message_rates),
        "bytes_per_message": statistics.median(sizes),
    }


def long_run_own_cpu(world: int = 2, steps: int = 8000) -> dict[str, float]:
    """A rank's own CPU share over a longer run: the start's one-off costs (the holder scans' first
    allowance, the dense first samples) weigh on a 1 s loop, not on a run of minutes."""
    global TIMED_STEPS
    saved, TIMED_STEPS = TIMED_STEPS, steps
    try:
        results = launch(world, watched=True)
    finally:
        TIMED_STEPS = saved
    shares = [r["own_cpu_s"] / r["wall_s"] for r in results if r["own_cpu_s"] is not None]
    return {"steps": steps, "wall_s": statistics.median(r["wall_s"] for r in results),
            "own_cpu_share": statistics.median(shares) if shares else float("nan")}


def run() -> dict[str, Any]:
    torch.set_num_threads(1)
    return {
        "overhead": [overhead(2), overhead(4)],
        "long_run": long_run_own_cpu(),
        "throughput": [throughput(n, e) for e in (MAX_EVENTS_PER_MESSAGE, 4) for n in (1, 4)]
        + [throughput(4, e, poll_s=DEFAULT_INTERVAL_MS / 1e3) for e in (MAX_EVENTS_PER_MESSAGE, 4)],
        "codec_us": {e: codec_us(e) for e in (MAX_EVENTS_PER_MESSAGE, 4)},
        "queue_length": datagram_queue_length(),
        "stream": stream_rate(),
        "cores": os.cpu_count(),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
