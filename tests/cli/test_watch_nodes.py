"""Two torchrun "nodes" on this machine, each under its own `python -m torchmem_magic watch`: every
node's report has every rank of the job, the other node's through the job's own c10d store.

Rank 1 runs on node 1 and keeps each step's output with its graph. Node 0's watcher sees rank 1 only
through the store, yet its report must name rank 1's leak, its holder and host, at about the rate
the script measured. Killing node 1 outright (its watcher, launcher and rank, SIGKILL) mid-run, once
node 0's live status has named rank 1's leak, must leave rank 1 in node 0's report with its last
summary and a status that says it went away. That one also runs on two hosts: two network
namespaces joined by a veth pair, each with a host name of its own, where this machine allows it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from watching import SCRIPTS, environment, free_port, leftovers, load, torchrun, watch_command


DDP = str(SCRIPTS / "ddp_leak.py")
TOLERANCE = 0.20
HOST = socket.gethostname()


@dataclass(frozen=True)
class Hosts:
    """Where the two nodes run: what runs a command on each, its host name, its network interface."""

    address: str  # node 0's, where the job's store is
    names: tuple[str, str]
    prefixes: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    interfaces: tuple[str, str] | None = None  # gloo's, where a host name does not resolve

    def start(self, node: int, cmd: list[str], tmp: Path) -> subprocess.Popen[str]:
        env = environment(tmp)
        if self.interfaces is not None:
            env["GLOO_SOCKET_IFNAME"] = self.interfaces[node]
        return subprocess.Popen([*self.prefixes[node], *cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)


LOCALHOST = Hosts("127.0.0.1", (HOST, HOST))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture(params=["localhost", "two network namespaces"])
def hosts(request: pytest.FixtureRequest) -> Iterator[Hosts]:
    if request.param == "localhost":
        yield LOCALHOST
        return
    tag = f"{os.getpid() % 100_000}"
    spaces, links, addresses = (f"tmw{tag}a", f"tmw{tag}b"), (f"tmv{tag}a", f"tmv{tag}b"), ("10.231.7.1", "10.231.7.2")
    try:
        for space in spaces:
            _ip("netns", "add", space)
    except (OSError, subprocess.SubprocessError) as exc:
        for space in spaces:
            subprocess.run(["ip", "netns", "del", space], capture_output=True)
        detail = getattr(exc, "stderr", None) or exc
        pytest.skip(f"network namespaces are not available here (root and `ip netns` needed): {str(detail).strip()}")
    try:
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for space, link, address in zip(spaces, links, addresses):
            _ip("link", "set", link, "netns", space)
            _ip("-n", space, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", space, "link", "set", link, "up")
            _ip("-n", space, "link", "set", "lo", "up")
        names = ("tm-node-a", "tm-node-b")
        # a UTS namespace too, so that each host has a name of its own
        prefixes = tuple(("ip", "netns", "exec", space, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name)
                         for space, name in zip(spaces, names))
        yield Hosts(addresses[0], names, prefixes, links)  # type: ignore[arg-type]
    finally:
        for space in spaces:  # deleting a namespace deletes its end of the pair, and so the pair
            subprocess.run(["ip", "netns", "del", space], capture_output=True)


def _node_command(
    node: int, backend: str, port: int, run_id: str, save: Path, *script: str, options: tuple[str, ...] = (),
    address: str = "127.0.0.1",
) -> list[str]:
    launch = [*torchrun(), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--rdzv-id", run_id]
    if backend == "static":
        launch += ["--rdzv-backend", "static", "--master-addr", address, "--master-port", str(port)]
    else:
        launch += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{address}:{port}"]
    return watch_command(*launch, DDP, *script, save=save, options=options)


def _start(cmd: list[str], tmp: Path) -> subprocess.Popen[str]:
    return LOCALHOST.start(0, cmd, tmp)


def _ranks(report: dict) -> dict[int, dict]:
    return {entry["rank"]: entry for entry in report["ranks"]}


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_each_node_reports_every_rank_of_the_job(backend: str, tmp: Path, tmp_path: Path) -> None:
    port, facts = free_port(), tmp_path / "facts.json"
    saves = [tmp_path / f"node{node}.json" for node in (0, 1)]
    watchers = [_start(_node_command(node, backend, port, f"job-{backend}", saves[node], "--holder", "local",
                                     "--facts", str(facts)), tmp) for node in (0, 1)]
    outputs = [w.communicate(timeout=240) for w in watchers]
    assert [w.returncode for w in watchers] == [0, 0], [err[-3000:] for _, err in outputs]
    expected = load(facts)["output_bytes"]  # one step's kept output
    streamed = []  # the rank each watcher had from its own node (c10d's rendezvous orders the nodes as they come)
    for node in (0, 1):
        report = load(saves[node])
        ranks = _ranks(report)
        assert sorted(ranks) == [0, 1], f"node {node}: {sorted(ranks)}"
        own = [r for r, entry in ranks.items() if entry["via"] == "stream"]
        assert len(own) == 1 and ranks[1 - own[0]]["via"] == "store"
        streamed.append(own[0])
        assert [ranks[0]["node"], ranks[1]["node"]] == [0, 1]  # one rank a node: the node rank is the rank
        assert ranks[0]["host"] == ranks[1]["host"] == HOST
        assert report["verdict"] == "leak" and report["worst_rank"] == 1
        leaking, clean = ranks[1], ranks[0]
        assert (leaking["verdict"], leaking["leak_kind"], leaking["status"]) == ("leak", "per-iteration", "ok")
        assert (clean["verdict"], clean["status"]) == ("clean", "ok")
        assert leaking["steps"] == clean["steps"] == 200
        held = {s["name"]: s for s in leaking["suspects"]}
        assert "kept_outputs" in held and held["kept_outputs"]["rank"] == 1
        assert abs(held["kept_outputs"]["growth_per_step"] - expected) <= TOLERANCE * expected
        assert abs(leaking["per_step"] - expected) <= TOLERANCE * expected
    assert sorted(streamed) == [0, 1]
    text = outputs[streamed.index(0)][0]  # the report of the node whose own rank is clean
    assert "verdict: leak (worst rank: 1)" in text and "rank 1: kept_outputs" in text
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["0", f"1@{HOST}"]  # rank@host: another node's rank
    # the saved files still merge, one entry per rank though each file lists both
    shown = subprocess.run([sys.executable, "-m", "torchmem_magic", "show", *map(str, saves)], env=environment(tmp),
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "merged from 2 saved reports" in shown.stdout and "verdict: leak (worst rank: 1)" in shown.stdout
    assert len([line for line in shown.stdout.splitlines() if line.strip()[:1].isdigit()]) == 2
    assert leftovers(tmp) == []
    assert all("the job's store" not in err for _, err in outputs)  # no complaint of ours


def _descendants(pid: int) -> list[int]:
    """`pid` and every process under it (the launcher starts each rank in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as file:
                    parent = int(file.read().rpartition(b")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def test_a_node_killed_mid_run_stays_in_the_other_nodes_report(hosts: Hosts, tmp: Path, tmp_path: Path) -> None:
    port, facts, run_id = free_port(), tmp_path / "facts.json", "job-killed"
    saves = [tmp_path / f"node{node}.json" for node in (0, 1)]
    script = ("--holder", "local", "--facts", str(facts), "--steps", "4000")
    watchers = [hosts.start(node, _node_command(node, "static", port, run_id, saves[node], *script, address=hosts.address,
                                                options=("--status-every", "1") if node == 0 else ()), tmp)
                for node in (0, 1)]
    named = rf"rank 1 @{re.escape(hosts.names[1])} \(node 1\): leak \+[\d.]+ KiB/step in heap · kept_outputs"
    try:
        assert watchers[0].stderr is not None
        seen = []
        for line in watchers[0].stderr:  # node 0's live status, until it names the other node's leak
            seen.append(line)
            if re.search(named, line):
                break
        else:
            raise AssertionError("node 0's status never named rank 1's leak:\n" + "".join(seen)[-3000:])
        for pid in _descendants(watchers[1].pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out0, err0 = watchers[0].communicate(timeout=120)
    finally:
        for watcher in watchers:
            if watcher.poll() is None:
                os.killpg(watcher.pid, signal.SIGKILL)
            watcher.communicate()
    assert watchers[0].returncode != 0  # its rank lost its peer: torchrun fails, and so does the watch
    report = load(saves[0])
    ranks = _ranks(report)
    assert sorted(ranks) == [0, 1]
    gone = ranks[1]
    assert gone["via"] == "store" and gone["host"] == hosts.names[1] and gone["node"] == 1
    assert ranks[0]["host"] == hosts.names[0]
    assert gone["status"] == "killed", gone["status"]  # the job failed and it never finished: stopped with it
    assert gone["verdict"] == "leak" and gone["steps"] > 0  # its last summary's figures
    assert gone["ram"]["end"] > 100 << 20 and gone["heap"]["end"] > 0
    assert "kept_outputs" in {s["name"] for s in gone["suspects"]}
    assert report["worst_rank"] == 1 and report["verdict"] == "leak"
    assert "rank 1 (pid" in out0 and ("went silent" in out0 or "stopped without finishing" in out0)
    assert "cannot be reached" not in err0 and "TCPStore.cpp" not in err0  # the store went with the job: no news
