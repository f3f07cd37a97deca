"""What memwatch itself keeps in memory: a session over a simulated long run, and the leak finder's
peak while it scans a namespace of a million objects.

A session's run is simulated on its own code paths with a simulated clock: the sampler's readings
(`BackgroundReadings.row`, real probes) every `interval`, and optimizer steps in between (the step hook's
path: step sampling, filing the step rows), so an hour takes seconds. tracemalloc counts what
memwatch's modules allocate (its buffers, the step-row queue, the holders' series); the readings
of a real 24 h are too many to take one by one, so 24 h feeds the time series the rows a day would
produce (the buffer that is fed most) and runs the session's paths for the same hour.

Run: python bench/own_memory.py
"""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scan_speed  # noqa: E402

from torchmem_magic import MemwatchSession  # noqa: E402
from torchmem_magic.finder.scan.memo import ScanMemo, scan_reusing  # noqa: E402
from torchmem_magic.finder.scan.results import Root  # noqa: E402
from torchmem_magic.finder.scan.scanner import scan_roots  # noqa: E402
from torchmem_magic.finder.leak_finder import END_SCAN_BUDGET  # noqa: E402
from torchmem_magic.core.options import SessionOptions

PACKAGE = __import__("torchmem_magic").__path__[0]


class SimulatedClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _own_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes allocated by memwatch's own modules and still alive."""
    only_ours = snapshot.filter_traces([tracemalloc.Filter(True, f"{PACKAGE}/*")])
    return sum(stat.size for stat in only_ours.statistics("filename"))


def session_memory(hours: float, interval_s: float = 0.01, steps_per_s: float = 200.0) -> dict[str, Any]:
    """A session's own memory after `hours` of simulated run at `interval_s`, with `steps_per_s` steps."""
    clock = SimulatedClock()
    session = MemwatchSession(SessionOptions(interval_s * 1000, watch_ranks=False, train_hooks=False), clock=clock)
    session.start()
    background = session.background
    assert session._sampler is not None and background is not None
    session._sampler.stop()  # this benchmark reads in its place, on the simulated clock
    gc.collect()
    tracemalloc.start()
    baseline = _own_bytes(tracemalloc.take_snapshot())
    steps_per_tick = steps_per_s * interval_s
    simulated_s = min(hours, 1.0) * 3600
    ticks = int(simulated_s / interval_s)
    due = 0.0
    started = time.perf_counter()
    for tick in range(ticks):
        due += steps_per_tick
        while due >= 1.0:
            session.tick("optimizer")
            clock.now_s += 1.0 / steps_per_s
            due -= 1.0
        clock.now_s = (tick + 1) * interval_s
        session.timeline.by_time.append(background.row())
    row = background.row()
    for tick in range(ticks, int(hours * 3600 / interval_s)):  # the rest of a day: the time series only
        row["t_s"] = tick * interval_s
        session.timeline.by_time.append(row)
    kept = _own_bytes(tracemalloc.take_snapshot()) - baseline
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    report = session.stop()
    return {
        "hours": hours, "interval_ms": interval_s * 1000, "rows_fed": int(hours * 3600 / interval_s),
        "steps": session.steps, "rows_kept": len(session.timeline.by_time) + len(session.timeline.by_step),
        "kept_kib": kept / 1024, "traced_peak_kib": peak / 1024, "buffers_kib": session.timeline.nbytes() / 1024,
        "wall_s": time.perf_counter() - started, "verdict": str(report.verdict),
    }


def record_size(hours: float = 24.0, interval_s: float = 0.1, steps_per_s: float = 50.0) -> dict[str, float]:
    """The flight record of a simulated `hours` run at the default interval: its largest and final
    size on disk, and what writing it cost (CPU per simulated hour). Rows and step rows are fed as the
    sampler and the step hook would; the recorder flushes every half a simulated second."""
    import tempfile

    from torchmem_magic.flight.recorder import FlightRecorder

    clock = SimulatedClock()
    with tempfile.TemporaryDirectory() as directory:
        recorder = FlightRecorder("for step in range(steps): ...", directory=Path(directory))
        session = MemwatchSession(SessionOptions(interval_s * 1000, watch_ranks=False, train_hooks=False), clock=clock, recorder=recorder)
        session.start()
        view = session.view
        assert session._sampler is not None and recorder.path is not None and view is not None
        session._sampler.stop()
        assert session.background is not None
        row = session.background.row()
        step_row = dict(row)
        largest = cpu_s = 0.0
        steps_per_row = steps_per_s * interval_s
        for i in range(int(hours * 3600 / interval_s)):
            t_s = i * interval_s
            clock.now_s = t_s
            row["t_s"] = t_s
            session.timeline.by_time.append(row)
            step_row["t_s"], step_row["step"] = t_s, i * steps_per_row
            if i % 10 == 0:  # a sampled step a second, as the stride settles on a long run
                session.timeline.by_step.append(step_row)
            started = time.thread_time()
            recorder.on_sample(view, t_s)
            cpu_s += time.thread_time() - started
            if i % 600 == 0:  # every simulated minute
                largest = max(largest, recorder.path.stat().st_size)
        final = recorder.path.stat().st_size
        largest = max(largest, final)
        session.stop()
    return {"hours": hours, "largest_kib": largest / 1024, "final_kib": final / 1024,
            "cpu_ms_per_hour": cpu_s * 1000 / hours, "errors": recorder.errors.count}


def scan_peak(namespace: dict[str, Any] | None = None) -> dict[str, float]:
    """The leak finder's peak memory on the scan_speed namespace (10,000 graph-holding losses and
    250,000 records: ~1.25 M objects), the end-of-cell budget; and what a memo of it keeps."""
    torch.set_num_threads(1)
    namespace = namespace if namespace is not None else scan_speed.build_namespace()
    roots = [Root(name, "user", name, value) for name, value in namespace.items()]
    gc.collect()
    tracemalloc.start()
    result = scan_roots(roots, END_SCAN_BUDGET)
    _, scan_peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    memo = ScanMemo()
    scan_reusing(memo, roots, END_SCAN_BUDGET)
    memo_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {"objects": result.objects, "peak_mib": scan_peak_bytes / 2**20, "memo_kib": memo_bytes / 1024,
            "names": len(memo)}


def render() -> str:
    lines = [
        "| simulated run | interval | steps | rows kept | memwatch's allocations alive | traced peak |",
        "|---|---|---|---|---|---|",
    ]
    for hours in (1.0, 24.0):
        r = session_memory(hours)
        lines.append(
            f"| {hours:.0f} h | {r['interval_ms']:.0f} ms | {r['steps']:,} | {r['rows_kept']:,} of {r['rows_fed']:,} "
            f"| {r['kept_kib']:.0f} KiB (buffers {r['buffers_kib']:.0f} KiB) | {r['traced_peak_kib']:.0f} KiB |"
        )
    record = record_size()
    lines += [
        "",
        f"The flight record of a simulated {record['hours']:.0f} h run at the default 100 ms interval stays under "
        f"{record['largest_kib']:.0f} KiB on disk ({record['final_kib']:.0f} KiB at the end; rewritten from the "
        f"bounded timeline whenever it passes 2 MiB); writing it costs {record['cpu_ms_per_hour']:.0f} ms of CPU an "
        f"hour ({record['cpu_ms_per_hour'] / 3600 / 10:.3f}% of a core).",
    ]
    scan = scan_peak()
    lines += [
        "",
        f"The leak finder's peak while scanning {scan['objects']:,} objects (10,000 graph-holding losses, 250,000 "
        f"records): {scan['peak_mib']:.1f} MiB (its visited set and the tensors it found, dropped when it returns); "
        f"what it keeps for the next cell (the memo of {scan['names']} names): {scan['memo_kib']:.1f} KiB.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
