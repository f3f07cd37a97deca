"""Ranks in the live figure of a real kernel: what the widget messages carry while the ranks train
(one curve per rank, labelled by rank, and the worst rank named in the status line)."""

from __future__ import annotations

from typing import Any

import pytest
from kernel_client import RANK_TRAINING, Execution, Kernel, free_port

pytestmark = [pytest.mark.kernel, pytest.mark.floors]

def _updates(execution: Execution) -> list[tuple[int, str, dict[str, Any]]]:
    """(iopub index, comm id, state) of every widget update the cell sent."""
    return [
        (i, m["content"]["comm_id"], m["content"]["data"]["state"])
        for i, m in enumerate(execution.iopub)
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update"
    ]


def _status_values(execution: Execution) -> list[tuple[int, str]]:
    return [
        (i, str(state["value"]).replace("&nbsp;", " "))
        for i, _, state in _updates(execution)
        if str(state.get("value", "")).startswith("<code>")
    ]


def test_each_rank_has_its_own_curve_and_the_worst_rank_is_named_while_they_train(kernel: Kernel) -> None:
    kernel.ok(RANK_TRAINING + "import torchmem_magic.tracing.hooks, threading")
    execution = kernel.ok(
        f"%%memwatch --interval 50\nmp.start_processes(train, args=(2, {free_port()}, 1), nprocs=2, start_method='fork')",
        timeout_s=240,
    )
    statuses = _status_values(execution)
    final_at = next(i for i, value in statuses if value.startswith("<code>ok · "))  # drawn once the report exists
    live = [(i, value) for i, value in statuses if i < final_at]
    # the status line names the leaking rank, its rate and its holder before the run ended
    named = [value for _, value in live if "worst rank 1: leak +" in value]
    assert named, [value for _, value in live][-3:]
    assert "KiB/step in heap (outputs)" in named[-1] and "2 ranks at step" in named[-1], named[-1]
    # the ranks' curves: one line per rank, labelled by rank number, sent while the ranks trained
    rank_marks = {comm for _, comm, state in _updates(execution) if "rank 1" in state.get("labels", ())}
    assert len(rank_marks) == 1, rank_marks
    (mark,) = rank_marks
    labelled = [(i, state["labels"]) for i, comm, state in _updates(execution) if comm == mark and "labels" in state]
    # a rank's line appears once it streams (one may come a tick before the other), then both stay
    both = [i for i, labels in labelled if labels == ["rank 0", "rank 1"]]
    assert both and both[0] < final_at, labelled
    assert all(labels == ["rank 0", "rank 1"] for i, labels in labelled if i > both[0]), labelled
    # from the update that drew both lines on (before it, one rank's line may be drawn alone)
    curves = [state for i, comm, state in _updates(execution) if comm == mark and "y" in state and both[0] <= i < final_at]
    assert len(curves) >= 2 and all(state["y"]["shape"][0] == 2 for state in curves), curves[-1:]
    assert curves[-1]["y"]["shape"][1] > curves[0]["y"]["shape"][1]  # the curves grew while the ranks ran
    # the final status agrees with the report
    report = kernel.value("torchmem_magic.last_report().to_dict()['worst_rank']")
    assert report == 1 and "worst rank 1: leak +" in statuses[-1][1]
    # nothing left behind
    assert kernel.value("torchmem_magic.tracing.hooks.installed_hook_count()") == 0
    assert kernel.value("[t.name for t in threading.enumerate() if t.name.startswith('torchmem_magic')]") == []


#: another node's rank, as the job's store would show it, injected where this watcher reads the store:
#: the kernel runs no second node (that needs torchrun subprocesses and a job's store, which a notebook's
#: forked ranks do not name), so the reader's own path is fed from a fake store by a thread of the test
OTHER_NODE = '''
import threading, time
from torchmem_magic.core.model import HeapSummary, RamSummary, RankSummary
from torchmem_magic.ranks import feed as _feed_module
from torchmem_magic.ranks.job import JobStore, encode_summary
from torchmem_magic.ranks.remote import RemoteRanks

class _FakeStore:
    def __init__(self):
        self.values = {}
    def read(self, keys):
        return {k: self.values[k] for k in keys if k in self.values}

_job, _store, _stop = JobStore("127.0.0.1", 1, "fake", 0, 3, 2, 0), _FakeStore(), threading.Event()

def _node_1(remote):
    seq = 0
    while not _stop.is_set():
        heap = (50 << 20) + seq * (1 << 20)
        summary = RankSummary(
            rank=2, pid=4242, host="node-b", ram=RamSummary(200 << 20, 300 << 20, 300 << 20, None, 64 << 30, "system"),
            heap=HeapSummary(50 << 20, heap, heap, None), vram=None, steps=4 * seq, verdict="unknown", leak_kind=None,
            resource=None, steps_to_exhaustion=None, suspects=(), status="running", node=1,
        )
        _store.values[_job.summary_key(2)] = encode_summary(summary, seq, time.time(), False)
        remote._read(_store, [_job.summary_key(r) for r in range(3)])
        seq += 1
        _stop.wait(0.2)

_poll = _feed_module.RankFeeds.poll

def _poll_with_node_1(self, force=False):
    _poll(self, force)
    if self.remote is None and self.feeds:
        self.remote = RemoteRanks(_job, lambda: self._clock() - self._started_s)
        threading.Thread(target=_node_1, args=(self.remote,), name="fake-node-1", daemon=True).start()

_feed_module.RankFeeds.poll = _poll_with_node_1
'''


def test_another_nodes_rank_has_its_curve_in_the_live_figure_lighter_and_labelled_with_its_node(kernel: Kernel) -> None:
    kernel.ok(RANK_TRAINING + OTHER_NODE)
    try:
        execution = kernel.ok(
            f"%%memwatch --interval 50\nmp.start_processes(train, args=(2, {free_port()}, 1), nprocs=2, start_method='fork')",
            timeout_s=240,
        )
    finally:
        kernel.ok("_stop.set(); _feed_module.RankFeeds.poll = _poll")
    statuses = _status_values(execution)
    final_at = next(i for i, value in statuses if value.startswith("<code>ok · "))
    remote_label = "rank 2 @node-b (node 1)"
    rank_marks = {comm for _, comm, state in _updates(execution) if remote_label in state.get("labels", ())}
    assert len(rank_marks) == 1, rank_marks
    (mark,) = rank_marks
    updates = [(i, state) for i, comm, state in _updates(execution) if comm == mark and i < final_at]
    labelled = [state for _, state in updates if "labels" in state and remote_label in state["labels"]]
    assert labelled and labelled[-1]["labels"] == ["rank 0", "rank 1", remote_label], labelled[-1:]
    lighter = [state["opacities"] for _, state in updates if "opacities" in state]
    assert lighter and lighter[-1] == [1.0, 1.0, 0.5], lighter[-1:]
    # its curve grows while the cell runs: a point each time its summary changed
    curves = [state["y"]["shape"] for _, state in updates if "y" in state and state["y"]["shape"][0] == 3]
    assert curves, updates[-1:]
    report = kernel.value("[(r.rank, r.via) for r in torchmem_magic.last_report().ranks]")
    assert report == [[0, "stream"], [1, "stream"], [2, "store"]]  # and the report lists it, from the store
