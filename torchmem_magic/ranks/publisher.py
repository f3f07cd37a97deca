"""A rank's writer to its job's store: its own thread, its own connection, never a wait for anyone.

The rank's sampler thread hands over the latest encoded summary (`offer`, a one-slot mailbox: an
older one not yet written is simply replaced); this thread connects (at most once) and writes it.
A store that cannot be reached, or goes away, ends the thread with one line in `problem`; the
rank's own watching goes on. No collective is involved: a rank that hangs only stops writing, and
its readers see its key go stale.
"""

from __future__ import annotations

import threading
import time

from .store_client import StoreClient, StoreUnavailable

FINAL_TIMEOUT_S = 2.0


class SummaryPublisher:
    """Writes one key, overwritten with each offered value."""

    def __init__(self, host: str, port: int, key: str) -> None:
        self._host, self._port, self.key = host, port, key
        self._pending: bytes | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._client: StoreClient | None = None
        self.problem: str | None = None
        self.written = 0
        self.cpu_s = 0.0  # this thread's CPU seconds (connecting and writing): what publishing costs the rank here
        self._thread = threading.Thread(target=self._run, name="torchmem_magic-store-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, value: bytes) -> None:
        """The latest value to write (sampler thread); returns at once."""
        with self._wake:
            self._pending = value
            self._wake.notify()

    def _take(self) -> bytes | None:
        with self._wake:
            while self._pending is None and not self._stopping:
                self._wake.wait()
            value, self._pending = self._pending, None
            return value

    def _run(self) -> None:
        started = time.thread_time()
        try:
            self._run_until_done()
        finally:
            self.cpu_s += time.thread_time() - started

    def _run_until_done(self) -> None:
        try:
            self._client = StoreClient(self._host, self._port)
        except StoreUnavailable as exc:
            self.problem = str(exc)
            return
        except Exception as exc:  # torch without distributed support, say
            self.problem = f"the job's store cannot be used ({type(exc).__name__}: {exc})"
            return
        while True:
            value = self._take()  # blocked, it costs no CPU
            if value is None:
                return
            if not self._write(value):
                return

    def _write(self, value: bytes) -> bool:
        assert self._client is not None
        try:
            self._client.set(self.key, value)
        except StoreUnavailable as exc:
            self.problem = str(exc)
            return False
        self.written += 1
        return True

    def finish(self, final: bytes | None, timeout_s: float = FINAL_TIMEOUT_S) -> bool:
        """Stop the thread and write `final` (if any) from here, the exit path; True when it was
        written. Waits at most `timeout_s` for a connect or a write still under way."""
        with self._wake:
            self._stopping = True
            self._pending = None
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive() or self._client is None or self.problem is not None:
            return False
        written = final is not None and self._write(final)
        self._client.close()
        return written
