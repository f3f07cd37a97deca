"""Which thread sends the live figure's updates: the sampler thread, or the training thread at its
step boundaries, for the kernels where a widget message sent from a background thread does not reach
the page while the cell runs (or where that cannot be known).

Pure: it decides from facts the caller reads (the kernel object, the loaded modules, the environment).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Route = Literal["sampler", "training thread"]

#: the environment variable that chooses the route whatever the kernel: "sampler", "training-thread",
#: or "auto" (the default: decided from the kernel)
ROUTE_VARIABLE = "TORCHMEM_MAGIC_LIVE_UPDATES"
FORCED_ROUTES: dict[str, Route] = {"sampler": "sampler", "training-thread": "training thread"}


@dataclass(frozen=True)
class LiveRoute:
    """Where the live figure's updates are sent from, and why (one line a person can check)."""

    route: Route
    why: str


def live_route(ipykernel_version: str | None, colab: bool, forced: str = "") -> LiveRoute:
    """The route for a kernel: `ipykernel_version` None where the kernel is not ipykernel's (or its
    version is unknown); `colab` in Google Colab; `forced`: the value of ROUTE_VARIABLE, if set.

    Colab shows no widget update that a background thread sends. ipykernel 6 and 7 send a background
    thread's comm messages at once. ipykernel 7.0.0 and 7.0.1 look a message's parent up in the sending
    thread's context and fail where it has none; the sampler thread runs in a copy of the cell's context,
    so its updates go out at once there too (the kernel matrix runs 7.0.0 for that).
    Any other kernel: unknown, so the training thread sends them too.
    ValueError for a `forced` value that names no route.
    """
    choice = forced.strip().lower()
    if choice and choice != "auto":
        if choice not in FORCED_ROUTES:
            names = ", ".join([*FORCED_ROUTES, "auto"])
            raise ValueError(f"{ROUTE_VARIABLE}={forced!r} is not a route ({names})")
        return LiveRoute(FORCED_ROUTES[choice], f"{ROUTE_VARIABLE}={choice}")
    if colab:
        return LiveRoute("training thread", "Colab shows no widget update sent from a background thread")
    if ipykernel_version is None:
        return LiveRoute("training thread", "not an ipykernel kernel: background-thread updates may not reach the page")
    major = _major(ipykernel_version)
    if major is None or major < 6:
        return LiveRoute("training thread", f"ipykernel {ipykernel_version}: not a release tested here")
    return LiveRoute("sampler", f"ipykernel {ipykernel_version} sends the sampler thread's updates at once")


def route_for_kernel(kernel: object, modules: Mapping[str, object], environ: Mapping[str, str]) -> LiveRoute:
    """The route for `kernel` (an IPython shell's `kernel`), read from `modules` (sys.modules) and
    `environ` (os.environ): only what is already imported is looked at."""
    base = getattr(modules.get("ipykernel.kernelbase"), "Kernel", None)
    version = None
    if isinstance(base, type) and isinstance(kernel, base):
        found = getattr(modules.get("ipykernel"), "__version__", None)
        version = found if isinstance(found, str) else None
    return live_route(version, "google.colab" in modules, environ.get(ROUTE_VARIABLE, ""))


def _major(version: str) -> int | None:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None
