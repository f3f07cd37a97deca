"""The search beyond the names mid-run is the session's own decision: under `memwatch(quiet=True)` and
`assert_no_leak()`, with no live figure or callback attached, a leak that no name's scans explain (a
library's module global) is searched for mid-run and measured at each scan from then on, as under the
live figure."""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Callable

import pytest
import torch

from torchmem_magic import LeakError, assert_no_leak, last_report, memwatch
from torchmem_magic.session.run import active_session

NAME = "module global featurestore.CACHE"


@pytest.fixture
def store() -> Iterator[None]:
    """A library's module global, reached by no name of the caller's (no local of any frame holds it
    either): only a search back finds it."""
    module = types.ModuleType("featurestore")
    module.CACHE = []  # type: ignore[attr-defined]
    sys.modules["featurestore"] = module
    del module
    try:
        yield
    finally:
        del sys.modules["featurestore"]


def _loop_until_measured() -> tuple[int, bool]:
    """Keep 16 KiB a step in the library's global until the session's finder has measured it at 4 scans, or its
    searches back have all run without finding it, or two minutes passed: (steps, whether it was measured)."""
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    deadline, step = time.monotonic() + 120, 0
    while time.monotonic() < deadline:
        loss = model(torch.randn(32, 64)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sys.modules["featurestore"].CACHE.append(torch.randn(64, 64))
        time.sleep(0.001)
        step += 1
        if step % 25 == 0:
            session = active_session()
            assert session is not None and session.finder is not None
            if len(session.finder.series().get(NAME, [])) >= 4:
                return step, True
            if session.finder.searches_spent:
                return step, False
    return step, False


FRONTS: dict[str, Callable[[], AbstractContextManager[object]]] = {
    "memwatch": lambda: memwatch(20, quiet=True),
    "assert_no_leak": lambda: assert_no_leak(20, quiet=True),
}


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_a_holder_no_name_reaches_is_found_mid_run_with_no_front_end_attached(
    front: str, store: None
) -> None:
    measured = False
    try:
        with FRONTS[front]():
            steps, measured = _loop_until_measured()
    except LeakError:
        pass
    report = last_report()
    assert report is not None
    assert measured, (steps, report.to_dict()["advice"])
    top = report.to_dict()["suspects"][0]
    assert top["name"] == NAME and top["path"].startswith("featurestore.CACHE["), top
    assert len(top["series"]) >= 4, top  # measured mid-run, scan by scan: not only at the end
