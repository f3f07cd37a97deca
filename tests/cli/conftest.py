"""Fixtures of the command-line tests (helpers are in watching.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from watching import PACKAGE_ROOT, ROOT


@pytest.fixture(autouse=True)
def _this_checkout() -> None:
    """The commands run this checkout's package (PYTHONPATH below): so must the test process."""
    if PACKAGE_ROOT != ROOT:
        pytest.fail(f"torchmem_magic is imported from {PACKAGE_ROOT}, not {ROOT}: set PYTHONPATH={ROOT}")


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    path = tmp_path / "tmp"
    path.mkdir()
    return path
