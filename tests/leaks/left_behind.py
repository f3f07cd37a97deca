"""What the fresh-process matrices share: a cell run in a fresh process, and what a run left in it (fds,
environment, fd 2, our threads), read before and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def snapshot() -> dict[str, Any]:
    """What a run could leave behind in this process, as it is now."""
    return {
        "fds": sorted(os.listdir("/proc/self/fd")),
        "environ": dict(os.environ),
        "stderr": tuple(os.fstat(2)[:2]),
        "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("torchmem_magic")),
    }


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What changed between two snapshots: new fds, changed variables, whether fd 2 is the same file, our threads."""
    return {
        "threads": after["threads"],
        "fds_left": sorted(set(after["fds"]) - set(before["fds"])),
        "environ_changed": sorted(k for k in {*before["environ"], *after["environ"]}
                                  if before["environ"].get(k) != after["environ"].get(k)),
        "stderr_same": before["stderr"] == after["stderr"],
    }


def run_cell(script: str, cell: tuple[str, ...]) -> dict[str, Any]:
    """One cell in a fresh process: its last JSON line and its stderr, or what it printed when it had none
    (under `failed_to_run`)."""
    done = subprocess.run([sys.executable, str(HERE / script), *cell], capture_output=True, text=True, timeout=300,
                          cwd=HERE, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    lines = done.stdout.strip().splitlines()
    try:
        return {**json.loads(lines[-1]), "stderr": done.stderr}
    except (IndexError, ValueError):
        return {"failed_to_run": f"exit {done.returncode}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"}
