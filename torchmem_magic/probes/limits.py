"""Limits that decide when a run dies: the RAM the OOM killer allows, torch's sharing strategy."""

from __future__ import annotations

import os
import re
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
    source: str  # "cgroup v2", "cgroup v1", "system" or "TORCHMEM_MAGIC_RAM_LIMIT"


#: the RAM limit to use instead of the cgroup's or the system's: a container whose cgroup limit is not
#: visible from inside, or a test that needs a limit just above what the process uses
RAM_LIMIT_VARIABLE = "TORCHMEM_MAGIC_RAM_LIMIT"


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
    """The RAM limit the OOM killer enforces for this process: the tightest cgroup limit, else RAM;
    `TORCHMEM_MAGIC_RAM_LIMIT` when set (ValueError when it is not a size)."""
    stated = os.environ.get(RAM_LIMIT_VARIABLE, "").strip()
    if stated:
        limit_bytes = parse_size(stated)
        if limit_bytes is None:
            raise ValueError(
                f"{RAM_LIMIT_VARIABLE}={stated!r} is not a size: give bytes, or a number with a unit like 2GiB or 512MiB"
            )
        return MemoryLimit(limit_bytes, RAM_LIMIT_VARIABLE)
    system = MemoryLimit(int(psutil.virtual_memory().total), "system")
    cgroup = _cgroup_limit(Path(proc_root), Path(sys_root))
    return cgroup if cgroup is not None and cgroup.limit_bytes < system.limit_bytes else system



_SIZE = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-z]*)", re.IGNORECASE)
#: binary units, and bare initials as `docker -m` reads them; kB, MB, GB, TB are decimal
_UNIT_BYTES = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}


def parse_size(text: str) -> int | None:
    """'2GiB' -> 2147483648, '512 MiB', '1.5G', '4000000000'; None when it is not a positive size."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        return None
    unit = _UNIT_BYTES.get(match["unit"].lower())
    if unit is None:
        return None
    size = int(float(match["number"]) * unit)
    return size if size > 0 else None
