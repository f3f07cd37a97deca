"""How many processes the kernel's OOM killer has killed, system-wide and in this process's cgroups: the
count rising while a run went silent says the OOM killer ended it."""

from __future__ import annotations

from pathlib import Path


def oom_kill_counts() -> dict[str, int]:
    """How many processes the kernel's OOM killer has killed: on the whole system (/proc/vmstat) and
    in each cgroup (v2) this process belongs to, from its own up to the root (`memory.events`)."""
    counts: dict[str, int] = {}
    try:
        with open("/proc/vmstat", encoding="ascii") as file:
            for line in file:
                if line.startswith("oom_kill "):
                    counts["system"] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as file:
            groups = [line.strip().split(":", 2) for line in file]
    except OSError:
        groups = []
    for _, controllers, path in (g for g in groups if len(g) == 3):
        if controllers == "":  # v2: the kills under each level are in its memory.events
            base, name = Path("/sys/fs/cgroup"), "memory.events"
        elif "memory" in controllers.split(","):  # v1: in memory.oom_control (Linux 4.13+)
            base, name = Path("/sys/fs/cgroup/memory"), "memory.oom_control"
        else:
            continue
        group = Path(path)
        for level in [group, *group.parents]:
            source = base / str(level).lstrip("/") / name
            try:
                for line in source.read_text(encoding="ascii").splitlines():
                    if line.startswith("oom_kill "):
                        counts[f"cgroup:{source.parent}"] = int(line.split()[1])
            except (OSError, ValueError):
                continue
    return counts
