"""The step clocks and loader passes on real torch objects; everything restored afterwards."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.nn.modules import module as nn_module
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from torchmem_magic.core.step_gate import StepGate
from torchmem_magic.tracing.hooks import LoaderPass, TrainingHooks, installed_hook_count


def _train(optimizer_cls: type, steps: int, **kwargs: object) -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = optimizer_cls(model.parameters(), **kwargs)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()


def _recording() -> tuple[list[str], list[LoaderPass], TrainingHooks]:
    ticks: list[str] = []
    passes: list[LoaderPass] = []
    return ticks, passes, TrainingHooks(ticks.append, passes.append)


@pytest.mark.parametrize(
    "optimizer_cls,kwargs",
    [(torch.optim.SGD, {"lr": 0.1}), (torch.optim.Adam, {}), (torch.optim.AdamW, {"foreach": False}), (torch.optim.RMSprop, {})],
)
def test_counts_every_optimizer_step_and_backward_pass(optimizer_cls: type, kwargs: dict) -> None:  # type: ignore[type-arg]
    ticks, _, hooks = _recording()
    with hooks:
        _train(optimizer_cls, 7, **kwargs)
    _train(optimizer_cls, 3, **kwargs)  # after removal: not counted
    assert ticks.count("optimizer") == 7 and ticks.count("backward") == 7
    assert ticks.count("forward") == 1  # the first forward, before the first backward removed those hooks
    assert installed_hook_count() == 0


def test_every_way_into_the_backward_engine_is_a_backward_pass() -> None:
    ticks, _, hooks = _recording()
    x = torch.randn(3, requires_grad=True)
    with hooks:
        (x * 2).sum().backward()
        torch.autograd.backward((x * 3).sum())
        torch.autograd.grad((x * 4).sum(), x)
    assert ticks.count("backward") == 3


def test_only_the_outermost_forward_counts_and_a_failed_forward_heals() -> None:
    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("inner failure")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(4, 1)))
    broken = torch.nn.Sequential(torch.nn.Linear(4, 4), Broken())
    ticks, _, hooks = _recording()
    with hooks, torch.no_grad():
        for _ in range(5):
            model(torch.randn(2, 4))
        with pytest.raises(ValueError):
            broken(torch.randn(2, 4))
        model(torch.randn(2, 4))
    assert ticks == ["forward"] * 7  # 6 calls of model, and the failed outer call of broken
    assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks


def test_a_reentrant_checkpoints_inner_backward_is_part_of_the_step() -> None:
    """A reentrant checkpoint runs its forward and a backward again inside the step's backward: one pass."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    ticks, _, hooks = _recording()
    with hooks:
        for _ in range(3):
            x = torch.randn(2, 4, requires_grad=True)
            torch.utils.checkpoint.checkpoint(model, x, use_reentrant=True).sum().backward()
    assert ticks.count("backward") == 3


@pytest.fixture()
def dynamo_backends(monkeypatch: pytest.MonkeyPatch) -> dict[int, object]:
    """dynamo's table of the backends `torch.compile` was given, this test's own (restored after it)."""
    from torch._dynamo import eval_frame

    backends: dict[int, object] = {0: None}  # dynamo's own `disable`, there from its import
    monkeypatch.setattr(eval_frame, "cached_backends", backends)
    return backends


def test_no_forward_hooks_where_compiled_code_may_run(dynamo_backends: dict[int, object]) -> None:
    """dynamo guards on how many global module hooks there are, and a compiled module warns beside them."""
    ticks, _, hooks = _recording()
    with hooks:
        assert nn_module._global_forward_pre_hooks and nn_module._global_forward_hooks  # nothing compiled yet
        dynamo_backends[1] = object()  # as `torch.compile` leaves it
    with hooks:
        assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks
        assert installed_hook_count() == 4  # the optimizer hook and three wraps
        torch.nn.Linear(4, 1)(torch.randn(2, 4))
    assert ticks == []


def test_torch_compile_in_the_run_removes_the_forward_hooks_before_it_compiles(
    dynamo_backends: dict[int, object],
) -> None:
    ticks, _, hooks = _recording()
    model = torch.nn.Linear(4, 1)
    with hooks:
        assert nn_module._global_forward_pre_hooks and nn_module._global_forward_hooks
        compiled = torch.compile(model, backend="eager")  # lazy: compiles at its first call, not called here
        assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks
        assert isinstance(compiled, torch.nn.Module)
    assert torch.compile.__module__ == "torch" and installed_hook_count() == 0


def test_batches_and_passes_are_told_apart_by_loader() -> None:
    train = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    val = DataLoader(TensorDataset(torch.arange(4.0)), batch_size=4)
    ticks, passes, hooks = _recording()
    original_iter, original_next = DataLoader.__iter__, _BaseDataLoaderIter.__next__
    with hooks:
        for _ in range(2):
            assert sum(len(b[0]) for b in train) == 10
            assert hooks.current_loader == 1
            assert sum(len(b[0]) for b in val) == 4
            assert hooks.current_loader == 2
    assert ticks == (["batch"] * 4) * 2
    assert [(p.loader, p.batches, p.workers) for p in passes] == [(1, 3, []), (2, 1, [])] * 2
    assert DataLoader.__iter__ is original_iter and _BaseDataLoaderIter.__next__ is original_next
    assert installed_hook_count() == 0


def test_callback_errors_never_reach_the_loop() -> None:
    def boom(clock: str) -> None:
        raise ValueError("bad probe")

    hooks = TrainingHooks(boom, lambda loader_pass: None)
    with hooks:
        _train(torch.optim.SGD, 2, lr=0.1)
    assert hooks.errors.count == 5 and "bad probe" in hooks.errors.last  # 1 forward, 2 backward, 2 steps


def _seen_in_a_child(step: Callable[[], None], seen: Callable[[], object]) -> Any:
    """Fork: the child makes `step()` and sends back `seen()` (as JSON); the parent waits for it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            step()
            os.write(write_end, json.dumps(seen()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        result = json.loads(reader.read())
    os.waitpid(pid, 0)
    return result


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_steps_in_a_process_forked_later_go_to_its_watcher_not_to_this_session() -> None:
    # the hooks learn of the fork from an at-fork handler, not from a pid read at every step
    ticks: list[str] = []
    foreign: list[object] = []
    hooks = TrainingHooks(ticks.append, lambda loader_pass: None, lambda h, clock: foreign.append(clock))
    with hooks:
        _train(torch.optim.SGD, 1, lr=0.1)
        seen_in_child = _seen_in_a_child(lambda: _train(torch.optim.SGD, 1, lr=0.1),
                                         lambda: [ticks.count("optimizer"), foreign])
        _train(torch.optim.SGD, 1, lr=0.1)
    assert seen_in_child == [1, ["backward", "optimizer"]]  # the child's own steps went to its watcher
    assert ticks.count("optimizer") == 2 and ticks.count("backward") == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_process_forked_with_the_gate_armed_hands_its_next_step_to_its_watcher() -> None:
    ticks: list[str] = []
    foreign: list[object] = []
    hooks = TrainingHooks(ticks.append, lambda loader_pass: None, lambda h, clock: foreign.append(clock))
    gate = StepGate()
    gate.clock, gate.due_step = "optimizer", 1 << 40  # armed: no step is due for a long while
    with hooks:
        hooks.use_gate(gate)
        _train(torch.optim.SGD, 1, lr=0.1)
        seen_in_child = _seen_in_a_child(lambda: _train(torch.optim.SGD, 1, lr=0.1), lambda: foreign)
    assert seen_in_child == ["backward", "optimizer"]  # the optimizer step too, though this gate had none due
    assert gate.step == 1 and "optimizer" not in ticks  # this process's step was counted on the gate alone


def test_removed_on_exception_and_idempotent() -> None:
    hooks = TrainingHooks(lambda clock: None, lambda loader_pass: None)
    with pytest.raises(KeyboardInterrupt):
        with hooks:
            assert installed_hook_count() == 7  # step, 2 forward hooks, compile, backward, __iter__, __next__
            raise KeyboardInterrupt
    hooks.remove()
    assert installed_hook_count() == 0


def test_someone_wrapping_our_wrapper_keeps_theirs_and_ours_goes_inert() -> None:
    original = DataLoader.__iter__
    passes: list[object] = []
    hooks = TrainingHooks(lambda clock: None, passes.append)
    hooks.install()
    ours = DataLoader.__iter__

    def theirs(self):  # type: ignore[no-untyped-def]
        return ours(self)

    DataLoader.__iter__ = theirs  # type: ignore[method-assign]
    try:
        hooks.remove()
        assert DataLoader.__iter__ is theirs
        list(DataLoader(TensorDataset(torch.arange(4.0))))
        assert passes == []  # inert
    finally:
        DataLoader.__iter__ = original  # type: ignore[method-assign]


def test_our_callback_failures_are_counted_but_a_worker_death_raised_into_them_propagates() -> None:
    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)

    def failing(loader_pass: object) -> None:
        raise ValueError("our own bug")

    def interrupted(loader_pass: object) -> None:  # torch's SIGCHLD handler fired in here
        raise RuntimeError("DataLoader worker (pid(s) 4244) exited unexpectedly")

    with TrainingHooks(lambda clock: None, failing) as hooks:
        assert len(list(loader)) == 2  # the loop goes on
    assert hooks.errors.count == 1 and "our own bug" in hooks.errors.last
    with TrainingHooks(lambda clock: None, interrupted), pytest.raises(RuntimeError, match="4244"):
        list(loader)
    assert installed_hook_count() == 0
