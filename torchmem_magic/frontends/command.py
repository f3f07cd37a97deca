"""`python -m torchmem_magic watch -- COMMAND ...`: run a command with every rank of it watched.

The watcher is an ordinary session that does not train (no step hooks; its curves are the whole
process tree, the command included) and listens for ranks. The command gets three environment
additions, for itself and its children only: the bootstrap directory first on PYTHONPATH (its
`sitecustomize` arms each Python process, see agent/boot.py), the watcher's sink address and the
sampling interval. The watcher's own environment is left as it was.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from ..core.options import MemwatchOptions
from ..ranks.launch_env import watched_environment
from ..render.results import Report

if TYPE_CHECKING:
    from ..session.live_view import Listener

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class WatchOptions:
    """What `watch` was asked for."""

    command: tuple[str, ...]
    ranks: MemwatchOptions = MemwatchOptions()  # what each rank is handed (`--interval`, `--no-scan`, `--guard`)
    save_path: str | None = None
    status_every_s: float | None = None  # the live status's period (None: 1 s on a terminal, else 10 s; 0: none)
    metrics_address: tuple[str, int] | None = None  # where to serve the ranks as Prometheus gauges, if anywhere
    tensorboard_dir: str | None = None  # where each rank's curves go as TensorBoard scalars, if anywhere


def exit_status(returncode: int) -> int:
    """The shell's convention: a child killed by signal N exits the watcher with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _terminal_sent_it_to_the_group() -> bool:
    """A Ctrl-C typed in the terminal reaches every process of the foreground group, the command
    included: forwarding it again would interrupt the command's own clean-up."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


class SignalForwarder:
    """While installed, SIGINT and SIGTERM sent to the watcher go to the command; restored on exit."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self._child = child
        self._previous: dict[int, object] = {}

    def _forward(self, number: int, frame: FrameType | None) -> None:
        if number == signal.SIGINT and _terminal_sent_it_to_the_group():
            return
        try:
            self._child.send_signal(number)
        except OSError:
            pass

    def __enter__(self) -> SignalForwarder:
        for number in FORWARDED_SIGNALS:
            self._previous[number] = signal.signal(number, self._forward)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]  # what signal() returned before


class CommandFailed(Exception):
    """The watched command did not succeed: the report's status says so (its error is this message)."""


def ending_of(returncode: int) -> BaseException | None:
    """What ended the watched command, as the exception a session's report is told about."""
    if returncode == 0:
        return None
    if returncode in (-signal.SIGINT, 128 + signal.SIGINT):
        return KeyboardInterrupt("the command was interrupted")
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return CommandFailed(f"the command was killed by {name}")
    return CommandFailed(f"the command exited with status {returncode}")


def run_watched(options: WatchOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run the command under a watching session; print (and save) the report; the command's exit status."""
    from ..session.live_view import FanOut
    from .watch_metrics import MetricsEndpoint, MetricsUnavailable, RankBoard
    from .watch_status import TerminalStatus
    from ..integrations.tensorboard import LoggerUnavailable, RankScalarLog

    listeners: list[Listener] = [] if options.status_every_s == 0 else [TerminalStatus(err, options.status_every_s)]
    endpoint = None
    if options.metrics_address is not None:
        board = RankBoard()
        try:
            endpoint = MetricsEndpoint(board, *options.metrics_address)
        except MetricsUnavailable as exc:
            print(f"torchmem_magic watch: {exc}", file=err)
            return 2
        print(f"torchmem_magic watch: the ranks' gauges at {endpoint.url}", file=err, flush=True)
        listeners.append(board)
    if options.tensorboard_dir is not None:
        try:  # checked before the command runs: nothing runs without the log it was asked for
            listeners.append(RankScalarLog(Path(options.tensorboard_dir)))
        except LoggerUnavailable as exc:
            print(f"torchmem_magic watch: {exc}", file=err)
            return 2
    listener = listeners[0] if len(listeners) == 1 else FanOut(listeners) if listeners else None
    try:
        return _watch(options, listener, out, err)
    finally:
        if endpoint is not None:
            endpoint.close()


def _watch(options: WatchOptions, listener: Listener | None, out: TextIO, err: TextIO) -> int:
    from ..core.options import SessionOptions
    from ..report.saved import save_report
    from ..session.run import MemwatchSession

    session = MemwatchSession(SessionOptions(options.ranks.interval_ms, train_hooks=False, watch_ranks=True), listener=listener)
    session.start()
    try:
        assert session.ranks is not None
        env = watched_environment(os.environ, session.ranks.address, options.ranks)
        child = subprocess.Popen(list(options.command), env=env)
    except OSError as exc:
        session.stop(exc)
        print(f"torchmem_magic watch: cannot run {options.command[0]!r}: {exc.strerror or exc}", file=err)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    except BaseException as exc:
        session.stop(exc)
        raise
    try:
        returncode = _wait(child)
    except BaseException as exc:  # the watcher itself failed: the command must not outlive it unwatched
        child.kill()
        child.wait()
        session.stop(exc)
        raise
    report = session.stop(ending_of(returncode))
    _print_report(report, options, out, err)
    problem = None if session.ranks is None else session.ranks.store_problem
    if problem:
        print(f"torchmem_magic watch: {problem}: the other nodes' ranks are not all in this report", file=err)
    if options.save_path:
        try:
            save_report(report, options.save_path)
        except (OSError, ValueError) as exc:
            print(f"torchmem_magic watch: cannot save the report: {exc}", file=err)
            return exit_status(returncode) or 1
    return exit_status(returncode)


def _wait(child: subprocess.Popen[bytes]) -> int:
    """The command's return code; the watcher's SIGINT and SIGTERM go to it meanwhile."""
    with SignalForwarder(child):
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # another handler replaced ours (a debugger): keep waiting
                continue


def _print_report(report: Report, options: WatchOptions, out: TextIO, err: TextIO) -> None:
    print(report, file=out, flush=True)
    if report.ranks is None:
        print(
            "torchmem_magic watch: no process of the command made a training step "
            "(one that trains must run on a Python that can import torchmem_magic)",
            file=err,
        )


def command_of(arguments: Sequence[str]) -> tuple[str, ...]:
    """The command after `--` (argparse keeps the separator in a REMAINDER)."""
    args = list(arguments)
    if args and args[0] == "--":
        args = args[1:]
    return tuple(args)
