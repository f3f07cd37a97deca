"""Tensors a function keeps between calls (a default argument, a captured variable, a bound method's
attribute): the scanner names the slot, classification finds the cache, the fix uses the user's names."""

from __future__ import annotations

from typing import Any

import torch

from torchmem_magic.finder.scan.results import FunctionSlot, Root, RootStats
from torchmem_magic.finder.scan.scanner import scan_roots
from torchmem_magic.finder.suspects import classify, suspects_from_scan

SOURCE = """\
def log(t, store=[]):
    store.append(t)
def log_kw(t, *, seen={}):
    seen[len(seen)] = t
def make_logger():
    cache = []
    def log(t):
        cache.append(t)
    return log
def make_step():
    total = 0
    def step(loss):
        nonlocal total
        total += loss
    return step
def make_applier(model):
    def apply(x):
        return model(x)
    return apply
class Recorder:
    def __init__(self):
        self.outputs = []
    def record(self, out):
        self.outputs.append(out)
"""
QUARTER_MIB = 64 * 1024  # float32 elements


def _defined() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(SOURCE, namespace)
    return namespace


def _only_root(name: str, obj: object) -> RootStats:
    (stats,) = scan_roots([Root(name, "user", name, obj)]).roots
    return stats


def _suspects(sources: list[str] | None = None, **roots: object) -> dict[str, Any]:
    result = scan_roots([Root(name, "user", name, obj) for name, obj in roots.items()])
    return {s.name: s for s in suspects_from_scan(result, [SOURCE] if sources is None else sources, baseline={})}


def _losses_after_backward(count: int) -> list[torch.Tensor]:
    w = torch.ones(8, requires_grad=True)
    losses = []
    for _ in range(count):
        loss = (w * torch.randn(8)).sum()
        loss.backward()
        losses.append(loss)
    return losses


def test_a_default_argument_cache_is_named_by_its_argument() -> None:
    log = _defined()["log"]
    for _ in range(20):
        log(torch.randn(QUARTER_MIB))
    stats = _only_root("log", log)
    held = stats.slots["log.__defaults__[0]"]
    assert held.slot == FunctionSlot("default", "log", "store", "list")
    assert (held.tensors, held.tensor_bytes, held.first_tensor_path) == (20, 5 << 20, "log.__defaults__[0][0]")
    assert stats.holder_type == "function" and classify(stats) == "tensor-cache"
    suspect = _suspects(log=log)["log"]
    assert suspect.path == "log.__defaults__[0][0]" and suspect.new_in_cell
    assert suspect.fix == (
        "log()'s default argument `store` keeps every tensor across calls: "
        "use `store=None` and create the list inside (`if store is None: store = []`)"
    )


def test_a_keyword_only_default_is_named_too() -> None:
    log_kw = _defined()["log_kw"]
    for _ in range(8):
        log_kw(torch.randn(QUARTER_MIB))
    suspect = _suspects(log_kw=log_kw)["log_kw"]
    assert suspect.path == "log_kw.__kwdefaults__['seen'][0]"
    assert "log_kw()'s default argument `seen`" in suspect.fix and "if seen is None: seen = {}" in suspect.fix


def test_a_default_argument_keeping_graphs_also_gets_the_line_to_change() -> None:
    log = _defined()["log"]
    for loss in _losses_after_backward(300):
        log(loss)
    suspect = _suspects(log=log)["log"]
    assert suspect.kind == "autograd-graph" and suspect.path.startswith("log.__defaults__[0][")
    assert suspect.fix.startswith("log()'s default argument `store` keeps every tensor and its autograd graph")
    assert suspect.fix.endswith(
        "use `store=None` and create the list inside (`if store is None: store = []`); "
        "to keep a history, store numbers: `store.append(t.item())` (was `store.append(t)`)"
    )


def test_a_closure_cache_is_named_by_the_captured_variable() -> None:
    log = _defined()["make_logger"]()
    for _ in range(20):
        log(torch.randn(QUARTER_MIB))
    stats = _only_root("log", log)
    assert stats.slots["log.__closure__[0].cell_contents"].slot == FunctionSlot(
        "closure", "log", "cache", "list", "make_logger"
    )
    suspect = _suspects(log=log)["log"]
    assert suspect.kind == "tensor-cache" and suspect.path == "log.__closure__[0].cell_contents[0]"
    assert suspect.fix == (
        "the list `cache` captured by log() (make_logger's closure) keeps every tensor across calls: "
        "keep only what you need (a rolling window `cache = collections.deque(maxlen=100)`, "
        "or summaries instead of whole tensors)"
    )


def test_a_graph_holding_closure_gets_the_fixed_line_from_the_functions_own_body() -> None:
    log = _defined()["make_logger"]()
    w = torch.randn(256, 256, requires_grad=True)
    for _ in range(5):
        log((w * torch.randn(256, 256)).sum(1))  # no backward: each keeps its saved 256 KiB
    elsewhere = "cache.append(other)\n"  # the same name outside log(): not the line to change
    suspect = _suspects([elsewhere, SOURCE], log=log)["log"]
    assert suspect.kind == "autograd-graph" and "__closure__" not in suspect.fix
    assert suspect.fix == (
        "the list `cache` captured by log() (make_logger's closure) keeps every tensor and its autograd graph "
        "across calls: store tensors without their graph: `cache.append(t.detach())` (was `cache.append(t)`), "
        "or compute them under `with torch.no_grad():`"
    )
    unknown = _suspects([elsewhere], log=log)["log"]
    assert "store tensors without their graph (`cache.append(x.detach())` in log())" in unknown.fix


def test_a_tensor_a_closure_carries_over_is_named_with_its_accumulating_line() -> None:
    step = _defined()["make_step"]()
    model = torch.nn.Linear(4, 1)
    for _ in range(150):
        step(model(torch.ones(1, 4)).sum())
    suspect = _suspects(step=step)["step"]
    assert suspect.kind == "autograd-graph" and suspect.path == "step.__closure__[0].cell_contents"
    assert suspect.fix == (
        "the tensor `total` captured by step() (make_step's closure) chains every call's autograd graph: "
        "`total += loss.item()` (was `total += loss`)"
    )


def test_a_bound_methods_list_is_named_as_self_attribute() -> None:
    record = _defined()["Recorder"]().record
    for _ in range(20):
        record(torch.randn(QUARTER_MIB))
    suspect = _suspects(record=record)["record"]
    assert suspect.kind == "tensor-cache" and suspect.path == "record.__self__.outputs[0]"
    assert suspect.fix.startswith(
        "the list `self.outputs` of the Recorder that record() is bound to keeps every tensor across calls"
    )


def test_a_function_in_a_list_is_named_by_its_variable_not_its_closure_path() -> None:
    hooks = [_defined()["make_logger"]()]
    for _ in range(20):
        hooks[0](torch.randn(QUARTER_MIB))
    suspect = _suspects(hooks=hooks)["hooks"]
    assert suspect.path == "hooks[0].__closure__[0].cell_contents[0]"
    assert suspect.fix.startswith("the list `cache` captured by log() (make_logger's closure)")


def test_what_a_function_only_uses_or_a_small_or_old_cache_is_no_suspect() -> None:
    defined = _defined()
    apply = defined["make_applier"](torch.nn.Linear(1024, 1024))  # 4 MiB of weights it calls, no cache
    assert classify(_only_root("apply", apply)) is None
    small = defined["log"]
    for _ in range(20):
        small(torch.randn(1024))
    assert classify(_only_root("small", small)) is None
    log = _defined()["log"]
    for _ in range(20):
        log(torch.randn(QUARTER_MIB))
    result = scan_roots([Root("log", "user", "log", log)])
    assert suspects_from_scan(result, [SOURCE], baseline={"log": 5 << 20}) == []  # did not grow in the cell


def test_defaults_that_do_not_match_the_code_are_scanned_under_placeholder_names() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return x

    f.__defaults__ = ([torch.ones(2)], 3, [torch.ones(3)])  # more defaults than parameters
    stats = _only_root("f", f)
    assert [held.slot.variable for held in stats.slots.values()] == ["<default 0>", "<default 2>"]


class Hostile:
    """Every Python-level hook raises: naming a bound method's attributes must call none of them."""

    def __init__(self) -> None:
        self.kept = [torch.randn(QUARTER_MIB) for _ in range(8)]

    def keep(self, t: torch.Tensor) -> None:
        self.kept.append(t)

    def __getattribute__(self, name: str) -> object:
        if name in ("__dict__", "__class__"):
            raise RuntimeError(f"{name} looked up through __getattribute__")
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> object:
        raise RuntimeError("__getattr__ called")


def test_a_hostile_objects_bound_method_is_read_without_running_its_code() -> None:
    keep = Hostile().keep
    stats = _only_root("keep", keep)
    assert stats.slots["keep.__self__.kept"].slot == FunctionSlot("attribute", "keep", "kept", "list", "Hostile")
    assert classify(stats) == "tensor-cache"
