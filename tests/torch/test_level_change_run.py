"""A model that grows once, mid-run (its token statistics resized for an added vocabulary), then stays the same
size for the rest of the run, is no leak of any kind: one jump is no pattern. The same jump again and again is."""

from __future__ import annotations

import torch

from torchmem_magic import memwatch

STEPS = 600  # step readings thin out as a run goes on: the level after the jump must be read long enough
MIB = 1 << 20


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(64, 8)
        self.register_buffer("token_counts", torch.zeros(1000))

    def grow(self, added_tokens: int) -> None:
        """New tokens: a bigger buffer, the old counts copied (what an added vocabulary does)."""
        bigger = torch.zeros(self.token_counts.numel() + added_tokens)
        bigger[: self.token_counts.numel()] = self.token_counts
        self.token_counts = bigger

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)  # type: ignore[no-any-return]


def _train(grow_at: set[int]) -> None:
    model = Tagger()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        if step in grow_at:
            model.grow(10 * MIB)  # +40 MiB
        loss = model(torch.randn(32, 64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_model_resized_once_mid_run_is_not_a_leak() -> None:
    with memwatch(20, quiet=True) as watched:
        _train({100})
    report = watched.report
    assert report.verdict not in ("leak", "suspect") and report.leak_kind is None, report.advice


def test_a_model_resized_again_and_again_is_a_sporadic_leak() -> None:
    with memwatch(20, quiet=True) as watched:
        _train({100, 200, 300, 400, 500})
    report = watched.report
    assert (report.verdict, report.leak_kind) == ("leak", "sporadic"), report.advice
