from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_client import FLAVOURS, IPYKERNEL70_VERSION, REPO, SETUP, VENVS, Kernel, pinned_floors


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "floors: run in a kernel of the newest stack and again in one of the floors venv (oldest supported "
        "IPython, ipykernel 6, widgets; the newer torch)",
    )
    config.addinivalue_line(
        "markers",
        "ipykernel70: run in a kernel of the newest stack and again in one of ipykernel 7.0.0 (the "
        ".venv-ipykernel70 venv: what sends the live figure's updates there)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked `floors` run in the newest stack and the floors venv, those marked `ipykernel70` in the
    newest stack and ipykernel 7.0.0's venv (both marks: all three); the rest in the newest stack only."""
    if "kernel_flavour" not in metafunc.fixturenames:
        return
    marked = [name for name in ("floors", "ipykernel70") if metafunc.definition.get_closest_marker(name)]
    if marked:
        metafunc.parametrize("kernel_flavour", [*FLAVOURS[:1], *marked], scope="module")


@pytest.fixture(scope="module")
def kernel_flavour() -> str:
    return "newest"


def start_kernel(flavour: str) -> Kernel:
    venv = VENVS.get(flavour)
    if venv is not None and not (venv / ".installed").is_file():
        message = f"no {flavour} venv in {venv} (`make test` installs it)"
        if os.environ.get("TORCHMEM_REQUIRE_FLOORS") or os.environ.get("CI"):
            pytest.fail(message)  # make test and CI install it: a skip there would hide a broken setup
        pytest.skip(message)
    k = Kernel(flavour)
    try:
        k.ok(SETUP)
        # the matrix is only worth something if each kernel is what it says and runs this checkout's code
        if flavour == "floors":
            pins = pinned_floors()
            versions = k.value(
                "{n: __import__('importlib.metadata').metadata.version(n) for n in " + repr(sorted(pins)) + "}",
                store_history=False,
            )
            assert versions == pins, (flavour, versions)
        elif flavour == "ipykernel70":
            assert k.ipykernel_version == IPYKERNEL70_VERSION, (flavour, k.ipykernel_version)
        else:
            assert int(k.ipykernel_version.split(".")[0]) >= 7, (flavour, k.ipykernel_version)
        module = Path(k.value("torchmem_magic.__file__", store_history=False)).resolve()
        assert module.is_relative_to(REPO.resolve()), module
    except BaseException:
        k.shutdown()
        raise
    return k


@pytest.fixture(scope="module")
def kernel(kernel_flavour: str) -> Iterator[Kernel]:
    k = start_kernel(kernel_flavour)
    yield k
    k.shutdown()


@pytest.fixture()
def fresh_kernel(kernel_flavour: str) -> Iterator[Kernel]:
    k = start_kernel(kernel_flavour)
    yield k
    k.shutdown()
