"""Which thread sends the live figure's updates, decided from the kernel's facts."""

from __future__ import annotations

import types

import pytest

from torchmem_magic.widgets.live_route import ROUTE_VARIABLE, live_route, route_for_kernel


@pytest.mark.parametrize("version", ["6.5.1", "6.29.5", "7.0.0", "7.0.1", "7.1.0", "7.4.0"])
def test_ipykernel_releases_send_from_the_sampler_thread(version: str) -> None:
    route = live_route(version, colab=False)
    assert route.route == "sampler" and version in route.why


def test_colab_sends_from_the_training_thread_whatever_its_kernel() -> None:
    route = live_route("6.17.1", colab=True)
    assert route.route == "training thread" and "Colab" in route.why


@pytest.mark.parametrize("version", [None, "dev", "5.5.6"])
def test_a_kernel_not_known_here_sends_from_the_training_thread_too(version: str | None) -> None:
    assert live_route(version, colab=False).route == "training thread"


@pytest.mark.parametrize(("forced", "route"), [
    ("training-thread", "training thread"), ("sampler", "sampler"), (" Training-Thread ", "training thread"),
])
def test_the_environment_variable_chooses_whatever_the_kernel(forced: str, route: str) -> None:
    for version, colab in (("7.4.0", False), (None, True)):
        chosen = live_route(version, colab, forced)
        assert chosen.route == route and ROUTE_VARIABLE in chosen.why


@pytest.mark.parametrize("forced", ["", "auto", "AUTO"])
def test_auto_or_unset_decides_from_the_kernel(forced: str) -> None:
    assert live_route("7.4.0", False, forced).route == "sampler"
    assert live_route("7.4.0", True, forced).route == "training thread"


def test_a_value_that_names_no_route_is_refused_with_the_names() -> None:
    with pytest.raises(ValueError, match="training-thread, auto"):
        live_route("7.4.0", False, "main")


class _Kernel:
    pass


class _OtherKernel:
    pass


def _modules(version: str, colab: bool = False) -> dict[str, object]:
    modules: dict[str, object] = {
        "ipykernel": types.SimpleNamespace(__version__=version),
        "ipykernel.kernelbase": types.SimpleNamespace(Kernel=_Kernel),
    }
    if colab:
        modules["google.colab"] = types.SimpleNamespace()
    return modules


def test_the_facts_are_read_from_the_kernel_object_and_the_loaded_modules() -> None:
    assert route_for_kernel(_Kernel(), _modules("7.0.0"), {}).why.startswith("ipykernel 7.0.0")
    assert route_for_kernel(_Kernel(), _modules("7.4.0", colab=True), {}).route == "training thread"
    # a kernel that is not ipykernel's (its version says nothing about it), or none at all
    assert route_for_kernel(_OtherKernel(), _modules("7.4.0"), {}).route == "training thread"
    assert route_for_kernel(None, {}, {}).route == "training thread"
    forced = {ROUTE_VARIABLE: "training-thread"}
    assert route_for_kernel(_Kernel(), _modules("7.4.0"), forced).route == "training thread"
