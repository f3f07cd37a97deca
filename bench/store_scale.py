"""The job store's load as a multi-node job grows from 8 to 1,024 ranks: measured, then modelled.

What the store carries (8 ranks a node, so N/8 nodes, one watcher each): every rank rewrites its
summary key once a second (`PUBLISH_PERIOD_S`), and every watcher reads all N keys once a second
in one multi-get (`RemoteRanks`). So, with S the size of one summary on the wire:

    writes into the store      N keys/s            N·S bytes/s
    reads out of the store     N/8 multi-gets/s    N²/8 keys/s, N²/8·S bytes/s
    one watcher                1 multi-get/s       N keys/s, N·S bytes/s, N decodes/s

Writes grow with N; reads grow with N²: at 1,024 ranks the store serves 131,072 keys a second,
and each watcher decodes 1,024 summaries a second. One node's watcher is the only reader that
needs every rank in full; everyone else needs a headline per rank, and the full summary only of
the few ranks that matter (the worst).

The simulation: a real TCPStore served by a process of its own (its CPU read from /proc), the
real client (`StoreClient`) and the real wire form (`encode_summary` / `decode_summary` of a
summary assembled by a real session of a leaking loop, as `bench/store_publish.py` runs one).
N ranks are played by WRITER_PROCESSES processes with one connection each, every one writing its
share of the ranks' keys on an even schedule (a real rank has its own connection and writes one
key a second: the store sees the same operations, over fewer sockets). N/8 watchers are played by
one measured watcher (the real `RemoteRanks._read`: multi-get, decode, bookkeeping; its thread's
CPU time per read) and READER_PROCESSES processes sharing the other N/8 - 1 watchers' multi-gets
(the same multi-gets, not decoded: decoding is each watcher's own node's cost, measured once).
Each world size runs for a few seconds at the real rate; an operation that falls behind its
schedule is not dropped, so *kept up* compares what was done with what was due.

Two prototypes of what takes over are measured at 1,024 ranks in the same way (the package is
unchanged; their encodings live here):
  headline     each rank writes a compact headline (~0.3 KB) every second and its full summary
               every FULL_PERIOD_S; a watcher reads the N headlines and the full summaries of
               the WORST_RANKS worst ranks each second.
  node digest  each node's watcher (which has its own ranks from their local stream) writes
               one key with its ranks' headlines every second, ranks their full summaries every
               FULL_PERIOD_S; a watcher reads N/8 digests and the WORST_RANKS worst full summaries.
and, at every size, the measured watcher's decode is timed again with `typing.get_type_hints`
cached per class (the reader `saved.from_dict` recomputes them for every object it builds).

Where it stops (the table in docs/benchmarks.md gives the sizes, from the measured costs): the
store's server costs microseconds per key, so its one core is not the first limit; a watcher's
decoding of N summaries a second is (its reader thread reaches a core at about two thousand
ranks, most of it `typing.get_type_hints` recomputed per object), with node 0's outgoing bytes
(N²/8·S, a gigabit a second before 1,024 ranks) and then the server's core close behind. What
the package should change: cache the type hints per class in `saved.from_dict` (the watcher's
cost falls about fivefold); past about a thousand ranks, a compact headline key per rank with
full summaries only of the worst ranks, or better a node digest written by each node's watcher
(far fewer keys, operations and bytes); much further, a job digest written once (by node 0's
watcher) and read by the others, which makes the load linear in N.

Run: python bench/store_scale.py [SECONDS]   (or `python bench/run_all.py store`)
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_publish import Publishing, train_leaking  # noqa: E402
from torchmem_magic.agent.publish import StorePublishing  # noqa: E402
from torchmem_magic.core.model import RankSummary  # noqa: E402
from torchmem_magic.ranks.job import JobStore, decode_summary, encode_summary  # noqa: E402
from torchmem_magic.ranks.remote import RemoteRanks  # noqa: E402
from torchmem_magic.ranks.store_client import StoreClient  # noqa: E402

RANKS_PER_NODE = 8
WORLD_SIZES = (8, 64, 256, 1024)
WRITER_PROCESSES = 2
READER_PROCESSES = 2
READ_PERIOD_S = 1.0  # the watcher's (RemoteRanks reads every PUBLISH_PERIOD_S)
FULL_PERIOD_S = 10.0  # the prototypes' full summaries
WORST_RANKS = 8
HOST = "127.0.0.1"
CONNECT_TIMEOUT_S = 60.0  # children start while others import torch on a loaded machine
JOB_ID = "scale"


def job_of_size(port: int, world_size: int) -> JobStore:
    return JobStore(HOST, port, JOB_ID, 0, world_size, RANKS_PER_NODE, 0)


# ----------------------------------------------------------------------------- one rank's summary


def representative_summary(seconds: float = 6.0) -> bytes:
    """A rolling summary as a leaking rank writes it: a real session (leak finder on) over an MLP
    whose outputs and losses are kept with their graphs, publishing into a store served here."""
    import torch
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    from torchmem_magic.api import watch_from
    from torchmem_magic.core.options import MemwatchOptions

    server = TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
    job = JobStore(HOST, server.port, JOB_ID, 0, 2 * RANKS_PER_NODE, RANKS_PER_NODE, 0)
    publishing = StorePublishing(job, rank=0, local_rank=0)
    held: dict[str, list[torch.Tensor]] = {"outputs": [], "losses": []}  # the names its leak finder sees
    session = watch_from(held, None, MemwatchOptions(100, quiet=True))
    session.listener = Publishing(publishing)
    publishing.start()
    train_leaking(session, seconds, held)
    value = bytes(server.get(job.summary_key(0)))
    publishing.finish(None)
    return value


# ----------------------------------------------------------------------------- the prototypes' wire forms


def headline_of(summary: RankSummary, seq: int, sent_wall_s: float) -> dict[str, Any]:
    """A rank in one line of a status view: what a watcher shows every second for every rank."""
    top = summary.suspects[0] if summary.suspects else None
    return {"rank": summary.rank, "node": summary.node, "seq": seq, "t": sent_wall_s, "status": summary.status,
            "verdict": summary.verdict, "kind": summary.leak_kind, "resource": summary.resource,
            "per_step": summary.per_step_bytes, "steps": summary.steps, "ram": summary.ram.end_bytes,
            "ram_peak": summary.ram.peak_bytes, "heap": None if summary.heap is None else summary.heap.end_bytes,
            "vram": None if summary.vram is None else summary.vram.allocated_peak_bytes,
            "top": None if top is None else [top.name, top.growth_per_step]}


def encode_headline(summary: RankSummary, seq: int, sent_wall_s: float) -> bytes:
    return json.dumps({"v": 1, "h": headline_of(summary, seq, sent_wall_s)}, separators=(",", ":")).encode()


def encode_digest(summaries: list[RankSummary], seq: int, sent_wall_s: float) -> bytes:
    heads = [headline_of(s, seq, sent_wall_s) for s in summaries]
    return json.dumps({"v": 1, "node": heads}, separators=(",", ":")).encode()


def decode_headlines(data: bytes) -> list[dict[str, Any]]:
    message = json.loads(data)
    if not isinstance(message, dict) or message.get("v") != 1:
        return []
    if "h" in message:
        return [message["h"]]
    heads = message.get("node")
    return heads if isinstance(heads, list) else []


def worst_first(heads: list[dict[str, Any]]) -> list[int]:
    """Ranks by how much they worry a reader: leaking first, the fastest growth first."""
    def worry(head: dict[str, Any]) -> tuple[int, float]:
        return (head.get("verdict") == "leak", float(head.get("per_step") or 0.0))
    return [int(h["rank"]) for h in sorted(heads, key=worry, reverse=True)]


def headline_key(job: JobStore, rank: int) -> str:
    return f"{job.prefix}head/{rank}"


def digest_key(job: JobStore, node: int) -> str:
    return f"{job.prefix}node/{node}"


# ----------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Write:
    """One value a writer sets: a rank's full summary or headline, or a node's digest."""

    key: str
    kind: str  # "full", "headline", "digest"
    owner: int  # the rank, or the node for a digest


@dataclass(frozen=True)
class Workload:
    """One world size under one layout of keys: who writes what how often, who reads what."""

    name: str
    world_size: int
    writes: tuple[Write, ...]  # one cycle of writes, spread evenly over cycle_s
    cycle_s: float
    reads: tuple[tuple[str, ...], ...]  # one watcher's read: these multi-gets in turn
    watcher: str  # the measured watcher's way of reading: "full", "headline", "digest"

    @property
    def watchers(self) -> int:
        return max(1, self.world_size // RANKS_PER_NODE)


def current(port: int, world_size: int) -> Workload:
    """What the package does today: full summaries, written and read every second."""
    job = job_of_size(port, world_size)
    keys = tuple(job.summary_key(r) for r in range(world_size))
    writes = tuple(Write(job.summary_key(r), "full", r) for r in range(world_size))
    return Workload("current", world_size, writes, 1.0, ((*keys, job.events_key),), "full")


def _fulls_spread(job: JobStore, world_size: int) -> list[list[Write]]:
    """Each rank's full summary once every FULL_PERIOD_S, spread over the seconds of the cycle."""
    seconds = int(FULL_PERIOD_S)
    return [[Write(job.summary_key(r), "full", r) for r in range(world_size) if r % seconds == s]
            for s in range(seconds)]


def _worst_keys(job: JobStore) -> tuple[str, ...]:
    return tuple(job.summary_key(r) for r in range(WORST_RANKS))


def with_headlines(port: int, world_size: int) -> Workload:
    job = job_of_size(port, world_size)
    heads = [Write(headline_key(job, r), "headline", r) for r in range(world_size)]
    writes = [w for fulls in _fulls_spread(job, world_size) for w in (*heads, *fulls)]
    reads = (tuple(headline_key(job, r) for r in range(world_size)), _worst_keys(job))
    return Workload("headline", world_size, tuple(writes), FULL_PERIOD_S, reads, "headline")


def with_node_digests(port: int, world_size: int) -> Workload:
    job = job_of_size(port, world_size)
    nodes = world_size // RANKS_PER_NODE
    digests = [Write(digest_key(job, n), "digest", n) for n in range(nodes)]
    writes = [w for fulls in _fulls_spread(job, world_size) for w in (*digests, *fulls)]
    reads = (tuple(digest_key(job, n) for n in range(nodes)), _worst_keys(job))
    return Workload("node digest", world_size, tuple(writes), FULL_PERIOD_S, reads, "digest")


# ----------------------------------------------------------------------------- the processes


def _cpu_ticks(stat_path: str) -> int:
    """utime + stime of a process or thread, in clock ticks (fields 14 and 15 of its stat)."""
    with open(stat_path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def server_ticks(pid: int) -> tuple[int, dict[str, int]]:
    """The store server's CPU ticks, and each of its threads'."""
    threads: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            threads[tid] = _cpu_ticks(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
    return _cpu_ticks(f"/proc/{pid}/stat"), threads


def _serve(conn: Connection) -> None:
    """The job's store, as node 0's launcher serves it, in a process of its own."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
    conn.send(int(server.port))
    conn.recv()  # until told to stop


def _client(port: int) -> StoreClient:
    return StoreClient(HOST, port, timeout_s=CONNECT_TIMEOUT_S)


def _schedule(t_start: float, t_end: float, period_s: float) -> Iterator[tuple[int, float]]:
    """(index, lateness in s) of each operation due in [t_start, t_end), as its time comes; ends
    at t_end even when behind (what was not done by then was not kept up with)."""
    index = 0
    while True:
        due = t_start + index * period_s
        now = time.monotonic()
        if due >= t_end or now >= t_end:
            return
        if now < due:
            time.sleep(due - now)
            now = time.monotonic()
        yield index, now - due
        index += 1


class _Values:
    """What a writer sets: each rank's summary (the representative one, renumbered) through the real
    encoder, or the prototypes' headline and digest."""

    def __init__(self, base: RankSummary) -> None:
        self.base = base
        self._ranks: dict[int, RankSummary] = {}

    def rank(self, rank: int) -> RankSummary:
        if rank not in self._ranks:
            self._ranks[rank] = replace(self.base, rank=rank, node=rank // RANKS_PER_NODE,
                                        local_rank=rank % RANKS_PER_NODE)
        return self._ranks[rank]

    def value(self, write: Write, seq: int) -> bytes:
        now = time.time()
        if write.kind == "full":
            return encode_summary(self.rank(write.owner), seq, now, False)
        if write.kind == "headline":
            return encode_headline(self.rank(write.owner), seq, now)
        first = write.owner * RANKS_PER_NODE
        return encode_digest([self.rank(r) for r in range(first, first + RANKS_PER_NODE)], seq, now)


def _base_summary(data: bytes) -> RankSummary:
    published = decode_summary(data)
    assert published is not None, "the representative summary does not decode"
    return published.summary


def _write_load(conn: Connection, port: int, writes: tuple[Write, ...], period_s: float, summary: bytes) -> None:
    """A share of the ranks (and node watchers) writing their keys on schedule."""
    client = _client(port)
    values = _Values(_base_summary(summary))
    for write in writes:  # encoders warm, every key present before the watchers' first read
        client.set(write.key, values.value(write, 0))
    conn.send("ready")
    t_start, t_end = conn.recv()
    done = bytes_in = 0
    lateness: list[float] = []
    for index, late_s in _schedule(t_start, t_end, period_s):
        write = writes[index % len(writes)]
        value = values.value(write, index)
        client.set(write.key, value)
        done += 1
        bytes_in += len(write.key) + len(value)
        lateness.append(late_s)
    due = math.ceil((t_end - t_start) / period_s)
    conn.send({"done": done, "due": due, "bytes": bytes_in, "late_s": lateness})


def _read_load(conn: Connection, port: int, reads: tuple[tuple[str, ...], ...], period_s: float) -> None:
    """A share of the other watchers' reads: the same multi-gets, not decoded."""
    client = _client(port)
    for keys in reads:
        client.read(list(keys))  # each key's one-off existence check, before the timed part
    conn.send("ready")
    t_start, t_end = conn.recv()
    done = keys_out = bytes_out = 0
    latency: list[float] = []
    lateness: list[float] = []
    for _, late_s in _schedule(t_start, t_end, period_s):
        started = time.perf_counter()
        for keys in reads:
            values = client.read(list(keys))
            keys_out += len(values)
            bytes_out += sum(len(v) for v in values.values())
        latency.append(time.perf_counter() - started)
        lateness.append(late_s)
        done += 1
    due = math.ceil((t_end - t_start) / period_s)
    conn.send({"done": done, "due": due, "keys": keys_out, "bytes": bytes_out, "latency_s": latency,
               "late_s": lateness})


class _TimedClient(StoreClient):
    """The real client, keeping what each read returned and how long its round trips took."""

    def __init__(self, port: int) -> None:
        super().__init__(HOST, port, timeout_s=CONNECT_TIMEOUT_S)
        self.wire_s = 0.0
        self.bytes = 0
        self.last: dict[str, bytes] = {}

    def read(self, keys: list[str]) -> dict[str, bytes]:
        started = time.perf_counter()
        values = super().read(keys)
        self.wire_s += time.perf_counter() - started
        self.bytes += sum(len(v) for v in values.values())
        self.last = values
        return values


def _hints_cached() -> Callable[[], None]:
    """`typing.get_type_hints` cached per class (a prototype of the reader's fix); returns the undo."""
    original = typing.get_type_hints
    cached = functools.cache(original)
    typing.get_type_hints = cached  # type: ignore[assignment]

    def undo() -> None:
        typing.get_type_hints = original
    return undo


def _decode_all(values: dict[str, bytes]) -> int:
    return sum(decode_summary(v) is not None for v in values.values())


def _watch(conn: Connection, port: int, workload: Workload) -> None:
    """The measured watcher: one read a second, as the watcher's store reader makes it."""
    job = job_of_size(port, workload.world_size)
    client = _TimedClient(port)
    client.quiet = True
    remote = RemoteRanks(job, time.monotonic)
    keys = [job.summary_key(r) for r in range(workload.world_size)]

    def read_once() -> int:
        if workload.watcher == "full":
            remote._read(client, keys)  # the watcher's own read: multi-get, decode, bookkeeping
            return len(client.last)
        heads = [h for v in client.read(list(workload.reads[0])).values() for h in decode_headlines(v)]
        worst = worst_first(heads)[:WORST_RANKS]
        fulls = client.read([job.summary_key(r) for r in worst])
        _decode_all(fulls)
        return len(heads) + len(fulls)

    read_once()  # each key's one-off existence check
    client.bytes = 0
    conn.send("ready")
    t_start, t_end = conn.recv()
    cpu_s: list[float] = []
    wall_s: list[float] = []
    wire_s: list[float] = []
    cached_cpu_s: list[float] = []
    lateness: list[float] = []
    read_keys = 0
    offset_s = 0.5 * READ_PERIOD_S  # between the load readers' turns, not on top of them
    for _, late_s in _schedule(t_start + offset_s, t_end, READ_PERIOD_S):
        client.wire_s = 0.0
        cpu, wall = time.thread_time(), time.perf_counter()
        read_keys += read_once()
        cpu_s.append(time.thread_time() - cpu)
        wall_s.append(time.perf_counter() - wall)
        wire_s.append(client.wire_s)
        lateness.append(late_s)
        if workload.watcher == "full":  # the same values again, decoded with the type hints cached
            undo = _hints_cached()
            try:
                cpu = time.thread_time()
                _decode_all(client.last)
                cached_cpu_s.append(time.thread_time() - cpu)
            finally:
                undo()
    due = math.ceil((t_end - t_start - offset_s) / READ_PERIOD_S)
    conn.send({"done": len(cpu_s), "due": due, "keys": read_keys, "bytes": client.bytes, "cpu_s": cpu_s, "wall_s": wall_s,
               "wire_s": wire_s, "cached_cpu_s": cached_cpu_s, "late_s": lateness})


# ----------------------------------------------------------------------------- one run


def _split(items: tuple[Write, ...], parts: int) -> list[tuple[Write, ...]]:
    return [items[i::parts] for i in range(parts) if items[i::parts]]


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_workload(workload_of: Callable[[int, int], Workload], world_size: int, seconds: float,
                 summary: bytes) -> dict[str, Any]:
    """One world size for `seconds` at the real rate: what went into and out of the store, what the
    server and the measured watcher spent, and whether every role kept to its schedule."""
    spawn = multiprocessing.get_context("spawn")
    server_end, here = spawn.Pipe()
    server = spawn.Process(target=_serve, args=(server_end,), daemon=True)
    server.start()
    port = int(here.recv())
    workload = workload_of(port, world_size)
    roles: list[tuple[str, Connection, Any]] = []

    def start(role: str, target: Callable[..., None], *args: Any) -> None:
        theirs, ours = spawn.Pipe()
        process = spawn.Process(target=target, args=(theirs, port, *args), daemon=True)
        process.start()
        roles.append((role, ours, process))

    for part in _split(workload.writes, WRITER_PROCESSES):
        start("writer", _write_load, part, workload.cycle_s / len(part), summary)
    try:
        for _, conn, _ in roles:  # every key written once before a reader starts
            assert conn.recv() == "ready"
        start("watcher", _watch, workload)
        others = workload.watchers - 1
        readers = min(READER_PROCESSES, others)
        for _ in range(readers):
            start("reader", _read_load, workload.reads, READ_PERIOD_S * readers / others)
        for role, conn, _ in roles:
            if role != "writer":
                assert conn.recv() == "ready"
        t_start = time.monotonic() + 0.5
        t_end = t_start + seconds
        for _, conn, _ in roles:
            conn.send((t_start, t_end))
        time.sleep(max(0.0, t_start - time.monotonic()))
        ticks_before, threads_before = server_ticks(server.pid or 0)
        time.sleep(max(0.0, t_end - time.monotonic()))
        ticks_after, threads_after = server_ticks(server.pid or 0)
        results: dict[str, list[dict[str, Any]]] = {}
        for role, conn, _ in roles:
            results.setdefault(role, []).append(conn.recv())
    finally:
        for _, conn, process in roles:
            process.join(5.0)
            if process.is_alive():
                process.kill()
        here.send("stop")
        server.join(5.0)
        if server.is_alive():
            server.kill()
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    busiest = max(threads_after[t] - threads_before.get(t, 0) for t in threads_after)
    writers, readers_out, watcher = results["writer"], results.get("reader", []), results["watcher"][0]
    writes_done = sum(w["done"] for w in writers)
    writes_due = sum(w["due"] for w in writers)
    reads_done = sum(r["done"] for r in readers_out) + watcher["done"]
    reads_due = sum(r["due"] for r in readers_out) + watcher["due"]
    load_latency = [s for r in readers_out for s in r["latency_s"]]
    keys_out = sum(r["keys"] for r in readers_out) + watcher["keys"]
    bytes_out = sum(r["bytes"] for r in readers_out) + watcher["bytes"]
    return {
        "name": workload.name, "world_size": world_size, "watchers": workload.watchers, "seconds": seconds,
        "writes_per_s": writes_done / seconds, "writes_due_per_s": writes_due / seconds,
        "bytes_in_per_s": sum(w["bytes"] for w in writers) / seconds,
        "watcher_reads_per_s": reads_done / seconds, "watcher_reads_due_per_s": reads_due / seconds,
        "multi_gets_per_s": reads_done * len(workload.reads) / seconds,
        "keys_out_per_s": keys_out / seconds,
        "bytes_out_per_s": bytes_out / seconds,
        "server_cpu_share": (ticks_after - ticks_before) * tick_s / seconds,
        "server_busiest_thread_share": busiest * tick_s / seconds,
        "server_threads": len(threads_after),
        "watcher_cpu_s": statistics.median(watcher["cpu_s"]) if watcher["cpu_s"] else math.nan,
        "watcher_cached_cpu_s": statistics.median(watcher["cached_cpu_s"]) if watcher["cached_cpu_s"] else None,
        "watcher_wall_s": (statistics.median(watcher["wall_s"]) if watcher["wall_s"] else math.nan,
                           _quantile(watcher["wall_s"], 0.95)),
        "watcher_wire_s": statistics.median(watcher["wire_s"]) if watcher["wire_s"] else math.nan,
        "multi_get_s": (statistics.median(load_latency) if load_latency else math.nan,
                        _quantile(load_latency, 0.95)),
        "watcher_keys_per_read": watcher["keys"] / max(1, watcher["done"]),
        "late_p95_s": _quantile([s for r in (*writers, *readers_out, watcher) for s in r["late_s"]], 0.95),
        "writes_kept_up": writes_done >= 0.97 * writes_due,
        "reads_kept_up": reads_done - watcher["done"] >= 0.97 * (reads_due - watcher["due"]),
        "watcher_kept_up": watcher["done"] >= watcher["due"] and max(watcher["wall_s"], default=0.0) < READ_PERIOD_S,
    }


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ServerModel:
    """The store server's CPU share ≈ per_op_s · operations/s (sets and multi-gets) + per_key_s · keys
    read/s + per_byte_s · bytes/s (in and out), fitted by least squares (no constant) on every run:
    the prototypes' runs, with many keys of few bytes or few keys of many, tell the terms apart."""

    per_op_s: float
    per_key_s: float
    per_byte_s: float

    def share(self, load: Load) -> float:
        return self.per_op_s * load.ops_per_s + self.per_key_s * load.keys_per_s + self.per_byte_s * load.bytes_per_s


@dataclass(frozen=True)
class Load:
    ops_per_s: float
    keys_per_s: float
    bytes_per_s: float


def load_of(row: dict[str, Any]) -> Load:
    return Load(row["writes_per_s"] + row["multi_gets_per_s"], row["keys_out_per_s"],
                row["bytes_in_per_s"] + row["bytes_out_per_s"])


def _least_squares(xs: list[list[float]], ys: list[float], use: list[int]) -> list[float]:
    """Coefficients of the columns `use` (the others 0), by the normal equations."""
    size = len(use)
    a = [[sum(x[i] * x[j] for x in xs) for j in use] + [sum(x[i] * y for x, y in zip(xs, ys))] for i in use]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if a[col][col] == 0:
            return [0.0] * len(xs[0])
        for r in range(size):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [v - factor * w for v, w in zip(a[r], a[col])]
    out = [0.0] * len(xs[0])
    for k, i in enumerate(use):
        out[i] = a[k][size] / a[k][k]
    return out


def fit_server(rows: list[dict[str, Any]]) -> ServerModel:
    """Least squares, dropping a term that comes out negative (too little signal to tell it apart)."""
    loads = [load_of(r) for r in rows]
    xs = [[ld.ops_per_s, ld.keys_per_s, ld.bytes_per_s] for ld in loads]
    ys = [r["server_cpu_share"] for r in rows]
    use = [0, 1, 2]
    while True:
        coefficients = _least_squares(xs, ys, use)
        negative = [i for i in use if coefficients[i] < 0]
        if not negative or len(use) == 1:
            break
        use.remove(negative[0])
    per_op, per_key, per_byte = (max(0.0, c) for c in coefficients)
    return ServerModel(per_op, per_key, per_byte)


def analytic(layout: str, world_size: int, summary_bytes: float, headline_bytes: float) -> Load:
    """The store's load at `world_size` ranks under a layout (see the module's docstring)."""
    n, watchers = float(world_size), world_size / RANKS_PER_NODE
    if layout == "current":
        return Load(n + watchers, watchers * n, n * summary_bytes + watchers * n * summary_bytes)
    fulls_in = n / FULL_PERIOD_S * summary_bytes
    worst_out = watchers * WORST_RANKS * summary_bytes
    if layout == "headline":
        return Load(n + n / FULL_PERIOD_S + 2 * watchers, watchers * (n + WORST_RANKS),
                    n * headline_bytes + fulls_in + watchers * n * headline_bytes + worst_out)
    digest_bytes = RANKS_PER_NODE * headline_bytes
    return Load(watchers + n / FULL_PERIOD_S + 2 * watchers, watchers * (watchers + WORST_RANKS),
                watchers * digest_bytes + fulls_in + watchers * watchers * digest_bytes + worst_out)


def ranks_where(limit: Callable[[int], bool]) -> int:
    """The smallest world size (a whole number of nodes) at which `limit` holds."""
    world = RANKS_PER_NODE
    while not limit(world) and world < 1 << 20:
        world += RANKS_PER_NODE
    return world


# ----------------------------------------------------------------------------- the table


def run(seconds: float = 4.0, sizes: tuple[int, ...] = WORLD_SIZES) -> dict[str, Any]:
    summary = representative_summary()
    rows = [run_workload(current, n, seconds, summary) for n in sizes]
    largest = max(sizes)
    prototypes = [run_workload(with_headlines, largest, seconds, summary),
                  run_workload(with_node_digests, largest, seconds, summary)]
    base = _base_summary(summary)
    headline_bytes = len(encode_headline(base, 100, time.time()))
    return {"summary_bytes": len(summary), "headline_bytes": headline_bytes, "rows": rows, "prototypes": prototypes,
            "seconds": seconds}


def _kb(value: float) -> str:
    return f"{value / 1e3:,.0f}" if value >= 1e4 else f"{value / 1e3:,.1f}"


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f}" if value >= 1e5 else f"{value / 1e6:,.3f}"


def _ms(value: float) -> str:
    return f"{value * 1e3:,.1f}" if value < 0.1 else f"{value * 1e3:,.0f}"


def _kept(row: dict[str, Any]) -> str:
    missed = [role for role, key in (("writes", "writes_kept_up"), ("other watchers' reads", "reads_kept_up"),
                                     ("the measured watcher", "watcher_kept_up")) if not row[key]]
    if not missed:
        return "yes"
    return "no: " + ", ".join(missed) + f" ({row['watcher_reads_per_s']:.0f} of {row['watcher_reads_due_per_s']:.0f} reads/s)"


def _row(row: dict[str, Any], label: str) -> str:
    cached = row["watcher_cached_cpu_s"]
    cpu = _ms(row["watcher_cpu_s"]) + ("" if cached is None else f" ({_ms(cached)})")
    wall, wall_p95 = row["watcher_wall_s"]
    get, get_p95 = row["multi_get_s"]
    gets = "—" if math.isnan(get) else f"{_ms(get)} / {_ms(get_p95)}"
    return (f"| {label} | {row['watchers']} | {row['writes_per_s']:,.0f} | {_kb(row['bytes_in_per_s'])} | "
            f"{row['keys_out_per_s']:,.0f} | {_mb(row['bytes_out_per_s'])} | {row['server_cpu_share'] * 100:.1f}% | "
            f"{cpu} | {_ms(wall)} / {_ms(wall_p95)} | {gets} | {_kept(row)} |")


def render(results: dict[str, Any], load_before: float, load_after: float) -> str:
    rows, prototypes, size = results["rows"], results["prototypes"], float(results["summary_bytes"])
    headline = float(results["headline_bytes"])
    model = fit_server([*rows, *prototypes])
    largest = rows[-1]
    per_summary_s = largest["watcher_cpu_s"] / largest["world_size"]
    per_summary_cached_s = (largest["watcher_cached_cpu_s"] or math.nan) / largest["world_size"]
    worst_s = WORST_RANKS * per_summary_s  # the worst ranks' full summaries, read in full each second
    per_headline_s = max(1e-9, prototypes[0]["watcher_cpu_s"] - worst_s) / prototypes[0]["world_size"]
    headline_core = (1.0 - worst_s) / per_headline_s

    def server_full(layout: str) -> int:
        return ranks_where(lambda n: model.share(analytic(layout, n, size, headline)) >= 1.0)

    def out_past(layout: str, bytes_per_s: float) -> int:
        return ranks_where(lambda n: analytic(layout, n, size, headline).bytes_per_s >= bytes_per_s)

    lines = [
        f"Machine: {os.cpu_count()} cores shared by every role (store server, {WRITER_PROCESSES} writer and "
        f"{READER_PROCESSES} reader processes, the measured watcher); load average {load_before:.1f} before and "
        f"{load_after:.1f} after; produced by `make bench` on {datetime.date.today()}. One summary of a leaking rank "
        f"(two holders, advice, no GPU) is {size:,.0f} B on the wire, the prototypes' headline {headline:,.0f} B. "
        f"{RANKS_PER_NODE} ranks a node: each rank writes its key once a second, each of the N/8 watchers reads all "
        f"N once a second; {results['seconds']:.0f} s a run at that rate. *server CPU*: the store server process's "
        "CPU time over the run's wall time (one thread of it does nearly all); *watcher CPU per read*: the measured "
        "watcher's thread CPU time for one read (multi-get, decode, bookkeeping), which at one read a second is "
        "also its share of a core; in brackets the same decodes with `typing.get_type_hints` cached per class; "
        "*read*: that read's wall time, median / p95 (the machine's crowding shows there); *multi-get*: the other "
        "watchers' multi-gets (not decoded), median / p95.",
        "",
        "| ranks | watchers | writes/s | KB/s in | keys/s out | MB/s out | server CPU | watcher CPU per read, ms "
        "(hints cached) | read ms | multi-get ms | kept up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(row, f"{row['world_size']:,}") for row in rows]
    lines += [_row(row, f"{row['world_size']:,} ({row['name']})") for row in prototypes]
    lines += [
        "",
        f"Fitted on these runs, the store server costs {model.per_op_s * 1e6:.1f} µs per operation, "
        f"{model.per_key_s * 1e6:.2f} µs per key read and {model.per_byte_s * 1e9:.2f} µs per KB moved; "
        f"the watcher {per_summary_s * 1e6:.0f} µs per summary it reads ({per_summary_cached_s * 1e6:.0f} µs with "
        f"the hints cached), {per_headline_s * 1e6:.1f} µs per headline besides the worst ranks' summaries. Where each limit is reached, from those "
        "costs and the load's formulas:",
        "",
        "| layout | a watcher's reader thread at one core | the store server at one core | store out past 1 Gbit/s "
        "| past 10 Gbit/s |",
        "|---|---|---|---|---|",
        f"| today (full summaries) | {1.0 / per_summary_s:,.0f} ranks ({1.0 / per_summary_cached_s:,.0f} with the "
        f"hints cached) | {server_full('current'):,} | {out_past('current', 125e6):,} | "
        f"{out_past('current', 1.25e9):,} |",
        f"| headline | {headline_core:,.0f} | {server_full('headline'):,} | {out_past('headline', 125e6):,} | "
        f"{out_past('headline', 1.25e9):,} |",
        f"| node digest | {headline_core:,.0f} | {server_full('digest'):,} | {out_past('digest', 125e6):,} | "
        f"{out_past('digest', 1.25e9):,} |",
    ]
    limits = {"a watcher's decoding": 1.0 / per_summary_s, "the store server's core": float(server_full("current")),
              "10 Gbit/s out of node 0": float(out_past("current", 1.25e9))}
    first = min(limits, key=lambda k: limits[k])
    lines += ["", f"With today's layout the first of these limits is {first}, at about {limits[first]:,.0f} ranks."]
    return "\n".join(lines)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    sizes = tuple(int(a) for a in sys.argv[2:]) or WORLD_SIZES
    load_before = os.getloadavg()[0]
    results = run(seconds, sizes)
    print(render(results, load_before, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
