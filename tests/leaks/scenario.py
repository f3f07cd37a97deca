"""One cell of the nothing-kept matrix, run in a fresh process: `python scenario.py FRONT TORCH ENDING`.

FRONT: memwatch | gate | mark | lightning | transformers (how the user watches the loop);
TORCH: cold (the process's first optimizer step runs in the watched block) | warm (one step before it);
ENDING: ok | error | interrupt (a real SIGINT) | stop (the Stop button's request) | guard (MemoryGuardError).

The user's training function holds a 16 MiB local. After the run ends, however it ends, and the user
has let go of what they hold (`del`, `gc.collect()`), the script prints one JSON line: whether the session
and that local are still alive, again after `release_last_exception()`, and what the run left behind
(hooks, threads, file descriptors, the environment, what fd 2 points at)."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import weakref
from typing import Any

import torch
from left_behind import changes, snapshot

MIB = 1 << 20
STEPS, END_AT = 60, 30
refs: dict[str, weakref.ref[Any]] = {}
held: list[Any] = []  # the session, held by the user until they are done with its report
kept: list[torch.Tensor] = []  # what a guard run leaks: dropped by the user after it


def _note_session() -> None:
    from torchmem_magic.session.run import active_session

    session = active_session()
    if session is not None and "session" not in refs:
        refs["session"] = weakref.ref(session)
        held.append(session)  # as `with memwatch() as w` keeps `w`, or a callback its report


def end_step(ending: str, step: int) -> None:
    """At each step: note the session; at END_AT, end the run the way `ending` says."""
    _note_session()
    if ending == "guard":
        kept.append(torch.ones(5 * MIB // 4))  # written: resident
    if step != END_AT:
        return
    if ending == "error":
        raise ValueError("the user's own error")
    if ending == "interrupt":
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: the interrupt lands wherever the loop is
    if ending == "stop":
        from torchmem_magic.session.run import active_session

        session = active_session()
        assert session is not None
        session.requests.request_stop()  # what the Stop button asks: StopTraining at the next step


def train(ending: str) -> None:
    """A plain optimizer loop with a big local of its own."""
    big = torch.zeros(16 * MIB // 4)
    refs["big"] = weakref.ref(big)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = STEPS if ending != "guard" else 10_000
    for step in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        end_step(ending, step)


def guard_for(ending: str) -> float | None:
    """The guard's fraction for a guard run, with a RAM limit whose 90% lies 150 MiB above what the process
    uses now: set as the watch starts, after the front end's imports and set-up (a cold Lightning import
    alone can use more than that)."""
    if ending != "guard":
        return None
    import psutil

    from torchmem_magic.probes.limits import RAM_LIMIT_VARIABLE

    os.environ[RAM_LIMIT_VARIABLE] = str(int((psutil.Process().memory_info().rss + 150 * MIB) / 0.9))
    return 0.9


def run_bare(ending: str) -> None:
    """The same loop unwatched: what torch itself changes in the process (its first step sets
    TORCHINDUCTOR_CACHE_DIR) is not the watcher's doing."""
    train(ending)


def run_memwatch(ending: str) -> None:
    from torchmem_magic import memwatch

    with memwatch(20, quiet=True, guard=guard_for(ending)):
        train(ending)


def run_gate(ending: str) -> None:
    from torchmem_magic import assert_no_leak

    with assert_no_leak(20, quiet=True, guard=guard_for(ending)):
        train(ending)


def run_mark(ending: str) -> None:
    import tempfile

    import pytest

    folder = tempfile.mkdtemp()
    guard = f", guard={guard_for(ending)}" if ending == "guard" else ""
    with open(os.path.join(folder, "test_user.py"), "w") as test_file:
        test_file.write(
            "import pytest\nimport scenario\n\n"
            f"@pytest.mark.no_leak(interval_ms=20{guard})\n"
            f"def test_train():\n    scenario.train({ending!r})\n"
        )
    pytest.main([folder, "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-W", "ignore"])


def run_lightning(ending: str) -> None:
    import lightning.pytorch as pl

    from torchmem_magic.integrations.lightning import MemwatchCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            end_step(ending, self.global_step)
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=4)
    big = torch.zeros(16 * MIB // 4)
    refs["big"] = weakref.ref(big)
    trainer = pl.Trainer(
        max_steps=STEPS if ending != "guard" else 10_000, max_epochs=-1, accelerator="cpu", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[MemwatchCallback(interval_ms=20, quiet=True, guard=guard_for(ending))],
    )
    trainer.fit(Module(), data)


def run_transformers(ending: str) -> None:
    import tempfile

    import transformers

    from torchmem_magic.integrations.transformers import MemwatchCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.calls = 0

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            end_step(ending, self.calls)
            self.calls += 1
            return {"loss": self.layer(x).pow(2).mean()}

    class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"x": torch.randn(8)}

    big = torch.zeros(16 * MIB // 4)
    refs["big"] = weakref.ref(big)
    arguments = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(), max_steps=STEPS if ending != "guard" else 10_000, per_device_train_batch_size=4,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, logging_strategy="no",
        dataloader_num_workers=0,
    )
    callback = MemwatchCallback(interval_ms=20, quiet=True, guard=guard_for(ending))
    transformers.Trainer(model=Model(), args=arguments, train_dataset=Data(), callbacks=[callback]).train()


def _session_ended_within(timeout_s: float) -> float | None:
    """Seconds until no session is active and no thread of ours runs (a failed transformers run is ended by
    the sampler thread once `Trainer.train` has returned); None when that did not come within `timeout_s`."""
    import time

    from torchmem_magic.session.run import active_session

    started_s = time.monotonic()
    while time.monotonic() - started_s < timeout_s:
        if active_session() is None and not snapshot()["threads"]:
            return time.monotonic() - started_s
        time.sleep(0.01)
    return None


def main(front: str, torch_state: str, ending: str) -> dict[str, Any]:
    if torch_state == "warm":
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        del model, optimizer
    import torchmem_magic
    from torchmem_magic.tracing.hooks import installed_hook_count

    before = snapshot()
    ended = "ok"
    try:
        globals()[f"run_{front}"](ending)
    except BaseException as exc:  # whatever ended it: the user's handler lets go of it
        ended = type(exc).__name__
    ended_s = _session_ended_within(20.0)
    kept.clear()
    if ending == "guard":
        from torchmem_magic.probes.limits import RAM_LIMIT_VARIABLE

        os.environ.pop(RAM_LIMIT_VARIABLE, None)
    gc.collect()
    big_while_held = refs["big"]() is not None  # the user still holds the session: what it keeps of theirs
    held.clear()
    gc.collect()
    gc.collect()
    alive = {name: ref() is not None for name, ref in refs.items()}
    torchmem_magic.release_last_exception()
    gc.collect()
    after = snapshot()
    return {
        "ended": ended, "ended_s": ended_s, "big_while_held": big_while_held, "alive": alive, "alive_after_release": {name: ref() is not None for name, ref in refs.items()},
        "report": None if torchmem_magic.last_report() is None else torchmem_magic.last_report().status,  # type: ignore[union-attr]
        "hooks": installed_hook_count(), **changes(before, after),
    }


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.modules.setdefault("scenario", sys.modules["__main__"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_num_threads(1)
    print(json.dumps(main(*sys.argv[1:4])))
