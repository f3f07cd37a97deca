"""The watcher's live status: a line per rank, the worst first, while the command runs.

The end-to-end tests are keyed to events, not to time: the leaking rank waits at a step until the
test has seen the status name its leak (a file the test creates), so the line is known to have come
while the run was going. On a terminal (a pseudo-terminal read through a terminal emulator) the
block must sit at the bottom of the screen with the command's own output intact above it, and be
gone when the report comes."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pyte
import pytest
from watching import SCRIPTS, environment, torchrun

from torchmem_magic.core.model import LiveStatus
from torchmem_magic.ranks.live import RankLive
from torchmem_magic.frontends.watch_status import TerminalStatus, rank_line, status_lines

DDP = str(SCRIPTS / "ddp_leak.py")
COLUMNS, ROWS = 120, 30
HOST = socket.gethostname()
LEAK_LINE = re.compile(r"rank 1 @\S+: leak \+[\d.]+ KiB/step in heap · leaked_outputs")


def _status(**fields: object) -> LiveStatus:
    nan = float("nan")
    base: dict = dict(elapsed_s=12.0, steps=0, epochs=0, ram_bytes=nan, heap_bytes=nan, vram_allocated_bytes=nan,
                      vram_reserved_bytes=nan, shm_used_bytes=nan, workers=0, ram_per_step=None, heap_per_step=None,
                      vram_per_step=None)
    return LiveStatus(**{**base, **fields})


def _rank(rank: int, verdict: str = "clean", **fields: object) -> RankLive:
    return RankLive(rank=rank, pid=1000 + rank, verdict=verdict, steps=120, **fields)  # type: ignore[arg-type]


def test_the_ranks_are_listed_worst_first_and_the_rest_counted() -> None:
    ranks = [_rank(r, node=r // 6) for r in range(12)]
    ranks[5] = _rank(5, "leak", per_step_bytes=64 * 1024.0, resource="heap", holder="kept", host="b", node=0)
    ranks[9] = _rank(9, died="SIGKILL", host="b", node=1)
    ranks[3] = _rank(3, "suspect", per_step_bytes=1024.0, resource="heap", node=0)
    lines = status_lines(_status(rank_steps=(100, 120)), ranks, rank_lines=4)
    assert lines[0] == "torchmem_magic watch · 12 s · 12 ranks on 2 nodes · 100–120 steps"
    assert [line.split(":")[0].strip() for line in lines[1:5]] == [
        "rank 9 @b (node 1)", "rank 5 @b (node 0)", "rank 3 (node 0)", "rank 0 (node 0)",
    ]
    assert lines[1] == "  rank 9 @b (node 1): stopped (SIGKILL) · 120 steps"
    assert lines[2] == "  rank 5 @b (node 0): leak +64.0 KiB/step in heap · kept · 120 steps"
    assert lines[5] == "  … 8 more ranks (8 clean so far)"


def test_a_rank_that_went_silent_or_is_still_judged_says_so() -> None:
    assert rank_line(_rank(2, stale=True, via="store")) == "rank 2: stale: its summaries stopped coming · 120 steps"
    assert rank_line(_rank(0, "unknown", peak_bytes=3 * 2**20)) == "rank 0: judging · 120 steps · peak 3.0 MiB"


def test_a_status_without_a_terminal_waits_for_a_rank_and_prints_plain_lines() -> None:
    class View:
        ranks: tuple[RankLive, ...] = ()

        def live_ranks(self) -> tuple[RankLive, ...]:
            return self.ranks

        def live_status(self, ranks: object = None) -> LiveStatus:
            return _status()

    class Log:
        text = ""

        def write(self, text: str) -> None:
            self.text += text

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return False

    view, log = View(), Log()
    status = TerminalStatus(log)  # type: ignore[arg-type]
    assert status.tick_period_s == 10.0
    status.on_tick(view)  # type: ignore[arg-type]
    assert log.text == ""
    view.ranks = (_rank(0),)
    status.on_tick(view)  # type: ignore[arg-type]
    assert log.text == "torchmem_magic watch · 12 s · 1 rank\n  rank 0: clean · 120 steps\n"
    assert "\x1b" not in log.text


def _command(go: Path, facts: Path, *watch_args: str, script_args: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "torchmem_magic", "watch", *watch_args, "--", *torchrun(), "--nproc-per-node", "2",
            DDP, "--sleep-s", "0.01", "--wait-at", "120", "--wait-for", str(go), "--facts", str(facts), *script_args]


def test_a_log_gets_the_leaking_rank_named_while_the_run_goes(tmp: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    watcher = subprocess.Popen(_command(go, tmp_path / "facts.json", "--status-every", "1"), env=environment(tmp),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert watcher.stderr is not None
    seen = []
    for line in watcher.stderr:  # the leaking rank waits at step 120 until `go` exists
        seen.append(line)
        if LEAK_LINE.search(line):
            go.touch()
            break
    out, err = watcher.communicate(timeout=240)
    assert go.exists(), "".join(seen)[-3000:]
    assert watcher.returncode == 0, err[-3000:]
    heading = next(line for line in reversed(seen) if line.startswith("torchmem_magic watch · "))  # the leak's block
    assert re.search(r"· 2 ranks · [\d,]+(–[\d,]+)? steps$", heading.strip()), heading
    assert "\x1b" not in "".join(seen) + err
    assert "verdict: leak (worst rank: 1)" in out and "torchmem_magic watch ·" not in out


def _read_into(screen_stream: pyte.ByteStream, master: int, timeout_s: float) -> bytes:
    ready, _, _ = select.select([master], [], [], timeout_s)
    if not ready:
        return b""
    try:
        chunk = os.read(master, 65536)
    except OSError:  # the other end closed: the watcher is gone
        return b""
    screen_stream.feed(chunk)
    return chunk


def test_a_terminal_keeps_the_status_at_the_bottom_and_the_commands_output_above(tmp: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    env = {**environment(tmp), "TERM": "xterm"}
    # the leaking rank prints a line a step: far more than the screen holds, so it scrolls while the block stays
    watcher = subprocess.Popen(_command(go, tmp_path / "facts.json", script_args=("--print-steps",)), env=env,
                               stdout=slave, stderr=slave)
    os.close(slave)
    screen = pyte.HistoryScreen(COLUMNS, ROWS, history=10_000)  # keeps what scrolled off the top
    stream = pyte.ByteStream(screen)
    try:
        deadline = time.monotonic() + 240  # a guard against a hang, not a timing assumption
        while not go.exists() and time.monotonic() < deadline and watcher.poll() is None:
            _read_into(stream, master, 0.5)
            rows = [row.rstrip() for row in screen.display]
            headings = [i for i, row in enumerate(rows) if row.startswith("torchmem_magic watch · ")]
            block = rows[headings[-1]:] if headings else []  # the block: from its heading to the screen's bottom
            if any(LEAK_LINE.search(row) for row in block):
                assert len(headings) == 1 and "2 ranks" in block[0], rows  # one block, no stale copy above
                assert [row.split(":")[0] for row in block[1:] if row] == ["  rank 1 @" + HOST, "  rank 0 @" + HOST], block
                above = [row for row in rows[: headings[-1]] if row]
                numbers = [int(m.group(1)) for row in above[-10:] if (m := re.fullmatch(r"step (\d+) done", row))]
                assert numbers == list(range(numbers[0], numbers[0] + 10)), above  # the script's latest lines, whole
                go.touch()
        assert go.exists(), "\n".join(screen.display)
        while _read_into(stream, master, 5.0) or watcher.poll() is None:
            pass
    finally:
        if watcher.poll() is None:
            watcher.kill()
        watcher.wait()
        os.close(master)
    assert watcher.returncode == 0
    history = ["".join(line[c].data for c in range(COLUMNS)).rstrip() for line in screen.history.top]
    every_line = [*history, *(row.rstrip() for row in screen.display)]
    printed = [int(m.group(1)) for row in every_line if (m := re.fullmatch(r"step (\d+) done", row))]
    assert printed == list(range(1, 201)), printed  # none lost under the block, none doubled
    shown = "\n".join(row.rstrip() for row in screen.display)
    assert "verdict: leak (worst rank: 1)" in shown and "torchmem_magic watch ·" not in shown
    assert screen.margins is None or (screen.margins.top, screen.margins.bottom) == (0, ROWS - 1)


@pytest.mark.parametrize("value", ["-1", "x", "4000"])
def test_a_bad_status_period_is_one_line(value: str) -> None:
    result = subprocess.run([sys.executable, "-m", "torchmem_magic", "watch", "--status-every", value, "--", "true"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--status-every" in result.stderr and "Traceback" not in result.stderr
