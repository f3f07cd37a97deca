"""The live figure's widget models as the kernel sends them: a cell opens what its first frame shows,
the rest once there is something to draw in it, and the kernel's shared models only once."""

from __future__ import annotations

from typing import Any

import pytest
from kernel_client import Execution, Kernel

pytestmark = pytest.mark.kernel

#: a loop of 3 epochs over a DataLoader: the strips get epoch lines
EPOCHS = (
    "%%memwatch --interval 20\n"
    "import time\n"
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for epoch in range(3):\n"
    "    for (x,) in DataLoader(TensorDataset(torch.randn(16, 8)), batch_size=4):\n"
    "        opt.zero_grad(); model(x).sum().backward(); opt.step(); time.sleep(0.02)\n"
)


def _opened(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The state each comm opened with, by comm id."""
    return {m["content"]["comm_id"]: m["content"]["data"]["state"] for m in messages if m["msg_type"] == "comm_open"}


def _updates(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(m["content"]["comm_id"], m["content"]["data"].get("state", {})) for m in messages
            if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update"]


def _epoch_lines(opened: dict[str, dict[str, Any]]) -> list[str]:
    return [cid for cid, state in opened.items()
            if state.get("_model_name") == "LinesModel" and state.get("colors") == ["#999999"]]


def _references(state: Any) -> set[str]:
    """The models a state refers to ("IPY_MODEL_<id>")."""
    if isinstance(state, str):
        return {state[len("IPY_MODEL_"):]} if state.startswith("IPY_MODEL_") else set()
    if isinstance(state, dict):
        return set().union(*map(_references, state.values())) if state else set()
    if isinstance(state, list):
        return set().union(*map(_references, state)) if state else set()
    return set()


def test_epoch_lines_come_with_the_first_epoch_and_on_their_strip(fresh_kernel: Kernel) -> None:
    passing = fresh_kernel.ok("%%memwatch\npass")
    assert not _epoch_lines(_opened(passing.iopub))  # no epoch: none made
    execution: Execution = fresh_kernel.ok(EPOCHS)
    opened = _opened(execution.iopub)
    lines = _epoch_lines(opened)
    assert lines, "the epochs' dashed lines were never made"
    figures = {cid: state for cid, state in _updates(execution.iopub) if "marks" in state}
    on_figures = set().union(*(_references(state["marks"]) for state in figures.values()))
    assert set(lines) <= on_figures, "an epoch line was made but never put on its strip's figure"
    assert all(opened[cid]["visible"] for cid in lines)


def test_a_later_figure_opens_only_its_own_models_and_the_shared_ones_still_serve(fresh_kernel: Kernel) -> None:
    first = fresh_kernel.ok("%%memwatch\npass")
    second = fresh_kernel.ok("%%memwatch\npass")
    opened_first, opened_second = _opened(first.iopub), _opened(second.iopub)
    buttons = [s.get("description") for s in opened_second.values() if s.get("_model_name") == "ButtonModel"]
    assert buttons == ["Stop"]  # the kernel's buttons are the first figure's
    assert len(opened_second) < len(opened_first)
    # every model the second figure refers to was opened by one of the two cells
    referenced = set().union(*(_references(state) for state in opened_second.values()))
    referenced |= set().union(*(_references(state) for _, state in _updates(second.iopub)))
    assert referenced <= set(opened_first) | set(opened_second)
    gc_id = next(cid for cid, s in opened_first.items() if s.get("description") == "gc + empty_cache")
    row = next(s for s in opened_second.values() if s.get("_model_name") == "HBoxModel" and len(s["children"]) == 6)
    assert f"IPY_MODEL_{gc_id}" in row["children"]  # the second figure shows the kernel's button
    fresh_kernel.click(gc_id)  # acts for the newest figure, its run over: at once
    fresh_kernel.iopub_until(lambda m: "gc + empty_cache: RSS" in str(m["content"].get("data", {})))
