"""Limits that decide when a run dies: the RAM the OOM killer allows, torch's sharing strategy."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

def sharing_strategy() -> str | None:
    """torch.multiprocessing's current sharing strategy (only read, never set)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return str(torch.multiprocessing.get_sharing_strategy())
    except Exception:  # a broken/partial torch must not break the report
        return None


@dataclass(frozen=True)
class MemoryLimit:
    limit_bytes: int
    source: str  # "cgroup v2", "cgroup v1" or "system"


_UNLIMITED = 1 << 60  # cgroup v1 writes ~2^63 for "no limit"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return value if value < _UNLIMITED else None


def _cgroup_limit(proc_root: Path, sys_root: Path) -> MemoryLimit | None:
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    best: MemoryLimit | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2 unified hierarchy: walk from our group up to the root
            base, name, source = sys_root / "fs" / "cgroup", "memory.max", "cgroup v2"
        elif "memory" in controllers.split(","):
            base, name, source = sys_root / "fs" / "cgroup" / "memory", "memory.limit_in_bytes", "cgroup v1"
        else:
            continue
        group = Path(rel.lstrip("/"))
        for level in [group, *group.parents]:
            value = _read_int(base / level / name)
            if value is not None and (best is None or value < best.limit_bytes):
                best = MemoryLimit(value, source)
    return best


def memory_limit(proc_root: str = "/proc", sys_root: str = "/sys") -> MemoryLimit:
    """The RAM limit the OOM killer enforces for this process: the tightest cgroup limit, else RAM."""
    system = MemoryLimit(int(psutil.virtual_memory().total), "system")
    cgroup = _cgroup_limit(Path(proc_root), Path(sys_root))
    return cgroup if cgroup is not None and cgroup.limit_bytes < system.limit_bytes else system

