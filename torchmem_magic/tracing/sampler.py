"""The background sampling thread: fixed deadlines (no drift), immediate stop, bounded output."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable

from ..probes.base import ErrorCount
from ..core.timeline import DecimatingSeries, Row

THREAD_NAME = "torchmem_magic-sampler"


class Sampler:
    """Calls `read_row` every `interval_s` on its own thread and appends the row to `series`.

    `on_tick`, if given, runs on the same thread at most every `tick_period_s` (the live figure:
    one writer thread only); with `on_tick_share`, less often when it costs more than that share of
    the time between two calls (a live figure's redraw and verdict cost milliseconds: its rate adapts
    so that it never weighs on the training loop), but at least every `tick_max_period_s` when given (a
    figure that stops moving looks like a hung kernel). `on_tick` may return the CPU seconds that work it
    handed to another thread cost there since its last call (a redraw it asked the training thread for):
    that counts as the tick's cost, so the same share bounds it. Ticks do not wait for a reading: at a long
    interval the figure still moves (the status line's clock and steps). Sleeping to fixed deadlines
    holds the rate where `sleep(interval)` would drift; readings missed under load are skipped and
    counted, not bunched up. `clock` and `cpu_clock` (this thread's CPU time) are injectable, and
    `run_once` is the loop's body, so a simulated run drives the real loop on a fake clock.
    """

    def __init__(
        self,
        read_row: Callable[[], Row],
        series: DecimatingSeries,
        interval_s: float,
        on_tick: Callable[[], float | None] | None = None,
        tick_period_s: float = 0.5,
        on_tick_share: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick_max_period_s: float | None = None,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._read_row = read_row
        self._series = series
        self.interval_s = interval_s
        self._on_tick = on_tick
        self._tick_period_s = tick_period_s
        self._on_tick_share = on_tick_share
        self._tick_max_period_s = tick_max_period_s
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ending = threading.Lock()  # `when_ended` and the thread's end agree on who runs the action
        self._running = False  # the thread's loop has not ended
        self._after: Callable[[], None] | None = None  # run by the thread as it ends (see `when_ended`)
        self._deadline_s = 0.0  # when the next reading is due (on `clock`)
        self._next_tick_s = 0.0  # when the next on_tick is due
        self._on_tick_cpu_s: float | None = None  # what a call of on_tick costs, smoothed
        #: whether a tick has reported its whole cost yet: the first that hands work to another thread
        #: reports none of it (that work runs later), so the smoothing starts over at the next one
        self._tick_cost_known = False
        self.samples = 0
        self.ticks = 0
        self.missed_ticks = 0
        self.errors = ErrorCount("sampler thread")
        self.cpu_s = 0.0  # this thread's CPU time, set when it ends (what sampling cost, for the benchmarks)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self.begin()
        # copy_context keeps the cell's context, so anything this thread outputs lands in that cell
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._run,), name=THREAD_NAME, daemon=True
        )
        self._running = True
        try:
            self._thread.start()
        except BaseException:
            self._running = False
            raise

    def begin(self) -> None:
        """Set the first deadlines: a reading now, a tick one period from now."""
        self._deadline_s = self._clock()
        self._next_tick_s = self._deadline_s + self._tick_period_s

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._stop.wait(self.run_once())
            self.cpu_s = self._cpu_clock()
        finally:
            with self._ending:
                self._running, after, self._after = False, self._after, None
            if after is not None:
                after()

    def run_once(self) -> float:
        """A reading if one is due, then a tick if one is due; returns seconds until the next is due."""
        if self._clock() >= self._deadline_s:
            self._read()
        if self._on_tick is not None and self._clock() >= self._next_tick_s:
            self._tick()
        wake_s = self._deadline_s if self._on_tick is None else min(self._deadline_s, self._next_tick_s)
        return max(0.0, wake_s - self._clock())

    def _read(self) -> None:
        try:
            self._series.append(self._read_row())
            self.samples += 1
        except Exception as exc:
            self.errors.record(exc)
        self._deadline_s += self.interval_s
        now = self._clock()
        if self._deadline_s < now:
            missed = int((now - self._deadline_s) / self.interval_s) + 1
            self.missed_ticks += missed
            self._deadline_s += missed * self.interval_s

    def _tick(self) -> None:
        assert self._on_tick is not None
        cpu_before_s = self._cpu_clock()
        elsewhere_s = None
        try:
            elsewhere_s = self._on_tick()
        except Exception as exc:
            self.errors.record(exc)
        self.ticks += 1
        cost_s = self._cpu_clock() - cpu_before_s + (elsewhere_s or 0.0)
        smoothed = self._on_tick_cpu_s
        known = self._tick_cost_known
        self._on_tick_cpu_s = smoothed = 0.8 * smoothed + 0.2 * cost_s if smoothed is not None and known else cost_s
        self._tick_cost_known = known or elsewhere_s is None or elsewhere_s > 0.0
        self._next_tick_s = self._clock() + self.tick_period_s(smoothed)

    def tick_period_s(self, on_tick_cpu_s: float) -> float:
        """Seconds from one tick to the next when a tick costs `on_tick_cpu_s` of CPU."""
        period_s = self._tick_period_s
        if self._on_tick_share is not None:
            period_s = max(period_s, on_tick_cpu_s / self._on_tick_share)
        if self._tick_max_period_s is not None:
            period_s = min(period_s, max(self._tick_max_period_s, self._tick_period_s))
        return period_s

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop and join for at most `timeout_s`; whether the thread ended (a reading stuck past it, on a
        hung /proc or NFS read, is counted as this thread's failure). Safe to call twice or before start."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            try:
                self._thread.join(timeout_s)
            except RuntimeError:  # an interrupt cut into start() before the thread said it runs: it sees the stop
                pass
        if self.alive:
            self.errors.record(TimeoutError(f"a reading still ran {timeout_s:g} s after the run ended"))
            return False
        return True

    def when_ended(self, action: Callable[[], None]) -> None:
        """Run `action` once the thread's loop has ended: now if it has (or never ran), else on the thread
        as it ends, so that what a reading uses (the probes) is never closed under it."""
        with self._ending:
            if self._running:
                self._after = action
                return
        action()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
