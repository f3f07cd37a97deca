"""Which root names memory that several roots reach: the owner before a user of it, decided by the rule and
never by the order the names came in. Each namespace below is scanned in every order of its names (or a
spread of them), and the holder's name and path must be the same in all."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import torch

from torchmem_magic.finder.scan.results import Root
from torchmem_magic.finder.scan.scanner import scan_roots


class Recorder(torch.nn.Module):
    """A module whose class keeps what every instance records: the class's list is what to clear."""

    store: list[torch.Tensor] = []

    def record(self, out: torch.Tensor) -> None:
        self.store.append(out)


class Trainer:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def _class_and_instance() -> dict[str, Any]:
    rec = Recorder()
    Recorder.store.clear()
    for _ in range(8):
        rec.record(torch.randn(256, 256))
    return {"rec": rec, "Recorder": Recorder, "other": Recorder()}


def _module_optimizer_trainer() -> dict[str, Any]:
    model = torch.nn.Linear(512, 512)
    model.kept = [torch.randn(256, 256) for _ in range(8)]  # type: ignore[assignment]
    trainer = Trainer(model)
    return {"trainer": trainer, "model": model, "optimizer": trainer.optimizer, "params": list(model.parameters())}


def _list_and_the_function_that_fills_it() -> dict[str, Any]:
    outputs: list[torch.Tensor] = []

    def log(out: torch.Tensor) -> None:
        outputs.append(out)

    for _ in range(8):
        log(torch.randn(256, 256))
    return {"log": log, "outputs": outputs, "a_log": log}


def _orders(names: list[str], most: int = 24) -> list[list[str]]:
    every = [list(p) for p in itertools.permutations(names)]
    return every if len(every) <= most else random.Random(7).sample(every, most)


def _holders(namespace: dict[str, Any], order: list[str]) -> frozenset[tuple[str, str]]:
    """(root, container path) of every tensor found, for the roots that retain a MiB or more."""
    result = scan_roots([Root(name, "user", name, namespace[name]) for name in order])
    big = {stats.name for stats in result.roots if stats.retained_bytes >= 1 << 20}
    containers = {f.path.rsplit("[", 1)[0] for f in result.findings}
    return frozenset((c.split(".")[0].split("[")[0], c) for c in containers if c.split(".")[0].split("[")[0] in big)


@pytest.mark.parametrize("build,holder", [
    (_class_and_instance, ("Recorder", "Recorder.store")),
    (_module_optimizer_trainer, ("model", "model.kept")),
    (_list_and_the_function_that_fills_it, ("outputs", "outputs")),
], ids=["class-attribute", "module-optimizer-trainer", "list-and-its-filler"])
def test_the_owner_names_the_memory_whatever_the_order_of_the_roots(build: Any, holder: tuple[str, str]) -> None:
    namespace = build()
    seen = {_holders(namespace, order) for order in _orders(list(namespace))}
    assert len(seen) == 1, seen
    (named,) = seen
    assert holder in named, named
    Recorder.store.clear()
