"""The buttons under the figure, clicked through their comms as JupyterLab does (also mid-run)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kernel_client import Execution, Kernel

pytestmark = pytest.mark.kernel

HELPERS = """\
import gc
from torchmem_magic.probes.heap import HeapProbe
_heap = HeapProbe()
def heap_now():
    gc.disable()  # measure without collecting: the button has to do that
    value = _heap.heap_bytes()
    gc.enable()
    return value
"""


def _widget_ids(messages: list[dict[str, Any]]) -> dict[str, str]:
    """comm_id of each control, by button description (or 'sharing:' / 'result')."""
    ids = {}
    for m in messages:
        if m["msg_type"] != "comm_open":
            continue
        state = m["content"]["data"].get("state", {})
        if state.get("_model_name") in ("ButtonModel", "DropdownModel"):
            ids[state.get("description", "")] = m["content"]["comm_id"]
    return ids


def _status_step(message: dict[str, Any]) -> int:
    """The step count a status-line update shows (-1 for other messages)."""
    found = re.search(r"step(?:&nbsp;| )(\d[\d,]*)", str(message["content"].get("data", {})))
    return int(found.group(1).replace(",", "")) if found else -1


def _results(messages: list[dict[str, Any]]) -> list[str]:
    return [
        m["content"]["data"]["state"]["value"]
        for m in messages
        if m["msg_type"] == "comm_msg" and "<code>" in str(m["content"]["data"].get("state", {}).get("value", ""))
    ]


@pytest.fixture()
def k(fresh_kernel: Kernel) -> Kernel:
    fresh_kernel.ok(HELPERS)
    return fresh_kernel


def _memwatch_cell(k: Kernel, body: str) -> tuple[Execution, dict[str, str]]:
    execution = k.ok("%%memwatch --interval 50\n" + body)
    return execution, _widget_ids(execution.iopub)


@pytest.mark.floors
def test_gc_button_frees_a_dropped_cycle_and_says_how_much(k: Kernel) -> None:
    # the collector's automatic runs are paused, or the kernel's own allocations between cells (more of
    # them on ipykernel 6) may collect the young cycle before the click does
    k.ok("import gc; gc.disable()")
    try:
        _, ids = _memwatch_cell(
            k,
            "model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for i in range(20):\n"
            "    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()\n"
            "cycle = [torch.ones(16 << 20)]; cycle.append(cycle); del cycle  # 64 MiB only gc can free\n",
        )
        before = k.value("heap_now()")
        k.click(ids["gc + empty_cache"])
        messages = k.iopub_until(lambda m: "gc + empty_cache:" in str(m["content"].get("data", {})))
        assert before - k.value("heap_now()") >= 60 << 20
        assert any("gc + empty_cache: RSS" in r and "heap" in r for r in _results(messages))
    finally:
        k.ok("gc.enable()")


@pytest.mark.floors
def test_release_button_frees_output_cache_and_traceback(k: Kernel) -> None:
    k.ok("shown = torch.ones(50 << 20, dtype=torch.uint8)")
    k.ok("shown")
    k.ok("del shown")
    k.execute("def f():\n    local = torch.ones(50 << 20, dtype=torch.uint8)\n    raise RuntimeError('x')\nf()")
    _, ids = _memwatch_cell(k, "x = 1\n")
    before = k.value("heap_now()")
    k.click(ids["release notebook caches"])
    k.iopub_until(lambda m: "release notebook caches:" in str(m["content"].get("data", {})))
    assert before - k.value("heap_now()") >= 95 << 20


@pytest.mark.ipykernel70
def test_mid_run_click_acts_at_a_step_and_stop_ends_the_loop(k: Kernel) -> None:
    # ipykernel 7 only (the newest stack, and 7.0.0: its first release with subshells): a subshell is what lets
    # a click run while the cell is busy
    subshell = k.create_subshell()
    msg_id = k.kc.execute(
        "%%memwatch --interval 50\n"
        "import time\n"
        "model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(3000):\n"
        "    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()\n"
        "    time.sleep(0.01)\n"
        "print('loop finished')\n"
    )
    seen = k.iopub_until(lambda m: m["msg_type"] == "comm_msg" and _status_step(m) >= 5)
    ids = _widget_ids(seen)
    k.click(ids["gc + empty_cache"], subshell_id=subshell)
    seen += k.iopub_until(lambda m: "gc + empty_cache: RSS" in str(m["content"].get("data", {})), timeout_s=30)
    step_at_click = max(_status_step(m) for m in seen)
    k.click(ids["Stop"], subshell_id=subshell)
    seen += k.iopub_until(
        lambda m: m["msg_type"] == "status" and m["parent_header"].get("msg_id") == msg_id
        and m["content"]["execution_state"] == "idle",
        timeout_s=60,
    )
    reply = k.kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = k.kc.get_shell_msg(timeout=30)
    assert reply["content"]["status"] == "ok"  # a clean stop: no traceback
    assert not any(m["msg_type"] == "stream" and "loop finished" in m["content"]["text"] for m in seen)
    report = k.value("torchmem_magic.last_report().to_dict()")
    assert report["status"] == "interrupted" and "Stop button" in report["error"]
    # the status line lags by at most a tick (0.25 s, ~20 steps here): the loop ended right after the click
    assert step_at_click <= report["steps"] <= step_at_click + 40, (step_at_click, report["steps"])


@pytest.mark.floors
def test_sharing_strategy_toggle_and_dataloaders_under_each(k: Kernel) -> None:
    _, ids = _memwatch_cell(k, "x = 1\n")
    loader = (
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "sum(len(b[0]) for b in DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8, num_workers=2))"
    )
    options = k.value("sorted(torch.multiprocessing.get_all_sharing_strategies())")
    for strategy in ("file_system", "file_descriptor"):
        state = {"index": options.index(strategy)}  # a Dropdown syncs its index
        k.send_comm(ids["sharing:"], {"method": "update", "state": state, "buffer_paths": []})
        k.iopub_until(lambda m: f"sharing strategy {strategy}" in str(m["content"].get("data", {})))
        assert k.value("torch.multiprocessing.get_sharing_strategy()") == strategy
        assert "64" in k.ok(loader).results()[-1]["text/plain"]


NOTE_MID_RUN = "clicks act mid-run, at the next step"
NOTE_AT_END = "this kernel handles clicks once the cell has finished"


def _notes(messages: list[dict[str, Any]]) -> list[str]:
    return [
        str(m["content"]["data"]["state"].get("value", ""))
        for m in messages
        if m["msg_type"] == "comm_open" and "clicks" in str(m["content"]["data"].get("state", {}).get("value", ""))
    ]


@pytest.mark.floors
def test_without_a_subshell_clicks_act_when_the_cell_ends_and_the_ui_says_which(k: Kernel) -> None:
    """ipykernel 6 has no subshells: a click waits in the shell queue until the cell ends (so does one that a
    front end sends to the main shell of ipykernel 7). The note under the buttons tells the user which it is."""
    msg_id = k.kc.execute(
        "%%memwatch --interval 50\n"
        "import time\n"
        "model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(150):\n"
        "    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()\n"
        "    time.sleep(0.02)\n"
        "print('loop finished')\n"
    )
    seen = k.iopub_until(lambda m: m["msg_type"] == "comm_msg" and _status_step(m) >= 5)
    notes = _notes(seen)
    expected = NOTE_MID_RUN if k.has_subshells else NOTE_AT_END
    assert len(notes) == 1 and expected in notes[0], (k.ipykernel_version, notes)
    ids = _widget_ids(seen)
    k.click(ids["gc + empty_cache"])  # on the main shell, as a front end without subshells sends it
    k.click(ids["Stop"])
    seen += k.iopub_until(lambda m: "gc + empty_cache: RSS" in str(m["content"].get("data", {})), timeout_s=60)
    reply = k.kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = k.kc.get_shell_msg(timeout=30)
    assert reply["content"]["status"] == "ok"
    # the loop ran to its end: the clicks were handled after the cell, the Stop came too late to stop anything
    assert any(m["msg_type"] == "stream" and "loop finished" in m["content"]["text"] for m in seen)
    done = next(i for i, m in enumerate(seen) if m["msg_type"] == "status" and m["parent_header"].get("msg_id") == msg_id
                and m["content"]["execution_state"] == "idle")
    acted = next(i for i, m in enumerate(seen) if "gc + empty_cache: RSS" in str(m["content"].get("data", {})))
    assert acted > done, "without a subshell the click cannot act before the cell has ended"
    assert not any("queued: runs at the next step" in r for r in _results(seen))
    report = k.value("torchmem_magic.last_report().to_dict()")
    assert report["status"] == "ok" and report["steps"] == 150
