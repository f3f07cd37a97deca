"""Training loops for the gate's tests: a clear leak (a metric computed with its autograd graph and
kept, ~270 KiB a step) and the same loop fixed (the metric's number kept)."""

from __future__ import annotations

import torch

STEPS = 200


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(64, 32)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def metric(model: torch.nn.Module) -> torch.Tensor:
    """A validation figure computed outside `torch.no_grad()`: it carries the batch's whole graph."""
    return model(torch.randn(64, 32)).pow(2).mean()


def train_keeping_graphs(steps: int = STEPS) -> int:
    """The leak inside a helper: its local `kept_metrics` grows while its steps run."""
    model, optimizer = make_model()
    kept_metrics = []
    for _ in range(steps):
        train_step(model, optimizer)
        kept_metrics.append(metric(model))
    return len(kept_metrics)


def train_returning_metrics(steps: int = STEPS) -> list[torch.Tensor]:
    """The same leak, handed to the caller: measured as `kept_metrics` while the steps run, then held
    under the caller's name."""
    model, optimizer = make_model()
    kept_metrics = []
    for _ in range(steps):
        train_step(model, optimizer)
        kept_metrics.append(metric(model))
    return kept_metrics
