"""A window of detached tensors cleared every N steps, in a real kernel: the mid-run scans may land on
its rising part again and again (which scans do depends on timing), and the window must never be
called a growing holder, nor a leak found from it alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from leaky_loops import SETUP  # noqa: E402

pytestmark = pytest.mark.kernel

WINDOW = (
    "model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3); window = []\n"
    "for step in range(310):\n"
    "    x = torch.randn(64, 64)\n"
    "    train_step(model, opt, x)\n"
    "    with torch.no_grad():\n"
    "        window.append(model[:2](x))  # 128 KiB a step, no graph\n"
    "    if step % {every} == {every} - 1:\n"
    "        window.clear()\n"
)


@pytest.mark.parametrize("every", [20, 40, 40, 40])
def test_a_window_cleared_every_n_steps_is_never_a_growing_holder(kernel: Kernel, every: int) -> None:
    kernel.ok(SETUP)
    kernel.ok("%%memwatch -q --interval 50\n" + WINDOW.format(every=every), timeout_s=180)
    report = kernel.value("{k: torchmem_magic.last_report().to_dict()[k] for k in ('verdict', 'advice', 'suspects')}")
    kernel.ok("del window; import gc; gc.collect()")
    assert not any("window grows" in line for line in report["advice"]), report
    assert report["verdict"] != "leak" or not report["advice"][0].startswith(("per-iteration leak:", "sporadic leak:")), report
