"""What `memcheck` says a holder retains is what deleting the holder frees: within 0.5–2× of the drop of the
heap in use (glibc's counters, mmap'd blocks included) after `del` and a collection, for the classic holders
and the containers the collector does not see into."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from torchmem_magic import memcheck
from torchmem_magic.probes.heap import HeapProbe

STEPS = 40
heap = HeapProbe()
pytestmark = pytest.mark.skipif(not heap.available, reason=f"no heap counters here: {heap.unavailable_reason}")


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))


def losses_with_graphs() -> Any:
    model, history = _model(), []
    for _ in range(STEPS):
        history.append(model(torch.randn(128, 256)).square().mean())  # each keeps its activations
    return history


def detached_outputs() -> Any:
    model = _model()
    return [model(torch.randn(128, 256)).detach() for _ in range(STEPS)]


def a_dict_cache() -> Any:
    return {f"batch{i}": torch.randn(128, 256) for i in range(STEPS)}


def a_module_attribute() -> Any:
    model = _model()
    model.kept = [model(torch.randn(128, 256)).detach() for _ in range(STEPS)]  # type: ignore[assignment]
    return model.kept


def an_object_array() -> Any:
    kept = np.empty(STEPS, dtype=object)
    for i in range(STEPS):
        kept[i] = torch.randn(128, 256)
    return kept


def a_frame_column() -> Any:
    pandas = pytest.importorskip("pandas")
    return pandas.DataFrame({"step": range(STEPS), "out": [torch.randn(128, 256) for _ in range(STEPS)]})


@pytest.mark.parametrize("build", [losses_with_graphs, detached_outputs, a_dict_cache, a_module_attribute,
                                   an_object_array, a_frame_column], ids=lambda f: f.__name__)
def test_memcheck_retains_what_del_frees(build: Callable[[], Any]) -> None:
    holder = {"x": build()}
    gc.collect()
    retained = memcheck(holder["x"]).retained_bytes
    before = heap.heap_bytes()
    del holder["x"]
    gc.collect()
    freed = before - heap.heap_bytes()
    assert freed > 1 << 20, freed  # the holder held memory worth checking
    assert 0.5 <= retained / freed <= 2.0, (retained, freed)
