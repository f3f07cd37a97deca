"""Reusing a name's scan from one cell to the next while its objects are unchanged."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

import torchmem_magic.finder.scan.memo as memo_module
from torchmem_magic import MemwatchSession
from torchmem_magic.finder.scan.memo import ScanMemo, fingerprints, scan_reusing
from torchmem_magic.finder.scan.results import Budget, Root
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.finder.leak_finder import LeakSearch

from test_scan import EndlessList, Hostile


def _print(name: str, obj: Any) -> object:
    return fingerprints([Root(name, "user", name, obj)])[name]


class Recorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        self.kept: list[torch.Tensor] = []


class Trainer:
    def __init__(self) -> None:
        self.model = torch.nn.Linear(4, 4)
        self.kept: list[torch.Tensor] = []


@pytest.mark.parametrize(
    "build, change",
    [
        (lambda: [torch.ones(1)], lambda o: o.append(torch.ones(1))),
        (lambda: {"loss": [], "acc": []}, lambda o: o["acc"].append(torch.ones(1))),  # nested, last value
        (lambda: {"loss": [], "acc": []}, lambda o: o["loss"].append(torch.ones(1))),  # nested, first value
        (lambda: [{"id": i} for i in range(100_000)], lambda o: o.append({"id": -1})),  # a big list's tail
        (Trainer, lambda o: o.kept.append(torch.ones(1))),  # an instance attribute
        (Recorder, lambda o: o.kept.append(torch.ones(1))),  # a module's own attribute, after torch's
        (lambda: torch.nn.Linear(4, 4), lambda o: o(torch.ones(4)).sum().backward()),  # .grad appears
        (lambda: collections_deque(), lambda o: o.append(torch.ones(1))),  # a container subclass
    ],
    ids=["list", "dict-last", "dict-first", "records", "attribute", "module-attribute", "grad", "deque"],
)
def test_a_change_where_leaks_grow_changes_the_fingerprint(build: Callable[[], Any], change: Callable[[Any], None]) -> None:
    obj = build()
    before = _print("x", obj)
    assert _print("x", obj) == before  # looking changes nothing
    change(obj)
    assert _print("x", obj) != before


def collections_deque() -> Any:
    from collections import deque

    return deque([torch.ones(1)], maxlen=None)


def test_hostile_objects_are_never_called_and_read_as_unchanged() -> None:
    hostile, endless = Hostile(torch.ones(3)), EndlessList([torch.ones(2)])
    for obj in (hostile, endless, [hostile, endless]):
        first = _print("h", obj)
        assert first is not None and _print("h", obj) == first


def test_the_second_scan_scans_only_the_changed_names_and_reports_all(monkeypatch: pytest.MonkeyPatch) -> None:
    scanned: list[set[str]] = []
    real_scan = memo_module.scan_roots

    def spy(roots: list[Root], budget: Budget | None = None, seen: Any = ()) -> Any:
        scanned.append({r.name for r in roots})
        return real_scan(roots, budget, seen)

    monkeypatch.setattr(memo_module, "scan_roots", spy)
    records = [{"id": i} for i in range(50_000)]
    history = [torch.ones(256, requires_grad=True).sum() for _ in range(3)]
    cache = [torch.ones(1024)]
    roots = lambda: [Root(n, "user", n, v) for n, v in (("records", records), ("history", history), ("cache", cache))]
    memo = ScanMemo()
    first = scan_reusing(memo, roots(), Budget())
    history.append(torch.ones(256, requires_grad=True).sum())
    second = scan_reusing(memo, roots(), Budget())
    third = scan_reusing(memo, roots(), Budget(), rescan={"cache"})
    assert scanned == [{"records", "history", "cache"}, {"history"}, {"cache"}]
    by_name = {s.name: s for s in second.roots}
    assert set(by_name) == {"records", "history", "cache"}
    assert by_name["history"].tensors == 4 and by_name["cache"].tensor_bytes == 4096
    assert {s.name: s.retained_bytes for s in third.roots} == {s.name: s.retained_bytes for s in second.roots}
    assert [s.name for s in first.roots] == sorted((s.name for s in first.roots), key=lambda n: -by_name[n].retained_bytes)


def test_names_gone_are_forgotten_and_the_memo_keeps_no_object_alive() -> None:
    memo = ScanMemo()
    tensor = torch.ones(8)
    ref = weakref.ref(tensor)
    scan_reusing(memo, [Root("t", "user", "t", [tensor]), Root("u", "user", "u", [1])], Budget())
    assert len(memo) == 2
    del tensor
    gc.collect()
    assert ref() is None
    scan_reusing(memo, [Root("u", "user", "u", [1])], Budget())
    assert len(memo) == 1


def test_a_name_cut_short_by_time_is_scanned_again_and_one_cut_by_the_other_limits_is_not() -> None:
    big = [[object()] for _ in range(5_000)]
    roots = [Root("big", "user", "big", big)]
    memo = ScanMemo()
    assert scan_reusing(memo, roots, Budget(max_children=100)).truncated
    assert len(memo) == 1
    memo = ScanMemo()
    assert scan_reusing(memo, roots, Budget(time_s=0.0)).truncated
    assert len(memo) == 0


def test_sessions_reuse_the_scan_of_unchanged_names_and_still_see_what_the_cell_grew(monkeypatch: pytest.MonkeyPatch) -> None:
    scanned: list[set[str]] = []
    real_scan = memo_module.scan_roots
    monkeypatch.setattr(memo_module, "scan_roots", lambda roots, budget=None, seen=(): (scanned.append({r.name for r in roots}), real_scan(roots, budget, seen))[1])
    namespace: dict[str, Any] = {"records": [{"id": i} for i in range(20_000)], "outputs": []}
    roots = lambda: [Root(n, "user", n, v) for n, v in namespace.items()]
    with MemwatchSession(SessionOptions(10), search=LeakSearch(roots)):
        pass
    scanned.clear()
    with MemwatchSession(SessionOptions(10), search=LeakSearch(roots)) as session:
        for _ in range(3):
            namespace["outputs"].append(torch.ones(128, 128, requires_grad=True).exp().sum())
    assert scanned == [set(), {"outputs"}]  # nothing changed before the cell; the end scans what grew
    assert session.report is not None
    assert [s.name for s in session.report.suspects] == ["outputs"] and session.report.suspects[0].new_in_cell


def test_at_the_end_a_cheap_name_is_scanned_again_even_when_its_fingerprint_misses_the_change() -> None:
    memo = ScanMemo()
    middle = [[] for _ in range(20)]  # the fingerprint samples the first and last four items only
    roots = [Root("middle", "user", "middle", middle)]
    scan_reusing(memo, roots, Budget())
    middle[10].append(torch.ones(1024))
    assert scan_reusing(memo, roots, Budget()).roots[0].tensors == 0  # reused: the change is unseen
    assert scan_reusing(memo, roots, Budget(), min_objects=10_000).roots[0].tensors == 1


def test_the_last_exception_is_reused_however_small_while_it_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        kept = torch.ones(256)  # noqa: F841 - held by the traceback's frame
        raise ValueError("boom")

    try:
        fail()
    except ValueError as exc:
        error = exc
    memo = ScanMemo()
    roots = [Root("sys.last_value", "traceback", "sys.last_value", error)]
    scan_reusing(memo, roots, Budget(), min_objects=10_000)
    scanned: list[str] = []
    real = memo_module.scan_roots
    monkeypatch.setattr(memo_module, "scan_roots", lambda roots, budget=None, seen=(): (scanned.extend(r.name for r in roots), real(roots, budget, seen))[1])
    again = scan_reusing(memo, roots, Budget(), min_objects=10_000)
    assert scanned == [] and again.roots[0].tensors == 1
