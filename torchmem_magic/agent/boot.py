"""Arming a process of a watched command: nothing until torch is imported, nothing more until it trains.

`python -m torchmem_magic watch -- COMMAND` starts COMMAND with a bootstrap `sitecustomize` on
PYTHONPATH, so every Python process of it (torchrun's agent, each rank, helper scripts, spawned
DataLoader workers) calls `arm_from_environment()` at start-up. Most of them never train, so arming
only puts a finder on `sys.meta_path` that waits for `import torch` (torch is never imported here:
a process without torch costs one finder call per import). Once torch is in, the step clocks are
installed with a callback that, at the process's first step or loader pass, starts a `RankAgent`
adopting them. A DataLoader worker never becomes a rank: its hooks are removed at its first tick.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..stream.protocol import ENV_SINK

if TYPE_CHECKING:
    from ..tracing.hooks import LoaderPass, StepClock, TrainingHooks
    from .rank import RankAgent

#: "0" turns the ranks' leak finder off (`watch --no-scan`); they still stream their curves

_armed: TrainingHooks | None = None  # this process's hooks once torch is imported
_agent: RankAgent | None = None  # this process's agent once it trains


class TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when `torch` is about to load, wraps its loader so `on_loaded` runs
    right after torch's `__init__` has finished, then leaves `sys.meta_path`."""

    def __init__(self, on_loaded: Callable[[], None]) -> None:
        self._on_loaded = on_loaded

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        self.remove()
        spec = _spec_from_others(fullname, path, target)
        loader = getattr(spec, "loader", None)
        original = getattr(loader, "exec_module", None)
        if spec is None or original is None:
            return spec

        def exec_module(module: ModuleType) -> None:
            original(module)
            try:
                self._on_loaded()
            except Exception:
                pass  # watching must never break the user's import

        try:
            loader.exec_module = exec_module  # type: ignore[union-attr]  # this spec's own loader instance
        except (AttributeError, TypeError):
            return spec
        return spec

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def _spec_from_others(
    fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> importlib.machinery.ModuleSpec | None:
    """The spec the rest of `sys.meta_path` gives (what the import would have used without us)."""
    for finder in list(sys.meta_path):
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec: importlib.machinery.ModuleSpec | None = find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def arm_from_environment() -> bool:
    """At start-up of a watched command's process: arm it when the watcher's sink is in the
    environment (True), else do nothing (False)."""
    address = os.environ.get(ENV_SINK)
    if not address:
        return False
    if "torch" in sys.modules:  # imported before site ran (rare): arm now
        _install_hooks()
    else:
        sys.meta_path.insert(0, TorchImportWatcher(_install_hooks))
    return True


def _settings() -> Any:
    from .rank import script_roots, script_sources
    from ..core.options import MemwatchOptions
    from ..ranks.settings import RankSettings

    options = MemwatchOptions.from_environment(os.environ)
    return RankSettings(
        os.environ[ENV_SINK], options.interval_ms, roots=script_roots if options.scan else None,
        sources=script_sources(), scan=options.scan, guard=options.guard if options.guard is None else float(options.guard),
    )


def _install_hooks() -> None:
    """Torch is imported: install the step clocks, waiting for this process's first step."""
    global _armed
    if _armed is not None:
        return
    from ..tracing.hooks import TrainingHooks

    hooks = TrainingHooks(
        lambda clock: _first_activity(clock, None), lambda p: _first_activity(None, p), _forked_activity
    )
    hooks.install()
    _armed = hooks


def _is_dataloader_worker() -> bool:
    try:
        from torch.utils.data import get_worker_info

        return get_worker_info() is not None
    except Exception:
        return True  # cannot tell: stay out of the way


def _first_activity(clock: StepClock | None, loader_pass: LoaderPass | None) -> None:
    """The first step or loader pass of this process: it trains, so it is a rank from now on."""
    global _agent
    hooks = _armed
    if hooks is None or _agent is not None:
        return
    if _is_dataloader_worker():
        hooks.remove()
        return
    from .rank import RankAgent

    agent = RankAgent(_settings(), publish=True)
    _agent = agent
    agent.start(hooks)  # the session adopts the hooks: later steps are its own
    session = agent.session
    if session is None:
        return
    if clock is not None:
        session.tick(clock)
    if loader_pass is not None:
        session.pass_started(loader_pass)


def _forked_activity(hooks: TrainingHooks, clock: StepClock | None) -> None:
    """A process forked from this one before it trained (`start_method="fork"`) trains: a rank too."""
    from .rank import adopt_forked

    adopt_forked(_settings(), hooks, clock)
