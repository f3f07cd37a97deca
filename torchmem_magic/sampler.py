"""The background sampling thread: fixed deadlines (no drift), immediate stop, bounded output."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable

from .probes.base import ErrorCount
from .timeline import DecimatingSeries, Row

THREAD_NAME = "torchmem_magic-sampler"


class Sampler:
    """Calls `read_row` every `interval_s` on its own thread and appends the row to `series`.

    `on_tick`, if given, runs on the same thread at most every `tick_period_s` (the live figure:
    one writer thread only); with `on_tick_share`, less often when it costs more than that share of
    the time between two calls (a live figure's redraw and verdict cost milliseconds: its rate adapts
    so that it never weighs on the training loop). Sleeping to fixed deadlines holds the rate where
    `sleep(interval)` would drift; ticks missed under load are skipped and counted, not bunched up.
    """

    def __init__(
        self,
        read_row: Callable[[], Row],
        series: DecimatingSeries,
        interval_s: float,
        on_tick: Callable[[], None] | None = None,
        tick_period_s: float = 0.5,
        on_tick_share: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_row = read_row
        self._series = series
        self.interval_s = interval_s
        self._on_tick = on_tick
        self._tick_period_s = tick_period_s
        self._on_tick_share = on_tick_share
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.missed_ticks = 0
        self.errors = ErrorCount("sampler thread")
        self.cpu_s = 0.0  # this thread's CPU time, set when it ends (what sampling cost, for the benchmarks)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        # copy_context keeps the cell's context, so anything this thread outputs lands in that cell
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._run,), name=THREAD_NAME, daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        deadline = self._clock()
        next_tick = deadline + self._tick_period_s
        on_tick_cpu_s: float | None = None  # what a call of on_tick costs, smoothed
        while not self._stop.is_set():
            try:
                self._series.append(self._read_row())
                self.samples += 1
            except Exception as exc:
                self.errors.record(exc)
            now = self._clock()
            if self._on_tick is not None and now >= next_tick:
                cpu_before_s = time.thread_time()
                try:
                    self._on_tick()
                except Exception as exc:
                    self.errors.record(exc)
                cost_s = time.thread_time() - cpu_before_s
                on_tick_cpu_s = cost_s if on_tick_cpu_s is None else 0.8 * on_tick_cpu_s + 0.2 * cost_s
                period_s = self._tick_period_s
                if self._on_tick_share is not None:
                    period_s = max(period_s, on_tick_cpu_s / self._on_tick_share)
                next_tick = self._clock() + period_s
            deadline += self.interval_s
            now = self._clock()
            if deadline < now:
                missed = int((now - deadline) / self.interval_s) + 1
                self.missed_ticks += missed
                deadline += missed * self.interval_s
            self._stop.wait(deadline - now)
        self.cpu_s = time.thread_time()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop and join; safe to call twice or before start."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
