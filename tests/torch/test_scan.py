"""The scanner on real torch objects and hostile Python objects (in process)."""

from __future__ import annotations

import collections
import dataclasses
import gc
import threading
import time
import weakref

import pytest
import torch

from torchmem_magic import MemcheckResult, MemwatchSession, memcheck
from torchmem_magic.probes.heap import HeapProbe
from torchmem_magic.finder.scan.introspect import is_ours
from torchmem_magic.finder.scan.paths import pretty_path
from torchmem_magic.finder.scan.results import Budget, Root
from torchmem_magic.finder.scan.scanner import scan_roots

HEAP = HeapProbe()
needs_heap = pytest.mark.skipif(not HEAP.available, reason="no heap counters here")


def _freed_by(delete: object) -> float:
    gc.collect()
    before = HEAP.heap_bytes()
    delete()  # type: ignore[operator]
    gc.collect()
    return before - HEAP.heap_bytes()


class Hostile:
    """Every Python-level hook raises or never ends: the scanner must not call any of them."""

    def __init__(self, payload: torch.Tensor) -> None:
        self.payload = payload

    def __getattr__(self, name: str) -> object:
        raise RuntimeError("__getattr__ called")

    def __getattribute__(self, name: str) -> object:
        if name in ("__dict__", "__class__"):
            raise RuntimeError(f"{name} looked up through __getattribute__")
        return object.__getattribute__(self, name)

    def __len__(self) -> int:
        while True:
            time.sleep(1)

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("__iter__ called")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("__eq__ called")

    def __hash__(self) -> int:
        raise RuntimeError("__hash__ called")


class EndlessList(list):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        while True:
            yield 1

    def __len__(self) -> int:
        raise RuntimeError("__len__ called")


class Slotted:
    __slots__ = ("tensor", "unset")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


@dataclasses.dataclass
class Batch:
    inputs: torch.Tensor
    labels: torch.Tensor


def test_paths_through_containers_objects_and_modules() -> None:
    t = torch.ones(4)
    captured = torch.zeros(9)
    Point = collections.namedtuple("Point", "x y")
    holder = {
        "metrics": {"val": [t]},
        "logger": Batch(torch.zeros(2), torch.zeros(3)),
        "slots": Slotted(torch.zeros(5)),
        "point": Point(1, torch.zeros(6)),
        "deque": collections.deque([torch.zeros(7)]),
        "closure": (lambda captured=torch.zeros(8): captured),
        "captured": (lambda: captured),
        "model": torch.nn.Sequential(torch.nn.Linear(2, 2)),
    }
    paths = {f.path for f in memcheck(holder, name="ns").findings}
    assert {
        "ns['metrics']['val'][0]", "ns['logger'].inputs", "ns['slots'].tensor", "ns['point'].y",
        "ns['deque'][0]", "ns['closure'].__defaults__[0]", "ns['captured'].__closure__[0].cell_contents",
        "ns['model'][0].weight",
    } <= paths


class HashableHolder:
    def __init__(self, payload: torch.Tensor) -> None:
        self.payload = payload


def test_paths_through_mapping_keys_and_sets() -> None:
    holder = {
        "exact": {HashableHolder(torch.ones(1)): 1, torch.ones(2): "a tensor as key"},
        "ordered": collections.OrderedDict([(HashableHolder(torch.ones(3)), 2)]),
        "set": {HashableHolder(torch.ones(4))},
    }
    paths = {f.path for f in memcheck(holder, name="ns").findings}
    assert paths == {
        "ns['exact'].keys()[<HashableHolder>].payload", "ns['exact'].keys()[<Tensor>]",
        "ns['ordered'].keys()[<HashableHolder>].payload", "ns['set']{…}.payload",
    }


def test_budget_is_frozen_so_shared_budgets_cannot_drift() -> None:
    budget = Budget(time_s=0.3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        budget.time_s = 5.0  # type: ignore[misc]
    assert budget.time_s == 0.3 and Budget().graph_node_cap == 20_000
    assert dataclasses.replace(budget, max_depth=3) == Budget(time_s=0.3, max_depth=3)


def test_this_packages_objects_are_skipped_and_users_are_not() -> None:
    assert is_ours(MemwatchSession) and is_ours(MemcheckResult) and is_ours(Root)
    assert not is_ours(Batch) and not is_ours(torch.nn.Linear)
    t = torch.ones(3)
    result = memcheck([Root("t", "user", "t", t), t], name="both")
    assert [f.path for f in result.findings] == ["both[1]"]


def test_hostile_objects_are_never_called() -> None:
    hostile = Hostile(torch.ones(3))
    endless = EndlessList([torch.ones(2)])
    result = memcheck([hostile, endless], name="things")
    assert {f.path for f in result.findings} == {"things[0].payload", "things[1][0]"}


def test_self_referencing_and_huge_containers_end_within_budget() -> None:
    loop: list[object] = [torch.ones(1)]
    loop.append(loop)
    huge = {i: object() for i in range(1_000_000)}
    huge["t"] = torch.ones(2)  # type: ignore[index]
    started = time.perf_counter()
    result = memcheck({"loop": loop, "huge": huge}, name="ns", budget=Budget(time_s=1.0, max_objects_per_root=100_000))
    assert time.perf_counter() - started < 5
    assert result.truncated and any("stopped early" in a for a in result.advice)
    assert any(f.path == "ns['loop'][0]" for f in result.findings)


def test_plain_data_records_are_counted_without_visiting_and_tensors_inside_are_found() -> None:
    records = [{"id": i, "name": f"row-{i}", "tags": (i % 7, "x")} for i in range(200_000)]
    records.append({"id": -1, "tags": (1, torch.ones(3))})  # a tensor one level down: not plain data
    records.append([1.5, [2, 3], ("a", None)])
    # counted in bulk, not visited one by one: 200,000 records fit a budget of 1,000 visited objects (the
    # time limit is out of the way, so a busy machine cannot truncate the scan)
    result = memcheck(records, name="records", budget=Budget(time_s=600.0, max_objects=1_000, max_objects_per_root=1_000))
    assert not result.truncated
    assert [f.path for f in result.findings] == ["records[200000]['tags'][1]"]


def test_views_count_once_and_parameters_are_not_retained_by_graphs() -> None:
    base = torch.ones(1 << 20)
    views = [base, base[:10], base.view(1024, 1024)]
    assert memcheck(views, name="v").bytes == 4 << 20
    model = torch.nn.Linear(512, 512)  # 1 MiB of weight: saved as W.t() by every forward
    outs = [model(torch.ones(1, 512)) for _ in range(3)]
    result = memcheck(outs, name="outs")
    assert result.retained_bytes < 64 << 10  # outputs + small inputs + nodes, no weight


@needs_heap
def test_eval_outputs_retained_matches_what_deleting_frees() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
    kept = [model(torch.randn(256, 256)) for _ in range(10)]  # eval without no_grad: ~4 MiB saved each
    result = memcheck(kept, name="val_outputs")
    freed = _freed_by(lambda: kept.clear())
    assert result.retained_bytes == pytest.approx(freed, rel=0.15)
    assert result.graph_tensors == 10 and result.graph_nodes > 10


def test_scan_keeps_no_references_and_is_repeatable() -> None:
    model = torch.nn.Linear(64, 64)
    outs = [model(torch.randn(8, 64)) for _ in range(5)]
    first, second = memcheck(outs, name="o"), memcheck(outs, name="o")
    assert first.to_dict() | {"elapsed_s": 0} == second.to_dict() | {"elapsed_s": 0}
    refs = [weakref.ref(t) for t in outs] + [weakref.ref(model)]
    nodes = [weakref.ref(t.grad_fn) for t in outs] if hasattr(outs[0].grad_fn, "__weakref__") else []
    del outs, model, first, second
    gc.collect()
    assert all(r() is None for r in refs + nodes)


def test_long_chain_is_capped_estimated_and_deletes_safely() -> None:
    w = torch.ones(1, requires_grad=True)
    total = torch.zeros(1)
    for _ in range(60_000):
        total = total + w * 2
    result = memcheck(total, name="total", budget=Budget(graph_node_cap=20_000))
    assert result.estimated and result.graph_nodes > 60_000
    assert any("chain" in a and "estimate" in a for a in result.advice)
    del total, result
    gc.collect()  # survived: touching only 20k nodes keeps the chain's deletion safe


def test_frames_generators_and_threads_are_scanned_without_running_code() -> None:
    def gen():  # type: ignore[no-untyped-def]
        local = torch.ones(9)
        yield local

    g = gen()
    next(g)
    result = memcheck(g, name="g")
    assert [f.path for f in result.findings] == ["g.gi_frame.f_locals['local']"]
    assert memcheck(threading.Lock(), name="lock").tensors == 0


def test_pretty_paths() -> None:
    assert pretty_path("m._modules['enc']._modules['0']._parameters['weight']") == "m.enc[0].weight"
    assert pretty_path("m._buffers['running_mean']") == "m.running_mean"


def test_scan_roots_groups_by_name_and_dedups_across_roots() -> None:
    t = torch.ones(1 << 18)
    result = scan_roots([Root("a", "user", "a", [t]), Root("Out", "output-cache", "Out", {1: t})])
    by_name = {r.name: r for r in result.roots}
    assert by_name["a"].tensor_bytes == 1 << 20 and by_name["Out"].tensor_bytes == 0


def test_retained_bytes_are_split_by_the_memory_they_live_in() -> None:
    """A storage moved to shared memory (what a DataLoader worker's batch is) counts as shm, the rest as heap,
    graph nodes as heap; the split adds up to the retained bytes."""
    shared = torch.zeros(64 * 1024).share_memory_()  # 256 KiB in a shared-memory segment
    plain = torch.zeros(32 * 1024)  # 128 KiB on the heap
    w = torch.ones(4, requires_grad=True)
    kept = {"batches": [shared], "features": [plain], "loss": (w * 2).sum()}
    (stats,) = scan_roots([Root("kept", "user", "kept", kept)]).roots
    split = stats.retained_by_resource()
    assert split["shm"] == 256 * 1024 and split["heap"] >= 128 * 1024 and "vram" not in split, split
    assert sum(split.values()) == stats.retained_bytes


def test_a_functools_cache_is_read_into_bounded_or_not() -> None:
    """An lru_cache keeps its results in C, with no attribute to read: the scan reads them as the collector
    does, the unbounded cache's dict and a bounded cache's links alike, and names them under the function."""
    import functools

    @functools.cache
    def augmented(batch_id: int) -> torch.Tensor:
        return torch.zeros(16 * 1024)  # 64 KiB

    @functools.lru_cache(maxsize=4)
    def view_of(batch_id: int, scale: float = 1.0) -> torch.Tensor:
        return torch.zeros(16 * 1024)

    for i in range(10):
        augmented(i)
        view_of(i, scale=2.0)
    unbounded = memcheck(augmented, name="augmented")
    assert unbounded.retained_bytes == 10 * 64 * 1024 and unbounded.tensors == 10, unbounded
    assert any(f.path.startswith("augmented (functools.lru_cache)[") for f in unbounded.findings), unbounded.findings
    bounded = memcheck(view_of, name="view_of")
    assert bounded.retained_bytes == 4 * 64 * 1024, bounded
    augmented.cache_clear()
    assert memcheck(augmented, name="augmented").retained_bytes == 0


def test_a_logger_a_name_keeps_is_read_into_its_handlers_and_only_then() -> None:
    """The process' machinery (loggers, handlers) is skipped where an object reaches it, or every scan would
    walk the logging tree; a root that is a logger is read into its handlers, so their buffered records are
    found under the user's own name for the logger."""
    import logging
    import logging.handlers

    log = logging.getLogger("torchmem_magic.tests.buffered")
    handler = logging.handlers.MemoryHandler(capacity=10**9, flushLevel=logging.CRITICAL)
    log.addHandler(handler)
    log.propagate = False
    try:
        for _ in range(4):
            log.error("kept %s", torch.zeros(16 * 1024))
        direct = memcheck(log, name="log")
        assert direct.retained_bytes == 4 * 64 * 1024, direct
        assert direct.findings[0].path == "log.handlers[0].buffer[0].args[0]", direct.findings[0]
        assert memcheck({"logger": log}, name="holder").retained_bytes == 0  # reached from an object: skipped
    finally:
        log.removeHandler(handler)
        handler.buffer.clear()
