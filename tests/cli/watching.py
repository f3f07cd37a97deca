"""What the command-line tests share: real `python -m torchmem_magic` processes, real torchrun."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torchmem_magic

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
PACKAGE_ROOT = Path(torchmem_magic.__file__).resolve().parents[1]


def environment(tmp: Path) -> dict[str, str]:
    """This checkout first on PYTHONPATH; a private TMPDIR, to see what a watch leaves there."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["TMPDIR"] = str(tmp)
    env.pop("TORCHMEM_MAGIC_SINK", None)
    return env


def torchrun() -> list[str]:
    found = Path(sys.executable).with_name("torchrun")
    return [str(found)] if found.exists() else [sys.executable, "-m", "torch.distributed.run"]


def watch_command(*args: str, save: Path | None = None, options: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "torchmem_magic", "watch", *options]
    if save is not None:
        cmd += ["--save", str(save)]
    return [*cmd, "--", *args]


def run(cmd: list[str], tmp: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=environment(tmp), capture_output=True, text=True, timeout=timeout_s)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def leftovers(tmp: Path) -> list[str]:
    """What a watch left in its TMPDIR (the sink's directory must be gone)."""
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("torchmem_magic"))


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def watch_until(
    cmd: list[str], env: dict[str, str], go: Path, ready: Callable[[], bool], poll_s: float = 0.2
) -> tuple[int, str, str]:
    """Run the watcher `cmd` while its command waits for the file `go`: `ready()` is asked every `poll_s`
    until it says the run showed what the test waits for, then `go` is created and the command goes on.
    (returncode, stdout, stderr); a four-minute guard against a hang, not a timing assumption."""
    watcher = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while watcher.poll() is None and time.monotonic() < deadline:
            if ready():
                go.touch()
                break
            time.sleep(poll_s)
        out, err = watcher.communicate(timeout=240)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    return watcher.returncode, out, err
