"""Copy-on-access (pytorch#13246) with real DataLoader worker processes: flagged for a list of Python
strings, not for the same data as a numpy array."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from torchmem_magic import MemwatchSession
from torchmem_magic.core.options import SessionOptions

ROWS = 1_000_000


class Rows(Dataset):  # type: ignore[type-arg]
    def __init__(self, as_numpy: bool) -> None:
        rows = [f"sample-{i:08d}-{'x' * 40}" for i in range(ROWS)]
        self.data = np.array(rows, dtype="S56") if as_numpy else rows

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> int:
        return len(self.data[i])


def _advice(as_numpy: bool) -> tuple[str, ...]:
    loader = DataLoader(Rows(as_numpy), batch_size=2048, num_workers=2, persistent_workers=True)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = MemwatchSession(SessionOptions(100))
    with session:
        for _ in range(3):
            for _batch in loader:
                optimizer.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                optimizer.step()
    assert session.report is not None and session.report.workers is not None
    return session.report.advice


@pytest.mark.parametrize("as_numpy,flagged", [(False, True), (True, False)])
def test_copy_on_access(as_numpy: bool, flagged: bool) -> None:
    advice = _advice(as_numpy)
    assert any("copy-on-access" in a for a in advice) == flagged, advice
