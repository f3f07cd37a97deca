"""Which thread sends the live figure's updates, in real kernels: the sampler thread where the kernel
sends a background thread's messages at once, the training thread at its steps where it is told to (or
where the kernel is not one known here). The kernel itself notes which thread sent each widget message."""

from __future__ import annotations

from typing import Any

import pytest
from kernel_client import Execution, Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.ipykernel70]

#: in the kernel: every widget message a cell sends, as (the sending thread's name, carries curve data),
#: in the order sent; "loop done" marks the end of the loop
RECORD_SENDS = """\
import threading, ipywidgets
_route_sends = []
_route_send = ipywidgets.Widget._send
def _recording_send(widget, msg, buffers=None):
    _route_sends.append((threading.current_thread().name, "y" in msg.get("state", {})))
    return _route_send(widget, msg, buffers)
ipywidgets.Widget._send = _recording_send
"""
STOP_RECORDING = "ipywidgets.Widget._send = _route_send; del _route_sends[:]"

LOOP = """\
%%memwatch --interval 20
import time
model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(120):
    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()
    time.sleep(0.02)
_route_sends.append(("loop done", False))
print("loop done")
"""


def _curve_updates_before_the_loop_ended(execution: Execution) -> int:
    """Widget updates with curve data that left the kernel before the loop printed that it was done."""
    done = next(i for i, m in enumerate(execution.iopub)
                if m["msg_type"] == "stream" and "loop done" in m["content"].get("text", ""))
    return sum(
        1 for m in execution.iopub[:done]
        if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update"
        and "y" in m["content"]["data"].get("state", {})
    )


def _run_recorded(kernel: Kernel, route_variable: str | None) -> tuple[Execution, list[tuple[str, bool]], dict[str, Any]]:
    """LOOP under %%memwatch with TORCHMEM_MAGIC_LIVE_UPDATES set to `route_variable` (None: unset), the
    sends recorded; returns the execution, the sends up to the loop's end, and the route's counts."""
    setting = "os.environ.pop('TORCHMEM_MAGIC_LIVE_UPDATES', None)" if route_variable is None else (
        f"os.environ['TORCHMEM_MAGIC_LIVE_UPDATES'] = {route_variable!r}")
    kernel.ok(f"import os; {setting}\n{RECORD_SENDS}", store_history=False)
    try:
        execution = kernel.ok(LOOP)
        sends: list[list[Any]] = kernel.value("_route_sends[:_route_sends.index(('loop done', False))]")
        counts: dict[str, Any] = kernel.value(
            "__import__('dataclasses').asdict(torchmem_magic.widgets.update_route.last_counts)")
    finally:
        kernel.ok(f"{STOP_RECORDING}; os.environ.pop('TORCHMEM_MAGIC_LIVE_UPDATES', None)", store_history=False)
    return execution, [(str(name), bool(curves)) for name, curves in sends], counts


def test_told_to_the_training_thread_sends_the_live_updates_at_its_steps(kernel: Kernel) -> None:
    execution, sends, counts = _run_recorded(kernel, "training-thread")
    assert counts["route"] == "training thread" and counts["training_thread"] >= 2, counts
    # what left the kernel while the loop ran: curve updates, sent by the training thread (the cell's)
    assert _curve_updates_before_the_loop_ended(execution) >= 2
    senders = [name for name, curves in sends if curves]
    assert senders.count("MainThread") >= 2, sends
    # the sampler redraws only before the first step (best effort), then asks the training thread
    first_at_step = senders.index("MainThread")
    assert set(senders[first_at_step:]) == {"MainThread"} and set(senders) <= {"MainThread", "torchmem_magic-sampler"}, sends


def test_by_default_ipykernel_sends_the_sampler_threads_updates_at_once(kernel: Kernel) -> None:
    """ipykernel 7.4 and 7.0.0 alike (7.0.0 looks a message's parent up in the sending thread's context,
    which the sampler thread copies from the cell): no redraw waits for a step."""
    execution, sends, counts = _run_recorded(kernel, None)
    assert counts["route"] == "sampler" and counts["training_thread"] == 0, counts
    assert f"ipykernel {kernel.ipykernel_version}" in counts["why"]
    assert _curve_updates_before_the_loop_ended(execution) >= 2
    assert {name for name, curves in sends if curves} == {"torchmem_magic-sampler"}, sends
