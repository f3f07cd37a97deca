"""A client of a torchrun job's TCPStore that fails fast, quietly, and in one line.

torch's own client is the only one that speaks the store's protocol, but as a guest in someone
else's job it needs three guards. A store that refuses (nothing listens) makes it retry until its
timeout and print a C++ stack dump for each try, so a plain socket connect is tried first: refusal
costs a millisecond and prints nothing (the store's server takes such a probe without a word). A
server that accepts but is not a store makes its connect hang well past its timeout (measured: over
a minute with timeout=2 s; it lets go of the GIL meanwhile), so the connect runs on a daemon thread
that is abandoned at our own deadline. And once one operation failed (the store went away) no
other is tried: each failure prints torch's warning again. A reader that expects the store to go
(its job is ending) can have even that one warning kept off its stderr (`quiet`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

CONNECT_TIMEOUT_S = 2.0


class StoreUnavailable(Exception):
    """The store cannot be used; the message is one line that says why."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def _probe(host: str, port: int, timeout_s: float) -> None:
    """A plain TCP connect, closed at once: refusal and unreachable hosts end here, quietly."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise StoreUnavailable(f"the job's store at {host}:{port} cannot be reached ({exc.strerror or exc})") from None


def _torch_client(host: str, port: int, timeout_s: float) -> Any:
    """torch's client, connected on a daemon thread within `timeout_s` (else StoreUnavailable)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported from torch._C at run time

    made: list[Any] = []
    failed: list[BaseException] = []

    def connect() -> None:
        try:
            made.append(TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s),
                                 wait_for_workers=False))
        except Exception as exc:
            failed.append(exc)

    thread = threading.Thread(target=connect, name="torchmem_magic-store-connect", daemon=True)
    thread.start()
    thread.join(timeout_s + 0.5)
    if made:
        return made[0]
    why = _one_line(failed[0]) if failed else f"no answer within {timeout_s:g} s"
    raise StoreUnavailable(f"{host}:{port} does not answer as a c10d store ({why})")


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """File descriptor 2 points at /dev/null meanwhile: torch's C++ warnings go there, not Python's
    `sys.stderr`. Process-wide, so only for a process of our own (the watcher), around single calls."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class StoreClient:
    """Reads and writes keys of one store; after the first failure, every call raises at once.

    Used from one thread at a time (each user has its own client): torch serialises a client's
    calls anyway, and a call that blocks must hold up no one else."""

    def __init__(self, host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.address = f"{host}:{port}"
        _probe(host, port, timeout_s)
        self._store: Any = _torch_client(host, port, timeout_s)
        self._present: set[str] = set()  # keys seen once: they stay (overwritten, never deleted)
        self.problem: str | None = None
        self.quiet = False  # the store may go any moment (the job ends): its failure is no news

    def _call(self, method: str, *args: Any) -> Any:
        if self.problem is not None:
            raise StoreUnavailable(self.problem)
        try:
            if self.quiet:
                with stderr_silenced():
                    return getattr(self._store, method)(*args)
            return getattr(self._store, method)(*args)
        except Exception as exc:
            self.problem = f"the job's store at {self.address} went away ({_one_line(exc)})"
            raise StoreUnavailable(self.problem) from None

    def set(self, key: str, value: bytes) -> None:
        self._call("set", key, value)

    def append(self, key: str, value: bytes) -> None:
        self._call("append", key, value)

    def read(self, keys: list[str]) -> dict[str, bytes]:
        """The values of those of `keys` that exist, without waiting for the others (a get of a
        missing key blocks): one round trip per key not seen yet, then one for all the rest."""
        for key in keys:
            if key not in self._present and self._call("check", [key]):
                self._present.add(key)
        present = [k for k in keys if k in self._present]
        if not present:
            return {}
        values = self._call("multi_get", present)
        return dict(zip(present, (bytes(v) for v in values)))

    def close(self) -> None:
        self._store = None
        self.problem = self.problem or "closed"
