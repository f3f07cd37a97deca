"""Step and epoch markers without touching user code.

* every optimizer step: torch's global optimizer step post-hook (all optimizers, also ones created
  before the hook; an optimizer that never calls `Optimizer.__init__` is missed);
* every epoch: a class-level wrap of `DataLoader.__iter__` (fires once per new iterator, also with
  persistent workers and subclasses), which also reports the worker PIDs.

`TrainingHooks` is a context manager that always removes what it installed. Callbacks run inside
the user's training loop, so their exceptions are counted, never raised into it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .forensics import parse_worker_death
from .probes.base import ErrorCount


def _length(iterator: Any) -> int | None:
    """Batches in this pass (None for iterable-style datasets without a length)."""
    try:
        return int(len(iterator))
    except Exception:
        return None


def _workers(iterator: Any) -> list[tuple[int, Any]]:
    """(pid, multiprocessing.Process) of a multi-process iterator's workers (its Process object keeps
    the exit code once multiprocessing has reaped the worker)."""
    workers = []
    for worker in getattr(iterator, "_workers", None) or ():
        pid = getattr(worker, "pid", None)
        if isinstance(pid, int):
            workers.append((pid, worker))
    return workers


class TrainingHooks:
    """Installs the step and epoch hooks; `remove()` (or leaving the `with`) restores everything."""

    def __init__(
        self, on_step: Callable[[], None], on_epoch: Callable[[list[tuple[int, Any]], int | None], None]
    ) -> None:
        self._on_step = on_step
        self._on_epoch = on_epoch
        self._step_handle: Any = None
        self._original_iter: Any = None
        self._wrapped_iter: Any = None
        self.active = False
        self.errors = ErrorCount("step/epoch hooks")

    def absorb_error(self, exc: Exception) -> None:
        """Count a failure of our own callback, so it never breaks the user's loop. Except a worker
        death: torch's SIGCHLD handler raises it into whatever runs, our callbacks included, and it
        is the user's error."""
        if parse_worker_death(str(exc)) is not None:
            raise exc
        self.errors.record(exc)

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        if not self.active:
            return
        try:
            fn(*args)
        except Exception as exc:  # KeyboardInterrupt still propagates
            self.absorb_error(exc)

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.utils.data import DataLoader

        if self.active:
            raise RuntimeError("hooks are already installed")
        self.active = True

        on_step = self._on_step

        def step_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            if self.active:  # inlined rather than _guarded(): this runs on every step
                try:
                    on_step()
                except Exception as exc:
                    self.absorb_error(exc)

        self._step_handle = register_optimizer_step_post_hook(step_hook)

        original = DataLoader.__dict__["__iter__"]
        hooks = self

        @functools.wraps(original)
        def __iter__(loader: Any) -> Any:
            iterator = original(loader)
            hooks._guarded(hooks._on_epoch, _workers(iterator), _length(iterator))
            return iterator

        __iter__.__torchmem_magic_wrapper__ = True  # type: ignore[attr-defined]
        self._original_iter, self._wrapped_iter = original, __iter__
        DataLoader.__iter__ = __iter__  # type: ignore[method-assign]

    def remove(self) -> None:
        """Idempotent. If someone wrapped our wrapper meanwhile, ours stays but turns inert."""
        self.active = False
        if self._step_handle is not None:
            self._step_handle.remove()
            self._step_handle = None
        if self._wrapped_iter is not None:
            from torch.utils.data import DataLoader

            if DataLoader.__dict__.get("__iter__") is self._wrapped_iter:
                DataLoader.__iter__ = self._original_iter  # type: ignore[method-assign]
            self._original_iter = self._wrapped_iter = None

    def __enter__(self) -> TrainingHooks:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def installed_hook_count() -> int:
    """How many torchmem_magic hooks/patches are live in torch now (tests pin this to 0)."""
    from torch.optim.optimizer import _global_optimizer_post_hooks
    from torch.utils.data import DataLoader

    ours = sum(1 for hook in _global_optimizer_post_hooks.values() if "TrainingHooks" in getattr(hook, "__qualname__", ""))
    return ours + int(getattr(DataLoader.__dict__["__iter__"], "__torchmem_magic_wrapper__", False))
