from __future__ import annotations

from collections.abc import Iterator

import pytest
from kernel_client import SETUP, Kernel


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    k.ok(SETUP)
    yield k
    k.shutdown()


@pytest.fixture()
def fresh_kernel() -> Iterator[Kernel]:
    k = Kernel()
    k.ok(SETUP)
    yield k
    k.shutdown()
