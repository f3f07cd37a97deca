"""Ranks to the watching session: Unix datagrams, never blocking a training step.

A datagram socket keeps each message whole and needs no connection: a rank that dies mid-message
loses that message only, and the watcher reads whatever arrived. The rank side queues events in a
bounded `Outbox` (the oldest are dropped and counted when the watcher falls behind) and sends from
its sampler thread with non-blocking calls; the training thread only appends to the queue.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from typing import Any

from .protocol import MAX_EVENTS_PER_MESSAGE, decode, encode

SOCKET_BUFFER_BYTES = 4 << 20
MAX_MESSAGES_PER_RECEIVE = 10_000
RECEIVE_BYTES = 1 << 20


def _private_directory() -> str:
    """A new directory only this user can enter, like tempfile.mkdtemp, but its name is kept before it
    is made: a Ctrl-C (one in the session's start lands here too) just after the mkdir is handled
    before mkdtemp returns the name, and the directory stayed behind."""
    while True:
        path = os.path.join(tempfile.gettempdir(), f"torchmem_magic-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)  # made just before the interrupt, or not at all
            raise


class RankSink:
    """The watching side's socket, in a private temporary directory removed by `close()`."""

    def __init__(self) -> None:
        self._directory = _private_directory()
        try:
            self.address = os.path.join(self._directory, "ranks.sock")
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
            self._socket.bind(self.address)
            self._socket.setblocking(False)
        except BaseException:
            self.close()
            raise
        self._owner_pid = os.getpid()

    def receive(self) -> list[dict[str, Any]]:
        """Every message waiting now (non-blocking)."""
        messages: list[dict[str, Any]] = []
        for _ in range(MAX_MESSAGES_PER_RECEIVE):
            try:
                data = self._socket.recv(RECEIVE_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # closed
                break
            message = decode(data)
            if message is not None:
                messages.append(message)
        return messages

    def close(self) -> None:
        """Close the socket; in the process that made it, also remove its directory."""
        sock = getattr(self, "_socket", None)  # None: the making was cut short before the socket
        if sock is not None:
            sock.close()
        if os.getpid() == getattr(self, "_owner_pid", os.getpid()):
            shutil.rmtree(self._directory, ignore_errors=True)


class Outbox:
    """A bounded queue of events: appending never blocks; when full, the oldest are dropped and counted.

    Appended from the training thread (loader passes) and the sampler thread (rows), drained by the
    sampler thread; deque appends and pops are atomic."""

    def __init__(self, capacity: int = 20_000) -> None:
        self._events: deque[Any] = deque()
        self.capacity = capacity
        self.dropped = 0

    def append(self, event: Any) -> None:
        self._events.append(event)
        if len(self._events) > self.capacity:
            try:
                self._events.popleft()
                self.dropped += 1
            except IndexError:
                pass

    def take(self, limit: int = MAX_EVENTS_PER_MESSAGE) -> list[Any]:
        out: list[Any] = []
        while len(out) < limit:
            try:
                out.append(self._events.popleft())
            except IndexError:
                break
        return out

    def put_back(self, events: list[Any]) -> None:
        """Events a send could not deliver go back to the front, in order (the bound still applies)."""
        self._events.extendleft(reversed(events))
        while len(self._events) > self.capacity:
            self._events.popleft()
            self.dropped += 1

    def __len__(self) -> int:
        return len(self._events)


class RankSender:
    """The rank side: sends messages to the sink's address without ever waiting on the watcher."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        self._socket.setblocking(False)
        self._lock = threading.Lock()  # the sampler thread and the exit path may both send
        self.failed = 0
        self.gone = False  # the watcher's socket no longer exists (it ended before this rank)

    def send(self, message: dict[str, Any]) -> bool:
        """True when the message left; False when the watcher's buffer is full or it is gone."""
        data = encode(message)
        with self._lock:
            try:
                self._socket.sendto(data, self.address)
            except (BlockingIOError, InterruptedError):
                self.failed += 1
                return False
            except OSError:  # refused, no such file, closed: nobody will read it
                self.failed += 1
                self.gone = True
                return False
        return True

    def send_patiently(self, message: dict[str, Any], timeout_s: float = 2.0) -> bool:
        """The last messages of a run: retried for up to `timeout_s` while the watcher's buffer is
        full, not at all once the watcher is gone."""
        deadline = time.monotonic() + timeout_s
        while not self.send(message):
            if self.gone or time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self) -> None:
        self._socket.close()
