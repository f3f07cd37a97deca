"""A torch without one of the internals the step clocks lean on (an older or newer release): one line on
stderr names it and what goes uncounted, once; every other clock and curve works and the run has its report."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.optim.optimizer as optimizer_module
import torch.utils.data.dataloader as dataloader_module
from torch.utils.data import DataLoader, TensorDataset

from torchmem_magic.tracing import patches as patches_module
from torchmem_magic.api import memwatch
from torchmem_magic.tracing.hooks import TrainingHooks, installed_hook_count

BATCHES, EPOCHS = 8, 2


@pytest.fixture(autouse=True)
def new_process_announcements(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: nothing said missing yet."""
    monkeypatch.setattr(patches_module, "_announced", set())


def _train(backward: bool = True) -> None:
    """EPOCHS passes of BATCHES batches, an optimizer step each; without `backward` the gradients are set by
    hand (a torch whose backward entry point is gone must not be called through it by the test itself)."""
    loader = DataLoader(TensorDataset(torch.randn(4 * BATCHES, 4)), batch_size=4)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(EPOCHS):
        for (x,) in loader:
            loss = model(x).sum()
            if backward:
                loss.backward()
            else:
                for p in model.parameters():
                    p.grad = torch.ones_like(p)
            opt.step()
            opt.zero_grad()


Remove = Callable[[pytest.MonkeyPatch], None]

CASES: list[tuple[str, Remove, str, str, bool, str]] = [
    # (id, how the internal goes, the name said, what is not counted, backward in the loop, the clock then)
    (
        "backward-engine",
        lambda mp: mp.delattr(torch.autograd, "_engine_run_backward"),
        "torch.autograd._engine_run_backward", "backward passes", False, "optimizer",
    ),
    (
        "optimizer-hooks",
        lambda mp: mp.delattr(optimizer_module, "register_optimizer_step_post_hook"),
        "torch.optim.optimizer.register_optimizer_step_post_hook", "optimizer steps", True, "backward",
    ),
    (
        "loader-iterator-class",
        lambda mp: mp.delattr(dataloader_module, "_BaseDataLoaderIter"),
        "torch.utils.data.dataloader._BaseDataLoaderIter.__next__", "DataLoader batches", True, "optimizer",
    ),
]


@pytest.mark.parametrize("remove,name,uncounted,backward,clock", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_missing_internal_is_one_line_and_the_run_still_reports(
    remove: Remove, name: str, uncounted: str, backward: bool, clock: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    remove(monkeypatch)
    with memwatch(interval_ms=5, quiet=True) as watch:
        _train(backward)
    first = capsys.readouterr().err.splitlines()
    lines = [line for line in first if "torchmem_magic" in line]
    assert len(lines) == 1, first
    assert name in lines[0] and f"{uncounted} are not counted" in lines[0] and torch.__version__ in lines[0]
    report = watch.report.to_dict()
    assert report["status"] == "ok" and report["clock"] == clock
    assert report["steps"] == BATCHES * EPOCHS and report["samples"] > 0 and report["ram"]["peak"] > 0
    assert installed_hook_count() == 0

    with memwatch(interval_ms=5, quiet=True):  # said once per process, not once per run
        _train(backward)
    assert "torchmem_magic" not in capsys.readouterr().err


def test_the_hook_count_holds_without_the_optimizer_hook_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(optimizer_module, "_global_optimizer_post_hooks")
    hooks = TrainingHooks(lambda clock: None, lambda p: None)
    with hooks:
        assert [m.uncounted for m in hooks.missing] == ["optimizer steps"]
        assert installed_hook_count() == 6  # the forward pair and the four wraps; no table, no optimizer hook
    assert installed_hook_count() == 0


def test_with_every_internal_the_list_is_empty_and_nothing_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    with TrainingHooks(lambda clock: None, lambda p: None) as hooks:
        assert hooks.missing == []
    assert capsys.readouterr().err == ""
