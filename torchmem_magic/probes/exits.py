"""When and how processes that are not our children end: a pidfd per process, watched by one thread.

A rank started by torchrun is its launcher's child, not the watcher's: `waitid` cannot read its
status, and the launcher reaps it within a tenth of a second, then stops the other ranks with
SIGTERM. Which rank died first, and of what, decides which rank a report blames, and the ranks'
streams cannot tell it: a quarter second apart, a dead rank's last message often comes after a
surviving one's. A pidfd becomes readable the moment its process ends; the thread here wakes
then, notes the time and reads the exit status from /proc while the process is still a zombie; on
a busy machine the launcher can reap it first, and then the pidfd itself still tells the status
(Linux 6.15 and later), once the reaping is done. Linux 5.3 and later; elsewhere nothing is seen and callers keep their other
witnesses.
"""

from __future__ import annotations

import os
import select
import struct
import threading
import time
from collections.abc import Callable

from ..analysis.forensics import WorkerExit

EXIT_CODE_FIELD = 49  # /proc/PID/stat's 52nd field (exit_code), counted after the ")" closing the name

# ioctl(pidfd, PIDFD_GET_INFO) with its first 64-byte struct pidfd_info: a u64 mask of what to fill
# (in) and what was filled (out) first; exit_code, in waitpid's form, is the s32 at byte 60
PIDFD_INFO_BYTES = 64
PIDFD_GET_INFO = (3 << 30) | (PIDFD_INFO_BYTES << 16) | (0xFF << 8) | 11  # _IOWR(0xFF, 11, 64 bytes)
PIDFD_INFO_EXIT = 1 << 3
PIDFD_INFO_EXIT_CODE_OFFSET = 60
REAPING_WAIT_S = 0.5  # the most one exit waits for its parent's reaping to end
REAPING_POLL_S = 0.001


def _from_wait_status(pid: int, status: int) -> WorkerExit:
    if status & 0x7F:
        return WorkerExit(pid, status & 0x7F, None)
    return WorkerExit(pid, None, (status >> 8) & 0xFF)


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat's fields after the name (the state first); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rpartition(b")")[2].split()
    except OSError:
        return None


def zombie_exit(pid: int) -> WorkerExit | None:
    """How `pid` ended while it is a zombie (its parent has not reaped it yet); None otherwise.

    The status is in waitpid's form; Linux shows it to the process's own user only (others read 0)."""
    fields = _stat_fields(pid)
    try:
        if fields is None or fields[0] != b"Z":
            return None
        status = int(fields[EXIT_CODE_FIELD])
    except (IndexError, ValueError):
        return None
    return _from_wait_status(pid, status)


def being_reaped(pid: int) -> bool:
    """Whether `pid` is in the moment between its parent's wait taking it (state X) and its release."""
    fields = _stat_fields(pid)
    return fields is not None and fields[:1] == [b"X"]


def pidfd_exit(pidfd: int, pid: int) -> WorkerExit | None:
    """How the process behind `pidfd` ended, also after its parent reaped it; None while it runs
    or where the kernel keeps no exit status on pidfds (before Linux 6.15)."""
    import fcntl  # POSIX only; pidfds are Linux's

    info = bytearray(PIDFD_INFO_BYTES)
    struct.pack_into("=Q", info, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, info, True)
    except OSError:
        return None
    if not struct.unpack_from("=Q", info, 0)[0] & PIDFD_INFO_EXIT:
        return None
    return _from_wait_status(pid, struct.unpack_from("=i", info, PIDFD_INFO_EXIT_CODE_OFFSET)[0])


def how_it_ended(pidfd: int, pid: int, wait_s: float = REAPING_WAIT_S) -> WorkerExit | None:
    """How the process behind a readable `pidfd` ended: read as a zombie, else from the pidfd.

    Its parent's wait marks it dead (state X) before the kernel releases it and stores the status
    on the pidfd: read in that moment, neither tells. Then it is read again until the release is
    done (microseconds, longer when the machine is busy), for at most `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        how = zombie_exit(pid) or pidfd_exit(pidfd, pid)
        if how is not None or time.monotonic() >= deadline:
            return how
        if not being_reaped(pid):
            return pidfd_exit(pidfd, pid)  # released now: stored, where the kernel keeps it
        time.sleep(REAPING_POLL_S)


class ExitWitness:
    """Sees watched processes end: when (on `clock`) and, if still readable, how.

    The thread starts with the first `watch` and sleeps in `select` until a process ends or
    `close` wakes it; `close` joins it and closes every descriptor."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pidfds: dict[int, int] = {}  # pidfd -> pid, while the process runs
        self._watched: set[int] = set()
        self._ended: dict[int, tuple[float, WorkerExit | None]] = {}
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # a pipe: written to make the thread look again
        self._closing = False
        self._owner_pid = os.getpid()

    @property
    def available(self) -> bool:
        return hasattr(os, "pidfd_open")

    def watch(self, pid: int) -> None:
        """Start watching `pid` (once; nothing happens where pidfds do not exist or `pid` is gone)."""
        if not self.available or self._closing or os.getpid() != self._owner_pid:
            return
        with self._lock:
            if pid in self._watched:
                return
            self._watched.add(pid)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return
        with self._lock:
            self._pidfds[pidfd] = pid
            if self._thread is None:
                self._wake = os.pipe()
                self._thread = threading.Thread(target=self._run, name="torchmem_magic-exits", daemon=True)
                self._thread.start()
                return
        self._poke()

    def ended(self, pid: int) -> tuple[float, WorkerExit | None] | None:
        """(when on `clock`, how or None if it could not be read) once `pid` has ended; else None."""
        with self._lock:
            return self._ended.get(pid)

    def _poke(self) -> None:
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"x")
            except OSError:
                pass

    def _run(self) -> None:
        assert self._wake is not None
        wake = self._wake[0]
        while True:
            with self._lock:
                pidfds = list(self._pidfds)
            try:
                ready, _, _ = select.select([wake, *pidfds], [], [])
            except OSError:
                return
            now_s = self._clock()
            if wake in ready:
                os.read(wake, 4096)
                if self._closing:
                    return
            for pidfd in ready:
                if pidfd == wake:
                    continue
                with self._lock:
                    pid = self._pidfds.pop(pidfd)
                how = how_it_ended(pidfd, pid)  # the launcher may be reaping it, or have reaped it
                with self._lock:
                    self._ended[pid] = (now_s, how)
                os.close(pidfd)

    def close(self) -> None:
        """Stop the thread and close every descriptor (in a forked child: close what it inherited)."""
        self._closing = True
        if os.getpid() == self._owner_pid:
            self._poke()
            if self._thread is not None:
                self._thread.join()
        with self._lock:
            pidfds, self._pidfds = list(self._pidfds), {}
            wake, self._wake = self._wake, None
        for fd in (*pidfds, *(wake or ())):
            try:
                os.close(fd)
            except OSError:
                pass
