"""The watcher's ranks as Prometheus gauges (`watch --prometheus [ADDR:]PORT`), for the dashboards a
cluster already has. Optional: it needs `prometheus_client`, and nothing is served unless asked.

A gauge per figure, one series per rank (labels rank, host, node), as the live status judges them:
each rank's steps, memory peak, last reading of every resource it measures, growth per step, whether
it leaks and whether it is still reporting.
The sampler thread keeps the latest judgement; a scrape reads it and computes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..ranks.live import RankLive, worst_live
from ..core.units import rate_unit

if TYPE_CHECKING:
    from ..session.live_view import LiveView
    from ..render.results import Report

DEFAULT_ADDRESS = "127.0.0.1"
PREFIX = "torchmem_magic"
VERDICT_LEVELS = {"clean": 0, "unknown": -1, "suspect": 1, "leak": 2}


class MetricsUnavailable(Exception):
    """The endpoint cannot be served (no prometheus_client, or the address is taken): one line."""


class RankBoard:
    """The latest judgement of every rank (a listener of the watcher's session, sampler thread)."""

    tick_period_s = 1.0
    tick_cpu_share: float | None = None

    def __init__(self) -> None:
        self.ranks: tuple[RankLive, ...] = ()  # replaced whole, so a scrape on another thread reads one state

    def on_tick(self, view: LiveView) -> None:
        self.ranks = view.live_ranks()

    def on_finish(self, view: LiveView, report: Report) -> None:
        self.ranks = view.live_ranks()  # as the report judged them


def rank_samples(ranks: tuple[RankLive, ...]) -> dict[str, tuple[str, list[tuple[dict[str, str], float]]]]:
    """Each gauge's help text and samples (labels, value)."""
    gauges: dict[str, tuple[str, list[tuple[dict[str, str], float]]]] = {
        "rank_steps": ("Steps the rank made (of its step clock: optimizer steps, backward passes, ...)", []),
        "rank_memory_peak_bytes": ("The rank's highest memory reading: VRAM allocated where it has CUDA, else RAM", []),
        "rank_memory_bytes": ("The rank's last reading of each resource it measures (label resource)", []),
        "rank_growth_bytes_per_step": ("The rank's leak rate where its verdict is leak or suspect, else 0", []),
        "rank_verdict": ("The rank's verdict so far: -1 not yet judged, 0 clean, 1 suspect, 2 leak", []),
        "rank_up": ("1 while the rank reports, 0 once it died or its summaries stopped coming", []),
    }
    worst = worst_live(ranks)
    for rank in ranks:
        labels = {"rank": str(rank.rank), "host": rank.host, "node": "" if rank.node is None else str(rank.node),
                  "clock": rate_unit(rank.clock)}
        gauges["rank_steps"][1].append((labels, float(rank.steps)))
        gauges["rank_memory_peak_bytes"][1].append((labels, rank.peak_bytes))
        gauges["rank_memory_bytes"][1].extend(({**labels, "resource": key}, value) for key, value in rank.readings)
        gauges["rank_growth_bytes_per_step"][1].append((labels, rank.per_step_bytes or 0.0))
        gauges["rank_verdict"][1].append((labels, float(VERDICT_LEVELS.get(rank.verdict, -1))))
        gauges["rank_up"][1].append((labels, 0.0 if rank.died is not None or rank.stale else 1.0))
    gauges["ranks"] = ("Ranks of the job this watcher knows of, every node's", [({}, float(len(ranks)))])
    if worst is not None:
        gauges["worst_rank"] = ("The rank the status names first (died, else the worst verdict, fastest growth)",
                                [({}, float(worst.rank))])
    return gauges


class _Collector:
    def __init__(self, ranks: Callable[[], tuple[RankLive, ...]], family: Any) -> None:
        self._ranks, self._family = ranks, family

    def collect(self) -> Iterator[Any]:
        for name, (help_text, samples) in rank_samples(self._ranks()).items():
            label_names = list(samples[0][0]) if samples and samples[0][0] else []
            gauge = self._family(f"{PREFIX}_{name}", help_text, labels=label_names or None)
            for labels, value in samples:
                gauge.add_metric([labels[k] for k in label_names], value)
            yield gauge


class MetricsEndpoint:
    """The /metrics endpoint over a board, served on its own thread until closed."""

    def __init__(self, board: RankBoard, address: str, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
            from prometheus_client.core import GaugeMetricFamily
        except ImportError:
            raise MetricsUnavailable("--prometheus needs prometheus_client: pip install prometheus-client") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(lambda: board.ranks, GaugeMetricFamily))
        try:
            self._server, self._thread = start_http_server(port, addr=address, registry=registry)
        except OSError as exc:
            raise MetricsUnavailable(f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}") from None
        self.url = f"http://{address}:{self._server.server_port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2.0)


def parse_address(text: str) -> tuple[str, int]:
    """'9400' -> (127.0.0.1, 9400); '0.0.0.0:9400' -> (0.0.0.0, 9400): only this host by default."""
    host, _, port = text.rpartition(":")
    value = int(port)  # ValueError: not a port
    if not 0 <= value <= 65535:
        raise ValueError(f"{value} is not a port")
    return (host.strip("[]") or DEFAULT_ADDRESS), value
