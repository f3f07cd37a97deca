"""The shared-memory filesystem DataLoader workers pass batches through (statvfs, ~2 µs)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..core.options import DEFAULT_SHM_PATH
from ..core.resources import SHM
from .base import NAN, Reading

@dataclass(frozen=True)
class ShmReading:
    used_bytes: int
    total_bytes: int


class ShmProbe:
    """Used and total bytes of the shared-memory filesystem (statvfs, ~2 µs).

    With torch's default `file_descriptor` strategy the segments are unlinked at once, so only
    the filesystem's counters see them, not a directory listing.
    """

    name: str = "shm"
    columns: tuple[str, ...] = (SHM.column,)

    #: how often `read` reads when `idle` (nothing fills it but other programs): each statvfs lets go of
    #: the GIL, and getting it back blocks the training thread once more (see probes/procfs)
    IDLE_PERIOD_S = 0.5

    def __init__(self, path: str = DEFAULT_SHM_PATH, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.available = os.path.isdir(path)
        self._clock = clock
        self._last: tuple[float, Reading] | None = None  # (when, what) the last read found
        self.idle = False  # set by the session while no DataLoader worker (what fills it) is alive

    def read(self) -> Reading:
        """The used bytes; while `idle`, read at most every IDLE_PERIOD_S (a statvfs lets go of the GIL,
        which then takes the sampler up to a switch interval to get back from a busy training thread)."""
        now = self._clock()
        if self.idle and self._last is not None and now - self._last[0] < self.IDLE_PERIOD_S:
            return dict(self._last[1])
        usage = self.usage()
        reading = {SHM.column: NAN if usage is None else float(usage.used_bytes)}
        self._last = (now, reading)
        return dict(reading)

    def close(self) -> None:
        pass

    def usage(self) -> ShmReading | None:
        """Used and total bytes now; None where the filesystem is missing or unreadable."""
        if not self.available:
            return None
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None
        return ShmReading((st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize)

    def torch_segments(self, pids: list[int]) -> int:
        """`torch_*` segments in use: files still in the directory (file_system strategy) plus
        unlinked ones the given processes still hold open (file_descriptor strategy unlinks at once)."""
        if not self.available:
            return 0
        try:
            named = {n for n in os.listdir(self.path) if n.startswith("torch_")}
        except OSError:
            named = set()
        held = set()
        prefix = os.path.join(self.path, "torch_")
        for pid in pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(prefix):
                    held.add(target.removesuffix(" (deleted)").rsplit("/", 1)[-1])
        return len(named | held)
