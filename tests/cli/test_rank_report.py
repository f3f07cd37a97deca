"""A rank's report, as its watcher rebuilds it from the stream, is the report the rank's own session
assembled: compared field by field, on a real watched process (the bootstrap, the agent, the socket,
the watcher's feeds), for a run with a holder and DataLoader workers' exits, and for one the memory
guard stopped. Every field of the evidence itself is checked in tests/torch/test_rank_parts.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from watching import SCRIPTS, environment, load

from torchmem_magic.core.options import MemwatchOptions
from torchmem_magic.ranks.feed import RankFeeds, rank_report
from torchmem_magic.ranks.launch_env import watched_environment
from torchmem_magic.stream.feed import RankFeed

SCRIPT = str(SCRIPTS / "rank_own_report.py")
GUARD_SHARE = 0.9


def _watched(mode: str, own_report: Path, tmp: Path) -> RankFeed:
    """Run the script as a watched process until it ends and its last message has come: its feed."""
    feeds = RankFeeds()
    try:
        options = MemwatchOptions(interval_ms=20, guard=GUARD_SHARE if mode == "guard" else None)
        env = watched_environment(environment(tmp), feeds.address, options)
        process = subprocess.Popen([sys.executable, SCRIPT, mode, str(own_report)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, err = process.communicate(timeout=240)  # the datagrams wait in the socket meanwhile (it holds them)
        deadline = time.monotonic() + 30  # a guard against a hang: the final message is normally there at once
        while time.monotonic() < deadline:
            feeds.poll(force=True)
            feed = next(iter(feeds.snapshot()), None)
            if feed is not None and feed.final is not None:
                return feed
            time.sleep(0.05)
        raise AssertionError(f"no final message from the watched process; its stderr: {err[-3000:]}")
    finally:
        feeds.close()


def _differences(rebuilt: dict[str, Any], own: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {key: (rebuilt.get(key), own.get(key)) for key in rebuilt.keys() | own.keys()
            if rebuilt.get(key) != own.get(key)}


@pytest.mark.parametrize("mode", ["holder", "guard"])
def test_a_ranks_report_is_its_own_sessions_report(mode: str, tmp: Path, tmp_path: Path) -> None:
    own_path = tmp_path / "own.json"
    feed = _watched(mode, own_path, tmp)
    own = load(own_path)
    assert own["suspects"] and own["suspects"][0]["name"] == "kept_outputs", own["advice"]
    assert own["workers"] is not None and own["workers"]["max"] == 2
    if mode == "guard":  # what the guard did leads the advice, and ended the run
        assert own["status"] == "error" and "MemoryGuardError" in own["error"]
        assert "guard" in own["advice"][0]
    rebuilt = rank_report(feed).to_dict()
    assert sorted(_differences(rebuilt, own)) == []
