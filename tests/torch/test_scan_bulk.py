"""Long containers of flat records are checked in bulk: the same counts and the same tensors as item by
item, nothing visited one by one that holds no tensor, and the scan's time budget still applies."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchmem_magic.finder.scan.scanner as scanner_module
from torchmem_magic.finder.scan.introspect import flat_records_in_bulk
from torchmem_magic.finder.scan.results import Budget, Root, RootStats
from torchmem_magic.finder.scan.scanner import BULK_CHUNK, scan_roots

N = BULK_CHUNK + 5_000  # more than one chunk


def dicts(n: int) -> list[Any]:
    return [{"i": i, "s": str(i)} for i in range(n)]


def scan(obj: Any, budget: Budget | None = None) -> tuple[RootStats, list[str]]:
    result = scan_roots([Root("data", "user", "data", obj)], budget or Budget(max_objects_per_root=10**7))
    return result.roots[0], [f.path for f in result.findings]


def item_by_item(monkeypatch: pytest.MonkeyPatch, obj: Any) -> tuple[int, int, list[str]]:
    with monkeypatch.context() as patched:
        patched.setattr(scanner_module, "BULK_MIN_ITEMS", 10**12)
        stats, paths = scan(obj)
    return stats.tensors, stats.plain_objects, paths


def test_the_bulk_check_tells_flat_records_from_anything_else() -> None:
    assert flat_records_in_bulk([1, "a", None, 2.5]) == 0
    assert flat_records_in_bulk(dicts(10)) == 10
    assert flat_records_in_bulk([(1, "a"), ()] * 5) == 10
    assert flat_records_in_bulk([[1, 2], []]) == 2
    assert flat_records_in_bulk([{"i": 1}, (1, 2)]) is None  # mixed kinds: item by item
    assert flat_records_in_bulk([{"i": 1}, 3]) is None
    assert flat_records_in_bulk([{"tags": (1, 2)}]) is None  # nested: item by item
    assert flat_records_in_bulk([{"t": torch.ones(1)}]) is None
    assert flat_records_in_bulk([{torch.ones(1): 1}]) is None  # a tensor as a key
    assert flat_records_in_bulk([torch.ones(1)]) is None


def test_records_are_counted_in_bulk_and_none_is_visited(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = scanner_module.flat_records_in_bulk
    monkeypatch.setattr(scanner_module, "flat_records_in_bulk", lambda items: calls.append(len(items)) or real(items))
    data = {"rows": dicts(N), "pairs": [(i, "x") for i in range(N)], "by_id": {i: {"i": i} for i in range(N)}}
    stats, paths = scan(data)
    assert (stats.tensors, paths) == (0, [])
    assert stats.plain_objects == 3 * N
    assert stats.objects == 4  # the dict and its three containers: no record visited one by one
    assert sorted(calls) == sorted([BULK_CHUNK, N - BULK_CHUNK] * 3)


@pytest.mark.parametrize("where", [0, BULK_CHUNK - 1, BULK_CHUNK, N - 1], ids=["first", "chunk-end", "chunk-start", "last"])
def test_a_tensor_among_records_is_found_wherever_it_is(monkeypatch: pytest.MonkeyPatch, where: int) -> None:
    rows = dicts(N)
    rows[where] = {"i": where, "loss": torch.ones(2)}
    stats, paths = scan(rows)
    assert paths == [f"data[{where}]['loss']"]
    assert (stats.tensors, stats.plain_objects, paths) == item_by_item(monkeypatch, rows)


@pytest.mark.parametrize(
    "build",
    [
        lambda: [*dicts(N), torch.ones(3)],  # a bare tensor after the records
        lambda: [{"i": i, "tags": (i, i + 1)} for i in range(N)],  # nested records: counted item by item
        lambda: [*dicts(200), {torch.ones(1): "key"}, *dicts(200)],  # a tensor as a record's key
        lambda: {str(i): {"i": i} for i in range(N)} | {"t": [torch.ones(1)]},  # a dict's values
        lambda: tuple([*dicts(500), (torch.ones(1), 1)]),
    ],
    ids=["bare-tensor", "nested", "tensor-key", "dict-values", "tuple"],
)
def test_bulk_and_item_by_item_agree(monkeypatch: pytest.MonkeyPatch, build: Any) -> None:
    data = build()
    stats, paths = scan(data)
    assert (stats.tensors, stats.plain_objects, paths) == item_by_item(monkeypatch, data)
    assert stats.tensors == (0 if paths == [] else len(paths))


def test_the_time_budget_still_stops_a_huge_list() -> None:
    stats, _ = scan(dicts(3 * BULK_CHUNK), Budget(time_s=0.0))
    assert stats.truncated
    assert stats.plain_objects < 3 * BULK_CHUNK
