"""Step clocks and epoch markers without touching user code.

Every loop has some notion of a step; these hooks see four, in order of preference:

* optimizer steps: torch's global optimizer step post-hook (every optimizer that calls
  `Optimizer.__init__`, also ones created before the hook);
* backward passes: a wrap of `torch.autograd._engine_run_backward`, which `loss.backward()`,
  `torch.autograd.backward` and `torch.autograd.grad` all go through;
* DataLoader batches: a class-level wrap of the loader iterators' `__next__`;
* forward calls of the outermost `nn.Module`: global forward hooks that count a call only when no
  other module's forward is running. They slow every module call a little, so they are removed as
  soon as a backward pass or an optimizer step shows a better clock.

Compiled code never sees a hook do anything. Every hook returns at once while dynamo traces it
(`torch.compiler.is_compiling()` is a constant there: no graph break, no guard), so a compiled
optimizer step counts as a backward pass instead. The forward hooks are never present where
compiled code runs: dynamo reads the number of global module hooks into its guards (adding or
removing them would recompile the user's model at each watched cell) and a compiled module warns
when called beside them. So they are not installed once `torch.compile` has been used in the
process, and a `torch.compile` called during the run removes them before it compiles anything.

A class-level wrap of `DataLoader.__iter__` marks each pass of a loader (an epoch, once the session
knows which loader carries the steps) and reports the worker processes.

The hooks live in torch's global tables and classes, so a process forked while they are installed
has them too: a step there is handed to `on_foreign_process` (which may watch that process as a
rank and `adopt` the hooks), never counted as the watcher's own.

`TrainingHooks` always removes what it installed. Callbacks run inside the user's loop, so their
exceptions are counted, never raised into it, except a DataLoader worker's death (the user's error).

Each hook leans on one torch internal that a torch release may rename or drop. One that is missing
costs only what it counts: `install()` notes it in `missing`, says so on stderr in one line (once per
process for each internal), and installs the rest; every other clock and every curve keeps working.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..analysis.forensics import parse_worker_death
from ..probes.base import ErrorCount
from ..core.step_requests import RaisedAtStep
from .dynamo import compiling_check, dynamo_has_compiled, never_compiling
from .forks import this_process

StepClock = Literal["optimizer", "backward", "batch", "forward"]
WRAPPER_MARK = "__torchmem_magic_wrapper__"


@dataclass(frozen=True)
class LoaderPass:
    """A new iterator over a DataLoader: one pass of it (an epoch when it is the training loader)."""

    loader: int  # the loader's number in this run (1, 2, ...): train and validation loaders differ
    workers: list[tuple[int, Any]]  # (pid, multiprocessing.Process) of its worker processes
    batches: int | None  # batches in the pass (None for iterable datasets without a length)


@dataclass(frozen=True)
class MissingInternal:
    """A torch internal a hook needs that this torch does not have, and what goes uncounted without it."""

    name: str  # e.g. "torch.autograd._engine_run_backward"
    uncounted: str  # e.g. "backward passes"


_announced: set[str] = set()  # the internals already said missing in this process


#: `torch.compiler.is_compiling` once hooks were installed (no torch import before): a module global, so
#: a traced hook's guard on it holds from one watched cell to the next
_is_compiling: Callable[[], bool] = never_compiling


def announce_missing(missing: list[MissingInternal]) -> None:
    """One stderr line naming the internals not seen before in this process and what they cost."""
    new = [m for m in missing if m.name not in _announced]
    if not new:
        return
    _announced.update(m.name for m in new)
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", "?")
    names = ", ".join(m.name for m in new)
    uncounted = ", ".join(dict.fromkeys(m.uncounted for m in new))
    print(
        f"torchmem_magic: this torch ({version}) has no {names}: {uncounted} are not counted; "
        "the other step clocks and every memory curve still work",
        file=sys.stderr,
    )


def _length(iterator: Any) -> int | None:
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


class _Patch:
    """One attribute replaced by a wrapper, put back on removal. If someone wrapped our wrapper
    meanwhile, theirs stays and ours turns inert (the wrapper checks `TrainingHooks.active`)."""

    def __init__(self, owner: Any, name: str, make_wrapper: Callable[[Any], Callable[..., Any]]) -> None:
        self.owner, self.name = owner, name
        self.original = owner.__dict__[name]
        self.wrapper = functools.wraps(self.original)(make_wrapper(self.original))
        setattr(self.wrapper, WRAPPER_MARK, True)
        setattr(owner, name, self.wrapper)

    def remove(self) -> None:
        if self.owner.__dict__.get(self.name) is self.wrapper:
            setattr(self.owner, self.name, self.original)


class TrainingHooks:
    """Installs the clock and epoch hooks; `remove()` (or leaving the `with`) restores everything.

    Args:
        on_tick: called after each step of any clock, on the thread that made it.
        on_pass: called when a DataLoader pass starts.
        on_foreign_process: called with (these hooks, the clock or None for a loader pass) when they
            fire in a process forked from the one that installed them.
    """

    def __init__(
        self,
        on_tick: Callable[[StepClock], None],
        on_pass: Callable[[LoaderPass], None],
        on_foreign_process: Callable[[TrainingHooks, StepClock | None], None] | None = None,
    ) -> None:
        self._on_tick = on_tick
        self._on_pass = on_pass
        self.on_foreign_process = on_foreign_process
        self.pid = this_process.watch_forks()  # the process whose steps these hooks count
        self._handles: list[Any] = []
        self._forward_handles: list[Any] = []
        self._patches: list[_Patch] = []
        self._loader_numbers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._iterator_loaders: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._forward_state = threading.local()  # the outermost module whose forward runs, per thread
        self._backward_depth = 0  # backward passes running now (a reentrant checkpoint nests them)
        self.current_loader: int | None = None  # the loader whose iterator gave the last batch
        self.active = False
        self.errors = ErrorCount("step/epoch hooks")
        self.missing: list[MissingInternal] = []  # what this torch lacks, found by install()

    def absorb_error(self, exc: Exception) -> None:
        """Count a failure of our own callback, so it never breaks the user's loop. Except a worker
        death: torch's SIGCHLD handler raises it into whatever runs, our callbacks included, and it
        is the user's error; and what a step request raises into the loop on purpose (the memory guard)."""
        __tracebackhide__ = True
        if isinstance(exc, RaisedAtStep) or parse_worker_death(str(exc)) is not None:
            raise exc
        self.errors.record(exc)

    def _tick(self, clock: StepClock) -> None:
        """A step of `clock`: to this process's session, or to a forked process's watcher. The optimizer
        and backward hooks inline this body (they fire at every step of every loop: each Python frame
        less is ~0.1 µs of a step that may take 200 µs)."""
        __tracebackhide__ = True  # IPython hides this frame: what a step raises on purpose points at the user's line
        if not self.active:
            return
        try:
            if self.pid != this_process.pid:
                self._foreign(clock)
                return
            self._on_tick(clock)
        except Exception as exc:  # KeyboardInterrupt (the Stop button) still propagates
            self.absorb_error(exc)

    def _foreign(self, clock: StepClock | None) -> None:
        """A step or a loader pass in a forked process: its own watcher (if any) takes over."""
        handler = self.on_foreign_process
        if handler is None:
            self.active = False  # this process's copy: nobody watches it
            return
        handler(self, clock)

    def adopt(
        self,
        on_tick: Callable[[StepClock], None],
        on_pass: Callable[[LoaderPass], None],
        on_foreign_process: Callable[[TrainingHooks, StepClock | None], None] | None,
    ) -> None:
        """In a forked process: count this process's steps for its own session from now on."""
        self._on_tick, self._on_pass, self.on_foreign_process = on_tick, on_pass, on_foreign_process
        self.pid = this_process.watch_forks()
        self._forward_state = threading.local()
        self._backward_depth = 0

    # ------------------------------------------------------------------ install / remove
    def install(self) -> None:
        """Install every hook this torch allows; the missing ones are noted in `missing` and said once."""
        global _is_compiling
        if self.active:
            raise RuntimeError("hooks are already installed")
        self.active = True
        self.pid = this_process.watch_forks()
        _is_compiling = compiling_check()
        self.missing = []
        try:
            self._hook_or_note(
                "torch.optim.optimizer.register_optimizer_step_post_hook", "optimizer steps", self._install_optimizer_hook
            )
            self._hook_or_note(
                "torch.autograd._engine_run_backward", "backward passes",
                lambda: self._patch("torch.autograd", "_engine_run_backward", self._wrap_backward),
            )
            self._hook_or_note(
                "torch.utils.data.DataLoader.__iter__", "DataLoader passes (epochs) and workers",
                lambda: self._patch("torch.utils.data", "DataLoader", self._wrap_iter, attr="__iter__"),
            )
            self._hook_or_note(
                "torch.utils.data.dataloader._BaseDataLoaderIter.__next__", "DataLoader batches",
                lambda: self._patch("torch.utils.data.dataloader", "_BaseDataLoaderIter", self._wrap_next, attr="__next__"),
            )
            if not dynamo_has_compiled():
                self._hook_or_note(
                    "torch.nn.modules.module.register_module_forward_hook(always_call=)", "forward calls",
                    self._install_forward_hooks,
                )
            if self._forward_handles and callable(vars(sys.modules["torch"]).get("compile")):
                # a model compiled in the run must never be traced beside them
                self._patch("torch", "compile", self._wrap_compile)
        except BaseException:
            self.remove()
            raise
        announce_missing(self.missing)

    def _hook_or_note(self, name: str, uncounted: str, install: Callable[[], None]) -> None:
        """Run one hook's install; a torch without the internal it needs is noted, not an error."""
        try:
            install()
        except (ImportError, AttributeError, KeyError, TypeError, NameError):
            self.missing.append(MissingInternal(name, uncounted))

    def _install_optimizer_hook(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles.append(register_optimizer_step_post_hook(self._after_optimizer_step))

    def _patch(
        self, module: str, name: str, make_wrapper: Callable[[Any], Callable[..., Any]], attr: str | None = None
    ) -> None:
        """Wrap `module.name` (or the class `module.name`'s own `attr`)."""
        import importlib

        owner = importlib.import_module(module)
        if attr is not None:
            owner, name = getattr(owner, name), attr
        self._patches.append(_Patch(owner, name, make_wrapper))

    def _install_forward_hooks(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        pre = register_module_forward_pre_hook(self._before_forward)
        try:
            after = register_module_forward_hook(self._after_forward, always_call=True)
        except BaseException:
            pre.remove()
            raise
        self._forward_handles = [pre, after]

    def _remove_forward_hooks(self) -> None:
        for handle in self._forward_handles:
            handle.remove()
        self._forward_handles = []

    def remove(self) -> None:
        """Idempotent; restores every patched attribute and removes every hook."""
        self.active = False
        self._remove_forward_hooks()
        for handle in self._handles:
            handle.remove()
        for patch in reversed(self._patches):
            patch.remove()
        self._handles, self._patches = [], []

    def __enter__(self) -> TrainingHooks:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # ------------------------------------------------------------------ the clocks
    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """torch's global optimizer post-hook: `_tick("optimizer")`, inlined."""
        __tracebackhide__ = True
        if _is_compiling() or not self.active:
            return
        if self._forward_handles:
            self._remove_forward_hooks()
        try:
            if self.pid != this_process.pid:
                self._foreign("optimizer")
                return
            self._on_tick("optimizer")
        except Exception as exc:
            self.absorb_error(exc)

    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def run_backward(*args: Any, **kwargs: Any) -> Any:
            """The engine's backward, then `_tick("backward")`, inlined. A backward run inside another
            (a reentrant checkpoint's re-run forward and backward) is part of that one: not a step."""
            __tracebackhide__ = True
            if _is_compiling():
                return original(*args, **kwargs)
            self._backward_depth += 1
            try:
                result = original(*args, **kwargs)
            finally:
                self._backward_depth -= 1
            if self.active and not self._backward_depth:
                if self._forward_handles:
                    self._remove_forward_hooks()
                try:
                    if self.pid != this_process.pid:
                        self._foreign("backward")
                    else:
                        self._on_tick("backward")
                except Exception as exc:
                    self.absorb_error(exc)
            return result

        return run_backward

    def _before_forward(self, module: Any, args: Any) -> None:
        if _is_compiling():
            return
        local = self._forward_state
        if getattr(local, "outermost", None) is None:
            local.outermost = module

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        """Also runs when the forward raised. After a KeyboardInterrupt (which skips it) the stale
        outermost module is still the next outermost call, so the count heals itself."""
        __tracebackhide__ = True
        if _is_compiling():
            return
        local = self._forward_state
        if getattr(local, "outermost", None) is module:
            local.outermost = None
            self._tick("forward")

    def _wrap_compile(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def compile(*args: Any, **kwargs: Any) -> Any:
            """`torch.compile`, once the forward hooks are gone (for good: compiled code may run later)."""
            self._remove_forward_hooks()
            return original(*args, **kwargs)

        return compile

    # ------------------------------------------------------------------ DataLoader passes and batches
    def _wrap_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __iter__(loader: Any) -> Any:
            iterator = original(loader)
            if self.active and self.pid != this_process.pid:
                try:
                    self._foreign(None)
                except Exception as exc:
                    self.absorb_error(exc)
            if self.active and self.pid == this_process.pid:
                try:
                    number = self._loader_numbers.setdefault(loader, len(self._loader_numbers) + 1)
                    self._iterator_loaders[iterator] = number
                    self._on_pass(LoaderPass(number, _workers(iterator), _length(iterator)))
                except Exception as exc:
                    self.absorb_error(exc)
            return iterator

        return __iter__

    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __next__(iterator: Any) -> Any:
            __tracebackhide__ = True
            batch = original(iterator)
            if self.active:
                self.current_loader = self._iterator_loaders.get(iterator)
                self._tick("batch")
            return batch

        return __next__


def installed_hook_count() -> int:
    """How many torchmem_magic hooks/patches are live in torch now (tests pin this to 0); a table or
    class this torch lacks holds none."""
    import torch
    from torch.nn.modules import module
    from torch.optim import optimizer
    from torch.utils.data import dataloader

    tables = (
        getattr(optimizer, "_global_optimizer_post_hooks", None),
        getattr(module, "_global_forward_pre_hooks", None),
        getattr(module, "_global_forward_hooks", None),
    )
    hooks = [hook for table in tables if isinstance(table, dict) for hook in table.values()]
    ours = sum(1 for hook in hooks if getattr(hook, "__self__", None).__class__ is TrainingHooks)
    owners = (
        (torch, "compile"),
        (torch.autograd, "_engine_run_backward"),
        (getattr(dataloader, "DataLoader", None), "__iter__"),
        (getattr(dataloader, "_BaseDataLoaderIter", None), "__next__"),
    )
    patched = [getattr(owner, "__dict__", {}).get(name) for owner, name in owners]
    return ours + sum(1 for fn in patched if getattr(fn, WRAPPER_MARK, False))
