from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_client import FLAVOURS, IPYKERNEL6, REPO, SETUP, Kernel


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "both_kernels: run in ipykernel 7 and in ipykernel 6 (the kernel-command matrix)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked `both_kernels` run once per kernel flavour; the rest in ipykernel 7 only."""
    if "kernel_flavour" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_kernels"):
        metafunc.parametrize("kernel_flavour", FLAVOURS, scope="module")


@pytest.fixture(scope="module")
def kernel_flavour() -> str:
    return "ipykernel7"


def start_kernel(flavour: str) -> Kernel:
    if flavour == "ipykernel6" and not (IPYKERNEL6 / ".installed").is_file():
        message = f"no ipykernel 6 in {IPYKERNEL6} (`make test` installs it)"
        if os.environ.get("TORCHMEM_REQUIRE_IPYKERNEL6") or os.environ.get("CI"):
            pytest.fail(message)  # make test and CI install it: a skip there would hide a broken setup
        pytest.skip(message)
    k = Kernel(flavour)
    try:
        k.ok(SETUP)
        # the matrix is only worth something if each kernel is what it says and runs this checkout's code
        major = k.ipykernel_version.split(".")[0]
        assert major == flavour.removeprefix("ipykernel"), (flavour, k.ipykernel_version)
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
