import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchmem_magic.hooks import TrainingHooks, installed_hook_count


def _train(optimizer_cls: type, steps: int, **kwargs: object) -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = optimizer_cls(model.parameters(), **kwargs)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()


@pytest.mark.parametrize(
    "optimizer_cls,kwargs",
    [(torch.optim.SGD, {"lr": 0.1}), (torch.optim.Adam, {}), (torch.optim.AdamW, {"foreach": False}), (torch.optim.RMSprop, {})],
)
def test_counts_every_optimizer_step(optimizer_cls: type, kwargs: dict) -> None:
    steps: list[int] = []
    with TrainingHooks(lambda: steps.append(1), lambda pids, length: None):
        _train(optimizer_cls, 7, **kwargs)
    _train(optimizer_cls, 3, **kwargs)  # after removal: not counted
    assert len(steps) == 7
    assert installed_hook_count() == 0


def test_counts_epochs_and_restores_dataloader() -> None:
    original = DataLoader.__iter__
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    epochs: list[tuple[list[int], int | None]] = []
    with TrainingHooks(lambda: None, lambda pids, length: epochs.append((pids, length))):
        assert installed_hook_count() == 2
        for _ in range(3):
            assert sum(len(b[0]) for b in loader) == 10
    assert epochs == [([], 3)] * 3  # no workers; 3 batches a pass
    assert DataLoader.__iter__ is original and installed_hook_count() == 0


def test_callback_errors_never_reach_the_loop() -> None:
    def boom() -> None:
        raise ValueError("bad probe")

    hooks = TrainingHooks(boom, lambda pids, length: None)
    with hooks:
        _train(torch.optim.SGD, 2, lr=0.1)
    assert hooks.errors.count == 2 and "bad probe" in hooks.errors.last


def test_removed_on_exception_and_idempotent() -> None:
    hooks = TrainingHooks(lambda: None, lambda pids, length: None)
    with pytest.raises(KeyboardInterrupt):
        with hooks:
            raise KeyboardInterrupt
    hooks.remove()
    assert installed_hook_count() == 0


def test_someone_wrapping_our_wrapper_keeps_theirs_and_ours_goes_inert() -> None:
    original = DataLoader.__iter__
    epochs: list[object] = []
    hooks = TrainingHooks(lambda: None, lambda pids, length: epochs.append(pids))
    hooks.install()
    ours = DataLoader.__iter__

    def theirs(self):  # type: ignore[no-untyped-def]
        return ours(self)

    DataLoader.__iter__ = theirs
    try:
        hooks.remove()
        assert DataLoader.__iter__ is theirs
        list(DataLoader(TensorDataset(torch.arange(4.0))))
        assert epochs == []  # inert
    finally:
        DataLoader.__iter__ = original


def test_our_callback_failures_are_counted_but_a_worker_death_raised_into_them_propagates() -> None:
    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)

    def failing(pids: object, length: object) -> None:
        raise ValueError("our own bug")

    def interrupted(pids: object, length: object) -> None:  # torch's SIGCHLD handler fired in here
        raise RuntimeError("DataLoader worker (pid(s) 4244) exited unexpectedly")

    with TrainingHooks(lambda: None, failing) as hooks:
        assert len(list(loader)) == 2  # the loop goes on
    assert hooks.errors.count == 1 and "our own bug" in hooks.errors.last
    with TrainingHooks(lambda: None, interrupted), pytest.raises(RuntimeError, match="4244"):
        list(loader)
    assert installed_hook_count() == 0
