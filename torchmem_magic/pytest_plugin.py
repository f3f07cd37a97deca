"""pytest plugin: `@pytest.mark.no_leak` runs a test's body under `assert_no_leak`.

Registered through the `pytest11` entry point, so it is loaded wherever torchmem_magic is installed;
it only declares the marker, and a test without the marker runs exactly as before: nothing of
torchmem_magic beyond this module (and no torch) is imported until a marked test runs.

    @pytest.mark.no_leak                      # fails on the verdict "leak"
    @pytest.mark.no_leak(interval_ms=20, fail_on=("leak", "suspect"))
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

MARKER = "no_leak"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**options): fail the test when its memory leaks (torchmem_magic.assert_no_leak; the options "
        "are memwatch()'s and fail_on)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """The test's call phase (its fixtures are set up already, so their allocations do not count)."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    if marker.args:
        pytest.fail(f"@pytest.mark.{MARKER} takes keyword options only (interval_ms=..., fail_on=...), got "
                    f"{marker.args!r}", pytrace=False)
    from .frontends.gate import LeakError, LeakGate

    # the test module's globals; its source is where the holder's fix line is found. The report is
    # printed, so a failing test's captured output shows it whole.
    function = getattr(item, "obj", None)
    namespace: dict[str, Any] = getattr(function, "__globals__", {})
    try:
        with LeakGate(namespace, code=getattr(function, "__code__", None), **marker.kwargs):
            return (yield)
    except LeakError as error:
        message = f"{type(error).__name__}: {error}"
    pytest.fail(message, pytrace=False)  # the message says it all: no traceback through this plugin
