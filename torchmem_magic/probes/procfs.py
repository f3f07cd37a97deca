"""Small /proc reads that keep the GIL.

`os.pread`, `open().read()` and friends let go of the GIL around their system call. For a read of a
few hundred bytes from /proc (~2 µs) that costs more than it saves: the training thread, which holds
the GIL most of the time, takes it meanwhile, and the sampler thread then waits for it to come back
(until the training thread's next torch call lets go of it, or a switch interval). Each such handoff
blocks the training thread once more, and on a loaded machine a blocked thread waits for a free core
before it runs again: the sampler's readings cost the loop far more than their own CPU. Calling libc
through `ctypes.PyDLL` keeps the GIL for the call's ~2 µs. Where that is unavailable (no libc found),
the plain `os` calls are used.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

_O_RDONLY_CLOEXEC = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


@functools.cache
def _libc() -> Any | None:
    """libc's open/pread/close through PyDLL (the GIL kept), or None."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        pread, open_, close = libc.pread, libc.open, libc.close
    except (OSError, AttributeError):
        return None
    pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
    pread.restype = ctypes.c_ssize_t
    open_.argtypes = [ctypes.c_char_p, ctypes.c_int]
    open_.restype = ctypes.c_int
    close.argtypes = [ctypes.c_int]
    close.restype = ctypes.c_int
    return libc


class ProcReader:
    """Reads of up to `size_bytes` from the start of kept-open or named /proc files, the GIL kept.
    Each read has a buffer of its own: the training thread and the sampler thread share readers."""

    def __init__(self, size_bytes: int = 4096) -> None:
        self.size_bytes = size_bytes  # libc is looked up at the first read (nothing is done at import)

    def read_fd(self, fd: int) -> bytes:
        """What `os.pread(fd, size_bytes, 0)` returns; OSError like it."""
        libc = _libc()
        if libc is None:
            return os.pread(fd, self.size_bytes, 0)
        buffer = ctypes.create_string_buffer(self.size_bytes)
        count = libc.pread(fd, buffer, self.size_bytes, 0)
        if count < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
        return buffer.raw[:count]

    def read_path(self, path: str) -> bytes:
        """The start of the file at `path` (opened, read, closed); OSError when it cannot be read."""
        libc = _libc()
        if libc is None:
            with open(path, "rb") as file:
                return file.read(self.size_bytes)
        fd = libc.open(os.fsencode(path), _O_RDONLY_CLOEXEC)
        if fd < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno), path)
        try:
            return self.read_fd(fd)
        finally:
            libc.close(fd)
