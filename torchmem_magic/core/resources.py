"""What the session measures, described once: each resource's column, names, limit and curve (stdlib only).

The timeline's columns (and with them the ranks' wire format and the flight record), the leak
detector's series, the guard's watched resources, the report table, the status line and both
figures read this table instead of naming resources themselves, so a new resource is one row here.
The wire format and the flight record write a row's values in the table's order, without names:
a new row goes at the end (older records, shorter, replay with NaN in its column), never between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: host memory of the kernel or its children, an accelerator's memory, the shared-memory filesystem, a count
Kind = Literal["host", "device", "shm", "count"]
#: what a resource runs out against: the OOM killer's limit, the device's size, the filesystem's size
Limit = Literal["ram", "device", "shm"]


@dataclass(frozen=True)
class Resource:
    """One measured quantity and how every reader treats it.

    Attributes:
        key: the detector's and the report's name for it ("ram", "vram_reserved").
        column: its timeline column (bytes, or a count for kind "count"); NaN where the source is absent.
        label: what users read in the legend and the report table ("RAM (process tree)").
        short: the status line's word for it ("RAM", "VRAM").
        kind: see `Kind`.
        summary: the report's key for its summary ("vram" for both VRAM columns); None: none. A key the
            report has no field of its own for gets the summary every resource has (start, end, peak,
            growth, limit).
        report_row: where its summary's row stands in the report's table (None: no row of its own).
        judged: the leak detector gets its step-aligned series.
        leak_rank: priority when several resources leak (lower first); None: evidence for the detector's
            notes only, never named as the leaking resource.
        reported_as: the resource a leak of it is reported as (None: itself).
        limit: what it runs out against (the detector's exhaustion point, the guard's limit).
        runs_out: the detector's words for what happens at its limit ("this kernel is OOM-killed").
        full_is_fatal: a reading at its limit means it ran out (a full tmpfs kills the DataLoader workers);
            not so for VRAM, which a caching allocator keeps near full by design.
        guard_name: the guard's name of it ("/dev/shm"); None: the guard does not watch it.
        stopped_before: the guard's words for what it stopped ("the OOM killer").
        colour: its curve's colour in both figures; None: no curve.
        saved_curve: the static (saved) figure draws it too, not only the live one.
        launcher_curve: the live figure keeps it while ranks train in the launcher's children (False:
            it measures the launcher alone, a flat line then).
        slow: read about once a second; a step sample carries the last background reading.
        sparse: judged from its first reading on, on the readings that changed (a slow source's
            carried values would make a steady rise a staircase, and its appearance is no growth).
    """

    key: str
    column: str
    label: str
    short: str
    kind: Kind
    summary: str | None = None
    report_row: int | None = None
    judged: bool = True
    leak_rank: int | None = None
    reported_as: str | None = None
    limit: Limit | None = None
    runs_out: str = "it runs out"
    full_is_fatal: bool = False
    guard_name: str | None = None
    stopped_before: str = "its limit"
    colour: str | None = None
    saved_curve: bool = True
    launcher_curve: bool = True
    slow: bool = False
    sparse: bool = False

    @property
    def reported(self) -> str:
        """The name a leak of it is reported under."""
        return self.reported_as or self.key


_OOM_KILLED = "this kernel is OOM-killed"

RAM = Resource(
    "ram", "ram_bytes", "RAM (process tree)", "RAM", "host", summary="ram", report_row=0, leak_rank=2, limit="ram",
    runs_out=_OOM_KILLED, guard_name="RAM", stopped_before="the OOM killer", colour="#1f77b4",
)  # kernel RSS + children (PSS where known)
RSS = Resource(
    "rss", "rss_bytes", "RSS (kernel)", "RSS", "host", limit="ram", colour="#9ecae1", saved_curve=False,
    launcher_curve=False,
)  # the kernel process alone
HEAP = Resource(
    "heap", "heap_bytes", "heap in use", "heap", "host", summary="heap", report_row=1, leak_rank=0, limit="ram",
    runs_out=_OOM_KILLED, colour="#2ca02c", launcher_curve=False,
)  # glibc mallinfo2 of the kernel process
WORKERS = Resource(
    "workers", "workers_bytes", "workers (PSS)", "workers", "host", summary="workers", limit="ram",
    colour="#8c564b", slow=True, sparse=True,
)  # the DataLoader workers' memory, PSS where known
WORKER_COUNT = Resource(
    "worker_count", "workers", "DataLoader workers", "workers", "count", summary="workers", report_row=4, judged=False, slow=True,
)  # worker processes alive
VRAM = Resource(
    "vram", "vram_allocated_bytes", "VRAM allocated", "VRAM", "device", summary="vram", report_row=2, leak_rank=1,
    limit="device", runs_out="CUDA runs out of memory", colour="#d62728",
)  # what the watched devices' tensors use, summed
VRAM_RESERVED = Resource(
    "vram_reserved", "vram_reserved_bytes", "VRAM reserved", "VRAM reserved", "device", summary="vram",
    reported_as="vram", limit="device", guard_name="VRAM", stopped_before="CUDA out of memory", colour="#ff9896",
)  # what their caching allocators hold
SHM = Resource(
    "shm", "shm_used_bytes", "/dev/shm used", "shm", "shm", summary="shm", report_row=3, leak_rank=3, limit="shm",
    runs_out="/dev/shm fills up (DataLoader workers die with a bus error)", full_is_fatal=True, guard_name="/dev/shm",
    stopped_before="a DataLoader worker's bus error", colour="#9467bd", slow=True,
)

#: every resource, in the order of the timeline's columns (and of the wire format's values: append only)
RESOURCES: tuple[Resource, ...] = (RAM, RSS, HEAP, WORKERS, WORKER_COUNT, VRAM, VRAM_RESERVED, SHM)


def by_key(key: str, table: tuple[Resource, ...] | None = None) -> Resource:
    """The resource named `key` (in `table`, else in `RESOURCES` as it is now); KeyError naming the known ones."""
    table = RESOURCES if table is None else table
    for resource in table:
        if resource.key == key:
            return resource
    raise KeyError(f"unknown resource {key!r}; known: {', '.join(r.key for r in table)}")


def report_rows() -> tuple[Resource, ...]:
    """The resources that have a row in the report's table, in its order."""
    return tuple(sorted((r for r in RESOURCES if r.report_row is not None), key=lambda r: r.report_row or 0))


def headline_rows() -> tuple[Resource, ...]:
    """The resources a run's (or a rank's) peak is told by, the first measured wins: an accelerator's
    memory where it used one, else RAM."""
    return (*(r for r in RESOURCES if r.kind == "device" and r.leak_rank is not None), RAM)


def leak_order(table: tuple[Resource, ...]) -> tuple[str, ...]:
    """The keys of the resources that can be the leaking one, the likeliest cause first."""
    ranked = [r for r in table if r.leak_rank is not None]
    return tuple(r.key for r in sorted(ranked, key=lambda r: r.leak_rank or 0))
