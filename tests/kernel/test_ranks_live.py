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
    kernel.ok(RANK_TRAINING + "import torchmem_magic.hooks, threading")
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
    curves = [state for i, comm, state in _updates(execution) if comm == mark and "y" in state and i < final_at]
    assert len(curves) >= 2 and all(state["y"]["shape"][0] == 2 for state in curves), curves[-1:]
    assert curves[-1]["y"]["shape"][1] > curves[0]["y"]["shape"][1]  # the curves grew while the ranks ran
    # the final status agrees with the report
    report = kernel.value("torchmem_magic.last_report().to_dict()['worst_rank']")
    assert report == 1 and "worst rank 1: leak +" in statuses[-1][1]
    # nothing left behind
    assert kernel.value("torchmem_magic.hooks.installed_hook_count()") == 0
    assert kernel.value("[t.name for t in threading.enumerate() if t.name.startswith('torchmem_magic')]") == []
