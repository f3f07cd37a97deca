"""Where flight records live and whose they are (stdlib only).

Per user, in the platform's cache directory: `$XDG_CACHE_HOME/torchmem_magic/flight` (by default
`~/.cache/torchmem_magic/flight`) on Linux, `~/Library/Caches/torchmem_magic/flight` on macOS,
`%LOCALAPPDATA%\\torchmem_magic\\Cache\\flight` on Windows; `TORCHMEM_MAGIC_RECORD_DIR` overrides it.
A cache directory, not the runtime one: that is a RAM-backed tmpfs on most Linux systems, so writing
there would spend the very memory that runs out, and it is emptied at logout.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

ENV_RECORD_DIR = "TORCHMEM_MAGIC_RECORD_DIR"
SUFFIX = ".jsonl"
SHOWN_SUFFIX = ".shown.jsonl"  # a record the first `%load_ext` of a later kernel has shown once


def records_dir() -> Path:
    override = os.environ.get(ENV_RECORD_DIR)
    if override:
        return Path(override)
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "torchmem_magic" / "Cache"
        return base / "flight"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "torchmem_magic" / "flight"


def notebook_identity() -> str:
    """What a restarted kernel of the same notebook has in common with the dead one: the notebook's
    path (Jupyter's server tells its kernels in JPY_SESSION_NAME), else the working directory."""
    return os.environ.get("JPY_SESSION_NAME") or f"cwd:{os.getcwd()}"


def identity_key(identity: str) -> str:
    return hashlib.sha1(identity.encode()).hexdigest()[:12]


def process_start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, from /proc): a pid the system reused for another
    process after a death has another start time. None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rpartition(b")")[2].split()
        return int(fields[19])  # field 22 of the line; 20 after the ")" that ends the command name
    except (OSError, IndexError, ValueError):
        return None


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether the process that wrote a record still runs (the same pid and the same start time)."""
    now = process_start_ticks(pid)
    if now is not None:
        return start_ticks is None or now == start_ticks
    if sys.platform.startswith("linux"):
        return False  # no /proc entry: gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
