"""One torch thread while the gate's loops run: on a busy 2-core machine a second one makes each
small step ~7x slower (threads waiting for each other). Set for each module here, restored after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
