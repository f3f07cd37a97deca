"""Holders where frameworks keep them, through the script API: a buffer a module re-registers bigger at
each step, a container on a class, and the process' machinery (threads, streams) that a scan stops at."""

from __future__ import annotations

import io
import sys
import threading
from typing import Any

import torch

from torchmem_magic import memwatch
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.finder.scan.scanner import scan_roots


class Seen(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.register_buffer("seen", torch.zeros(0, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = torch.cat([self.seen, x.detach()])
        return self.lin(x)  # type: ignore[no-any-return]


class Tap:
    store: dict[int, torch.Tensor] = {}

    def record(self, step: int, out: torch.Tensor) -> None:
        self.store[step] = out


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
    out = model(torch.randn(256, 64))
    opt.zero_grad()
    out.pow(2).mean().backward()
    opt.step()
    return out  # type: ignore[no-any-return]


def test_a_buffer_registered_bigger_every_step_is_named_and_the_parameters_are_not() -> None:
    net = Seen()
    opt = torch.optim.Adam(net.parameters())
    with memwatch(quiet=True) as w:
        for _ in range(150):  # inline: a helper's local naming `net` too would be measured under its name
            loss = net(torch.randn(256, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = w.report
    assert report.verdict == "leak"
    assert [(s.name, s.path, s.kind) for s in report.suspects] == [("net", "net.seen", "tensor-cache")]
    assert not any("no variable in the namespace grows" in a for a in report.advice), report.advice


def test_a_module_whose_parameters_and_optimizer_state_are_filled_once_is_no_suspect() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.Adam(net.parameters())
    with memwatch(quiet=True) as w:
        for _ in range(150):
            _step(net, opt)
    assert w.report.suspects == (), w.report.suspects
    assert w.report.verdict != "leak", w.report.advice


def test_a_container_on_a_class_filled_through_self_is_named_at_the_class() -> None:
    net = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    tap = Tap()
    Tap.store.clear()
    try:
        with memwatch(quiet=True) as w:
            for step in range(150):
                _step(net, opt)
                tap.record(step, torch.randn(256, 64))
    finally:
        Tap.store.clear()
    report = w.report
    assert report.verdict == "leak"
    top = report.suspects[0]
    # the class is the owner: its list is what every instance fills, and what to clear
    assert top.name == "Tap" and top.path.startswith("Tap.store[") and top.kind == "tensor-cache", report.suspects
    assert "`Tap.store`, a class attribute" in top.fix and "`self.store = {}` in `__init__`" in top.fix


def test_a_class_named_as_a_root_holds_its_own_containers() -> None:
    class Registry:
        outputs: list[torch.Tensor] = []

    Registry.outputs.extend(torch.ones(1 << 16) for _ in range(3))
    result = scan_roots([Root("Registry", "user", "Registry", Registry)])
    stats = result.roots[0]
    assert stats.tensors == 3 and stats.first_tensor_path == "Registry.outputs[0]"
    assert stats.places == {"Registry.outputs": 3 << 18}


class Worker:
    """Keeps a thread and streams, as a DataLoader iterator's queues and a logger do."""

    def __init__(self, reach: dict[str, Any]) -> None:
        self.thread = threading.Thread(target=print, args=(reach,))  # its _args reach the tensor
        self.stream = io.StringIO()
        self.stderr = sys.stderr


def test_a_scan_stops_at_threads_and_streams() -> None:
    namespace = {"loss": torch.ones(1 << 16, requires_grad=True) * 2}
    worker = Worker(namespace)
    result = scan_roots([Root("worker", "user", "worker", worker)])
    assert result.roots[0].tensors == 0, result.roots[0].first_tensor_path
    assert scan_roots([Root("namespace", "user", "namespace", namespace)]).roots[0].tensors == 1


class Loop:
    """Run state too big to rescan between steps: tens of thousands of plain records, objects."""

    def __init__(self) -> None:
        self.records = [{"id": i, "label": i % 7, "path": f"img_{i}.png"} for i in range(40_000)]
        self.events = [object() for _ in range(12_000)]


class RunState(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(64, 64)
        self.loop = Loop()
        self.validation_outputs: list[torch.Tensor] = []


def test_no_grad_outputs_in_a_list_deep_in_an_object_too_big_to_rescan_are_named() -> None:
    state = RunState()
    opt = torch.optim.SGD(state.parameters(), lr=0.01)
    for run in range(2):  # the second run starts from the first's scans (the fingerprint memo)
        with memwatch(quiet=True) as w:
            for _ in range(100):
                loss = state.net(torch.randn(256, 64)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                with torch.no_grad():  # how Lightning runs validation: outputs without a graph
                    state.validation_outputs.append(state.net(torch.randn(256, 64)))
        top = w.report.suspects[0] if w.report.suspects else None
        assert top is not None and (top.name, top.path, top.kind) == ("state", "state.validation_outputs", "tensor-cache"), (
            run, w.report.suspects)


def test_a_leak_of_device_tensors_found_from_its_holder_is_a_vram_leak() -> None:
    """Tensors kept on a device are no host memory: the holder's own series finds the leak, its bytes are
    counted as on an accelerator (the meta device stands in for a GPU here: no curve measures it), and
    the report calls it a VRAM leak, not a heap one."""
    model = torch.nn.Linear(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with memwatch(10, quiet=True) as w:  # the script API looks at this module's globals too
        for _ in range(200):
            _step(model, opt)
            ON_DEVICE.append(torch.empty(1 << 16, device="meta"))  # 256 KiB a step, on no host curve
    ON_DEVICE.clear()
    report = w.report
    assert report is not None and report.suspects and report.suspects[0].name == "ON_DEVICE", report
    assert (report.verdict, report.resource) == ("leak", "vram"), report.advice


ON_DEVICE: list[torch.Tensor] = []


class Accumulator:
    """A metric in the way metric libraries write one: its state grows with `update` until `reset`."""

    def __init__(self) -> None:
        self.values: list[torch.Tensor] = []

    def update(self, x: torch.Tensor) -> None:
        self.values.append(x)

    def reset(self) -> None:
        self.values = []


class Keeper(Accumulator):
    reset = None  # type: ignore[assignment]  # no reset to call


def test_a_growing_state_of_an_object_with_reset_is_fixed_by_resetting_it() -> None:
    for cls, resets in ((Accumulator, True), (Keeper, False)):
        embeddings = cls()
        with memwatch(quiet=True) as w:
            for _ in range(60):
                embeddings.update(torch.randn(64, 256))
        top = w.report.suspects[0]
        assert top.name == "embeddings" and ("embeddings.reset()" in top.fix) == resets, (cls, top)


def test_what_a_module_keeps_is_named_at_the_module_not_at_an_object_that_holds_it() -> None:
    """A trainer made before the model (as a script often has them) holds the model in a private attribute:
    the list is the module's, `model.kept`, whichever name came first in the namespace."""

    class Trainer:
        def __init__(self) -> None:
            self._connector: Any = None

    model = torch.nn.Linear(4, 4)
    model.kept = [torch.zeros(1024) for _ in range(8)]  # type: ignore[assignment]
    trainer = Trainer()
    trainer._connector = type("Connector", (), {})()
    trainer._connector.model = model
    result = scan_roots([Root("trainer", "user", "trainer", trainer), Root("model", "user", "model", model)])
    by_name = {stats.name: stats for stats in result.roots}
    assert by_name["model"].tensors >= 8 and by_name["trainer"].tensors == 0, result.roots
