"""Every loop has a step clock, in a real kernel: optimizer steps, else backward passes, else DataLoader
batches, else outermost forward calls, else seconds; epochs are passes of the loader carrying the steps."""

from __future__ import annotations

from typing import Any

import pytest
from kernel_client import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.floors]

MODEL = "model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))\n"
KEYS = ("clock", "steps", "optimizer_steps", "epochs", "verdict", "leak_kind", "resource", "advice", "schema")


def _report(kernel: Kernel, body: str) -> dict[str, Any]:
    kernel.ok("%%memwatch -q --interval 20\n" + body, timeout_s=180)
    report: dict[str, Any] = kernel.value(f"{{k: torchmem_magic.last_report().to_dict()[k] for k in {KEYS!r}}}")
    assert kernel.value("torchmem_magic.tracing.hooks.installed_hook_count()") == 0
    return report


@pytest.fixture(scope="module")
def k(kernel: Kernel) -> Kernel:
    kernel.ok("import torchmem_magic.tracing.hooks\nfrom torch.utils.data import DataLoader, TensorDataset")
    return kernel


def test_optimizer_steps_are_the_clock_when_there_is_an_optimizer(k: Kernel) -> None:
    report = _report(k, MODEL + (
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for _ in range(40):\n"
        "    for _ in range(2):  # gradient accumulation: two backward passes a step\n"
        "        model(torch.randn(8, 64)).sum().backward()\n"
        "    opt.step(); opt.zero_grad()\n"
    ))
    assert (report["clock"], report["steps"], report["optimizer_steps"], report["schema"]) == ("optimizer", 40, 40, 2)


def test_backward_passes_without_an_optimizer(k: Kernel) -> None:
    report = _report(k, MODEL + (
        "for _ in range(60):\n"
        "    model(torch.randn(8, 64)).pow(2).mean().backward()\n"
        "    with torch.no_grad():\n"
        "        for p in model.parameters():\n"
        "            p -= 0.01 * p.grad; p.grad = None\n"
    ))
    assert (report["clock"], report["steps"], report["optimizer_steps"]) == ("backward", 60, 0)
    assert report["verdict"] == "clean", report


def test_an_inference_pass_that_keeps_outputs_leaks_per_batch(k: Kernel) -> None:
    """The validation pass without no_grad: no optimizer, no backward; the batches are the clock."""
    report = _report(k, MODEL + (
        "loader = DataLoader(TensorDataset(torch.randn(4096, 64)), batch_size=32)\n"
        "outputs = []\n"
        "for (x,) in loader:\n"
        "    outputs.append(model(x))  # keeps every batch's graph and activations\n"
    ))
    assert (report["clock"], report["steps"], report["epochs"]) == ("batch", 128, 1)
    assert (report["verdict"], report["leak_kind"], report["resource"]) == ("leak", "per-iteration", "heap"), report
    assert "/batch" in report["advice"][0]
    k.ok("del outputs")


def test_forward_calls_count_only_the_outermost_module(k: Kernel) -> None:
    report = _report(k, MODEL + (
        "kept = []\n"
        "for _ in range(150):\n"
        "    kept.append(model(torch.randn(32, 64)))\n"
    ))
    assert (report["clock"], report["steps"]) == ("forward", 150)  # not 450: three modules a call
    assert (report["verdict"], report["leak_kind"]) == ("leak", "per-iteration"), report
    assert "/forward" in report["advice"][0]
    k.ok("del kept")


def test_without_any_step_the_clock_is_time(k: Kernel) -> None:
    report = _report(k, (
        "import time\n"
        "blocks = []\n"
        "for _ in range(40):\n"
        "    blocks.append(torch.ones(1 << 19))  # 2 MiB\n"
        "    time.sleep(0.03)\n"
    ))
    assert (report["clock"], report["steps"]) == ("time", 0)
    assert (report["verdict"], report["resource"]) == ("leak", "heap"), report
    assert "/s" in report["advice"][0]
    k.ok("del blocks")
    idle = _report(k, "pass\n")
    assert (idle["clock"], idle["verdict"]) == ("time", "unknown")  # never "clean" with nothing to judge


def test_a_validation_loader_inside_each_epoch_is_not_another_epoch(k: Kernel) -> None:
    report = _report(k, MODEL + (
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "train = DataLoader(TensorDataset(torch.randn(256, 64)), batch_size=32)\n"
        "val = DataLoader(TensorDataset(torch.randn(64, 64)), batch_size=32)\n"
        "for epoch in range(4):\n"
        "    for (x,) in train:\n"
        "        opt.zero_grad(); model(x).sum().backward(); opt.step()\n"
        "    with torch.no_grad():\n"
        "        for (x,) in val:\n"
        "            model(x)\n"
    ))
    assert (report["clock"], report["steps"], report["epochs"]) == ("optimizer", 32, 4)
