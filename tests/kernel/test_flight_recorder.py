"""A kernel SIGKILLed during a %%memwatch run, and what the next kernel of the same notebook is told."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_client import SETUP, Execution, Kernel

pytestmark = pytest.mark.kernel

LEAKING_RUN = (
    "%%memwatch\n"
    "for step in range(1_000_000):\n"
    "    loss = model(torch.randn(32, 64)).square().mean()\n"
    "    opt.zero_grad(); loss.backward(); opt.step()\n"
    "    kept.append(torch.ones(2**16))  # 256 KiB a step\n"
)
PREPARE = "kept = []\nmodel = torch.nn.Linear(64, 64); opt = torch.optim.SGD(model.parameters(), lr=0.01)"


@pytest.fixture
def notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A notebook's identity and a records directory of this test's own (the kernels inherit both)."""
    monkeypatch.setenv("TORCHMEM_MAGIC_RECORD_DIR", str(tmp_path / "records"))
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "train.ipynb"))
    return tmp_path


@pytest.fixture
def kernels() -> Iterator[list[Kernel]]:
    started: list[Kernel] = []
    yield started
    for k in started:
        k.shutdown()


def _start(kernels: list[Kernel], setup: str = SETUP) -> Kernel:
    k = Kernel()
    kernels.append(k)
    k.ok(setup)
    return k


def _kill_mid_run(kernels: list[Kernel], run_s: float = 3.0, signum: int = signal.SIGKILL) -> float:
    """Start the leaking run, send the kernel `signum` after `run_s`; when it was sent (wall clock)."""
    k = _start(kernels)
    k.ok(PREPARE)
    k.kc.execute(LEAKING_RUN)
    time.sleep(run_s)
    killed_at = time.time()
    os.kill(k.km.provisioner.process.pid, signum)  # type: ignore[union-attr]
    assert k.km.provisioner.process.wait(10) == -signum  # type: ignore[union-attr]  # it died of it
    return killed_at


def _shown(execution: Execution) -> str:
    displayed = "\n".join(m["content"]["data"].get("text/plain", "") for m in execution.of_type("display_data"))
    return execution.stdout + displayed


def test_the_next_kernel_shows_the_dead_run_once_with_its_last_second_and_holder(notebook: Path, kernels: list[Kernel]) -> None:
    killed_at = _kill_mid_run(kernels)
    records = list((notebook / "records").iterdir())
    assert len(records) == 1  # the run's record survived its kernel
    k = _start(kernels, "import torch")
    first = k.ok("%load_ext torchmem_magic\nimport torchmem_magic")
    shown = _shown(first)
    assert "the kernel of this notebook died while %%memwatch watched it" in shown
    assert "memwatch: killed" in shown and "kept" in shown and "the kernel died during this run" in shown
    html = "".join(m["content"]["data"].get("text/html", "") for m in first.of_type("display_data"))
    assert "<img" in html  # the static figure, as every report shows it
    info = k.value(
        "(lambda r, c: {'status': r.status, 'steps': r.steps, 'verdict': r.verdict, "
        "'holders': [s.name for s in r.suspects], 'died': c.died_wall_s, 'skipped': c.skipped_lines})"
        "(torchmem_magic.last_crash(), __import__('torchmem_magic.flight.crashes').flight.crashes.crash_records()[0])"
    )
    assert info["status"] == "killed" and info["verdict"] == "leak" and "kept" in info["holders"], info
    assert info["steps"] > 100 and info["skipped"] <= 1, info
    assert killed_at - info["died"] < 1.0, (killed_at, info)  # at most the last second is lost
    again = k.ok("%reload_ext torchmem_magic")
    assert "died while" not in _shown(again)  # shown once
    last = k.ok("%memwatch --last")
    assert "memwatch: killed" in _shown(last)  # asked for: shown again
    assert k.value("torchmem_magic.clear_crashes()") == 1 and k.value("torchmem_magic.last_crash() is None")
    assert list((notebook / "records").iterdir()) == []


def test_another_notebooks_record_is_shown_only_when_asked(notebook: Path, kernels: list[Kernel], monkeypatch: pytest.MonkeyPatch) -> None:
    _kill_mid_run(kernels, run_s=2.0)
    monkeypatch.setenv("JPY_SESSION_NAME", str(notebook / "eval.ipynb"))
    k = _start(kernels, "import torch")
    assert "died while" not in _shown(k.ok("%load_ext torchmem_magic\nimport torchmem_magic"))
    assert k.value("torchmem_magic.last_crash() is None")
    assert k.value("torchmem_magic.last_crash(all_notebooks=True).status") == "killed"


def test_runs_that_end_in_any_way_the_kernel_survives_leave_no_record(notebook: Path, kernels: list[Kernel]) -> None:
    k = _start(kernels)
    k.ok(PREPARE)
    k.ok(LEAKING_RUN.replace("1_000_000", "50"))
    failed = k.execute(LEAKING_RUN.replace("1_000_000", "50") + "    if step == 20: raise ValueError('boom')\n")
    interrupted = k.execute(LEAKING_RUN.replace("kept.append", "_ = "), interrupt_after_s=2.0)
    assert failed.error is not None, (failed.status, failed.stdout[-2000:])
    assert interrupted.error is not None, (interrupted.status, interrupted.stdout[-2000:], interrupted.stderr[-2000:])
    assert interrupted.error["ename"] == "KeyboardInterrupt"
    records = notebook / "records"
    assert not records.exists() or list(records.iterdir()) == []
    k.ok("%%memwatch --no-record\npass")
    assert "died while" not in _shown(k.ok("%reload_ext torchmem_magic"))


def _memory_cgroup(limit_bytes: int) -> tuple[Path, Path] | None:
    """A memory cgroup limited to `limit_bytes`: (the directory, the file its processes go in); None
    where this machine does not let us make one (not root, or no memory controller to delegate)."""
    name = f"torchmem-oom-test-{os.getpid()}"
    for base, limit_file in ((Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"), (Path("/sys/fs/cgroup"), "memory.max")):
        group = base / name
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            (group / limit_file).write_text(str(limit_bytes))
            return group, group / "cgroup.procs"
        except OSError:
            group.rmdir()
    return None


def test_a_real_oom_kill_is_told_as_the_oom_killer(notebook: Path, kernels: list[Kernel]) -> None:
    """The kernel in a memory cgroup of 400 MiB, leaking 256 KiB a step: the OOM killer ends it."""
    made = _memory_cgroup(400 << 20)
    if made is None:
        pytest.skip("cannot create a memory cgroup here (needs root and a memory controller)")
    group, procs = made
    try:
        k = _start(kernels)
        k.ok(PREPARE)
        procs.write_text(str(k.km.provisioner.process.pid))  # type: ignore[union-attr]
        k.kc.execute(LEAKING_RUN)
        k.km.provisioner.process.wait(120)  # type: ignore[union-attr]
        assert k.km.provisioner.process.returncode == -signal.SIGKILL  # type: ignore[union-attr]
    finally:
        time.sleep(0.5)
        group.rmdir()
    after = _start(kernels, "import torch")
    shown = _shown(after.ok("%load_ext torchmem_magic\nimport torchmem_magic"))
    assert "memwatch: killed" in shown and "kept" in shown, shown
    advice = after.value("list(torchmem_magic.last_crash().advice)")
    assert any(line.startswith("the OOM killer killed processes since the run began") for line in advice), advice
    assert not any("is OOM-killed in" in line for line in advice), advice


# `%load_ext` in a kernel whose notebook has a dead run's record, with the Ctrl-C landing while the record
# is shown: the report's display raises it, as a SIGINT would there
INTERRUPTED_DISPLAY = """\
import IPython.display as _tm_display
_tm_real_display = _tm_display.display
def _tm_interrupted_display(obj, **kw):
    if type(obj).__name__ == "Report":
        raise KeyboardInterrupt
    return _tm_real_display(obj, **kw)
_tm_display.display = _tm_interrupted_display
"""


def test_an_interrupt_while_load_ext_shows_a_dead_run_keeps_the_extension_and_the_record(
    notebook: Path, kernels: list[Kernel]
) -> None:
    _kill_mid_run(kernels, run_s=2.0)
    k = _start(kernels, "import torch\n" + INTERRUPTED_DISPLAY)
    loading = k.execute("%load_ext torchmem_magic")
    k.ok("import torchmem_magic.frontends.magics as _tm_m\n_tm_display.display = _tm_m.display = _tm_real_display")  # magics took it at import
    assert loading.status == "error" and loading.error is not None and loading.error["ename"] == "KeyboardInterrupt"
    assert "the extension is loaded, and %memwatch --last shows that record" in loading.stderr
    records = list((notebook / "records").iterdir())
    assert len(records) == 1 and not records[0].name.endswith(".shown.jsonl")  # not marked shown: it was not
    assert "memwatch: killed" in _shown(k.ok("%memwatch --last"))  # the magics are there
    assert k.ok("%%memwatch --no-plot\nx = 1").stdout.startswith("memwatch: ok")


def test_a_kernel_terminated_mid_run_dies_and_the_next_kernel_says_it_was_terminated(
    notebook: Path, kernels: list[Kernel]
) -> None:
    """SIGTERM is how Jupyter's shutdown ends a kernel that did not quit when asked."""
    terminated_at = _kill_mid_run(kernels, run_s=2.0, signum=signal.SIGTERM)
    k = _start(kernels, "import torch")
    shown = _shown(k.ok("%load_ext torchmem_magic\nimport torchmem_magic"))
    assert "the kernel was terminated (SIGTERM) during this run" in shown
    assert "stopped by its kernel's termination (SIGTERM)" in shown
    died = k.value("__import__('torchmem_magic.flight.crashes').flight.crashes.crash_records()[0].died_wall_s")
    assert abs(terminated_at - died) < 1.0
