"""`watch --prometheus`: every rank's gauges, scraped over HTTP while the command runs.

Scraped for real and parsed with prometheus_client's own text parser. The end-to-end test is keyed
to an event: the leaking rank waits at a step until a scrape has shown its leak (a file the test
creates once it has)."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from watching import SCRIPTS, environment, free_port, torchrun, watch_until

from torchmem_magic.session.live_view import FanOut
from torchmem_magic.ranks.live import RankLive
from torchmem_magic.frontends.watch_metrics import MetricsEndpoint, RankBoard, parse_address

DDP = str(SCRIPTS / "ddp_leak.py")


def _scrape(url: str) -> dict[str, dict[str, float]]:
    """{gauge name: {rank label (or ''), "/resource" where it has one: value}}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            resource = f"/{sample.labels['resource']}" if "resource" in sample.labels else ""
            out.setdefault(sample.name, {})[sample.labels.get("rank", "") + resource] = sample.value
    return out


def test_the_gauges_say_each_ranks_state() -> None:
    board = RankBoard()
    board.ranks = (
        RankLive(rank=0, pid=10, verdict="clean", steps=300, peak_bytes=2.0e8, host="a", node=0,
                 readings=(("ram", 2.0e8), ("heap", 5.0e7))),
        RankLive(rank=1, pid=11, verdict="leak", steps=280, peak_bytes=3.0e8, per_step_bytes=65536.0, host="b", node=1,
                 readings=(("ram", 2.5e8), ("vram", 3.0e8))),
        RankLive(rank=2, pid=12, verdict="unknown", steps=20, died="SIGKILL", host="b", node=1),
    )
    endpoint = MetricsEndpoint(board, "127.0.0.1", 0)
    try:
        seen = _scrape(endpoint.url)
    finally:
        endpoint.close()
    assert seen["torchmem_magic_rank_verdict"] == {"0": 0.0, "1": 2.0, "2": -1.0}
    assert seen["torchmem_magic_rank_growth_bytes_per_step"] == {"0": 0.0, "1": 65536.0, "2": 0.0}
    assert seen["torchmem_magic_rank_up"] == {"0": 1.0, "1": 1.0, "2": 0.0}
    assert seen["torchmem_magic_rank_steps"]["1"] == 280.0 and seen["torchmem_magic_rank_memory_peak_bytes"]["1"] == 3.0e8
    assert seen["torchmem_magic_rank_memory_bytes"] == {"0/ram": 2.0e8, "0/heap": 5.0e7, "1/ram": 2.5e8, "1/vram": 3.0e8}
    assert seen["torchmem_magic_ranks"] == {"": 3.0} and seen["torchmem_magic_worst_rank"] == {"": 2.0}
    with pytest.raises(urllib.error.URLError):  # closed: nothing is left listening
        urllib.request.urlopen(endpoint.url, timeout=5)


def test_listeners_fanned_out_are_each_called_on_their_own_period() -> None:
    class Counting:
        def __init__(self, period_s: float) -> None:
            self.tick_period_s, self.ticks, self.finished = period_s, 0, False

        def on_tick(self, view: object) -> None:
            self.ticks += 1

        def on_finish(self, view: object, report: object) -> None:
            self.finished = True

    now = [0.0]
    fast, slow = Counting(1.0), Counting(10.0)
    both = FanOut([fast, slow], clock=lambda: now[0])  # type: ignore[list-item]
    assert both.tick_period_s == 1.0
    for tick in range(25):
        now[0] = float(tick)
        both.on_tick(None)  # type: ignore[arg-type]
    both.on_finish(None, None)  # type: ignore[arg-type]
    assert (fast.ticks, slow.ticks) == (25, 3) and fast.finished and slow.finished


def test_an_address_is_this_host_unless_said() -> None:
    assert parse_address("9400") == ("127.0.0.1", 9400)
    assert parse_address("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    with pytest.raises(ValueError):
        parse_address("70000")


def test_a_scrape_shows_the_leaking_rank_while_the_run_goes(tmp: Path, tmp_path: Path) -> None:
    go, port = tmp_path / "go", free_port()
    cmd = [sys.executable, "-m", "torchmem_magic", "watch", "--status-every", "1", "--prometheus", f"127.0.0.1:{port}",
           "--", *torchrun(), "--nproc-per-node", "2", DDP, "--sleep-s", "0.01", "--wait-at", "120",
           "--wait-for", str(go), "--facts", str(tmp_path / "facts.json")]
    url, seen = f"http://127.0.0.1:{port}/metrics", {}

    def leak_shown() -> bool:
        nonlocal seen
        try:
            seen = _scrape(url)
        except (urllib.error.URLError, ConnectionError):
            seen = {}
        verdicts = seen.get("torchmem_magic_rank_verdict", {})
        # each rank is rejudged on its own 1 s period, so the clean rank's verdict may still be the one from
        # before its 30th step when the leaking rank's first leak shows: wait for both (the leaking rank,
        # waiting at step 120, and the clean one with it, then go on)
        return verdicts.get("1") == 2.0 and verdicts.get("0", -1.0) != -1.0

    returncode, out, err = watch_until(cmd, environment(tmp), go, leak_shown)
    assert go.exists(), (seen, err[-3000:])
    assert returncode == 0, err[-3000:]
    assert seen["torchmem_magic_rank_verdict"]["0"] == 0.0, (seen, err[-3000:])
    assert seen["torchmem_magic_rank_growth_bytes_per_step"]["1"] > 32 * 1024  # ~66 KiB a step kept
    assert seen["torchmem_magic_rank_up"] == {"0": 1.0, "1": 1.0}
    assert f"the ranks' gauges at {url}" in err and "verdict: leak (worst rank: 1)" in out
    assert "  rank 1 @" in err  # the live status goes on beside the endpoint
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


def test_without_prometheus_client_it_is_one_line_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "from torchmem_magic.__main__ import main\n"
            f"sys.exit(main(['watch', '--prometheus', '9400', '--', 'touch', {str(marker)!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment(tmp_path))
    assert result.returncode == 2 and not marker.exists()
    assert result.stderr.strip() == "torchmem_magic watch: --prometheus needs prometheus_client: pip install prometheus-client"


def test_a_taken_port_is_one_line(tmp_path: Path) -> None:
    board = RankBoard()
    endpoint = MetricsEndpoint(board, "127.0.0.1", 0)
    try:
        port = endpoint.url.split(":")[-1].split("/")[0]
        result = subprocess.run([sys.executable, "-m", "torchmem_magic", "watch", "--prometheus", f"127.0.0.1:{port}",
                                 "--", "true"], capture_output=True, text=True, env=environment(tmp_path))
    finally:
        endpoint.close()
    assert result.returncode == 2
    assert result.stderr.startswith(f"torchmem_magic watch: cannot serve metrics on 127.0.0.1:{port}: ")
    assert "Traceback" not in result.stderr
