"""What keeping a rank's summary in its job's store costs that rank: CPU seconds per second of run.

A real session trains a small MLP in this process (one optimizer step every few ms, the leaking
pattern: each step's output kept) while a `StorePublishing` of a two-node job writes its summary to
a TCPStore served here, as a rank of a multi-node torchrun job does. Reported: the sampler thread's
seconds assembling the summaries, the publisher thread's seconds writing them, both per second of
run and per summary, and the size of one summary on the wire.

Run: python bench/store_publish.py [SECONDS]
"""

from __future__ import annotations

import sys
import time

import torch
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported from torch._C at run time

from torchmem_magic.agent.publish import StorePublishing
from torchmem_magic.session.live_view import LiveView
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.ranks.job import JobStore
from torchmem_magic.render.results import Report
from torchmem_magic.session.run import MemwatchSession


class Publishing:
    """The session's listener, as the rank agent drives it: each tick may publish."""

    tick_period_s = 0.25
    tick_cpu_share: float | None = None  # every tick_period_s, as the rank agent's listener

    def __init__(self, publishing: StorePublishing) -> None:
        self.publishing = publishing

    def on_tick(self, view: LiveView) -> None:
        self.publishing.on_tick(view)

    def on_finish(self, view: LiveView, report: Report) -> None:
        pass


def train_leaking(session: MemwatchSession, seconds: float, kept: dict[str, list[torch.Tensor]],
                  sleep_s: float = 0.0) -> float:
    """A small MLP trained under `session` for `seconds`, each step's output and loss kept in `kept`
    (the leaking pattern a rank's summary then describes); the seconds it ran."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.perf_counter()
    with session:
        while time.perf_counter() - started < seconds:
            out = model(torch.randn(64, 256))
            loss = out.pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            kept.setdefault("outputs", []).append(out)
            kept.setdefault("losses", []).append(loss)
            if sleep_s:
                time.sleep(sleep_s)
    return time.perf_counter() - started


def main(seconds: float) -> None:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    job = JobStore("127.0.0.1", server.port, "bench", 0, 2, 1, 0)
    publishing = StorePublishing(job, rank=0, local_rank=0)
    session = MemwatchSession(SessionOptions(100, watch_ranks=False), listener=Publishing(publishing))
    publishing.start()
    wall_s = train_leaking(session, seconds, {}, sleep_s=0.002)
    publishing.finish(session.report)
    written = publishing.publisher.written
    size = len(server.get(job.summary_key(0)))
    build, write = publishing.build_s, publishing.publisher.cpu_s
    print(f"{wall_s:.1f} s run, {session.steps} steps, {written} summaries written ({size:,} B each, the final one)")
    print(f"assembling (sampler thread): {build * 1e3 / wall_s:.2f} ms CPU per s of run, "
          f"{build * 1e3 / max(1, written - 1):.2f} ms per summary")
    print(f"writing (publisher thread, its connect included): {write * 1e3 / wall_s:.3f} ms CPU per s of run")
    print(f"together: {(build + write) / wall_s * 100:.2f}% of one core")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0)
