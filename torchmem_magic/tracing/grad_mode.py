"""Autograd's grad mode after a Ctrl-C that cut into torch's optimizer step.

`Optimizer.step` runs with grad mode off and puts the caller's mode back in a `finally`; a
KeyboardInterrupt that lands inside that `finally` (it calls Python code, where a SIGINT handler can
run) leaves grad mode off for the rest of the process: every later `backward()` in the notebook fails
with "element 0 of tensors does not require grad". The session notes the mode when it starts and, when
its block ended that way, puts it back.
"""

from __future__ import annotations

from types import TracebackType

#: the function of torch.optim.optimizer that sets grad mode around a step
STEP_WRAPPER = "_use_grad"


def _passed_step_wrapper(traceback: TracebackType | None) -> bool:
    while traceback is not None:
        code = traceback.tb_frame.f_code
        if code.co_name == STEP_WRAPPER and "optim" in code.co_filename:
            return True
        traceback = traceback.tb_next
    return False


def grad_enabled() -> bool:
    import torch  # here: the session's module loads without torch (`last_report()`)

    return bool(torch.is_grad_enabled())


def restore_after_cut_step(exc: BaseException | None, enabled_at_start: bool) -> bool:
    """Put grad mode back to `enabled_at_start` when `exc` is a KeyboardInterrupt raised inside the
    optimizer's step wrapper and the mode differs now; whether it did."""
    import torch

    if not isinstance(exc, KeyboardInterrupt) or torch.is_grad_enabled() == enabled_at_start:
        return False
    if not _passed_step_wrapper(exc.__traceback__):
        return False
    torch.set_grad_enabled(enabled_at_start)
    return True
