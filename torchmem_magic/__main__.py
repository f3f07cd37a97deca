"""The command line: `python -m torchmem_magic watch [options] -- COMMAND ...`, `show PATH ...` and
`compare BASE NEW`.

`watch` runs a script or `torchrun ...` with every rank watched and prints the report; `show` prints
saved `.json` reports, several of them (one per node of a multi-node run) as one merged report;
`compare` says what changed between two saved runs, with exit status 1 when memory growth regressed.
Bad usage gives one line and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

USAGE_ERROR = 2


def _save_path(text: str) -> str:
    if not text.lower().endswith((".json", ".html", ".htm")):
        raise argparse.ArgumentTypeError(f"{text!r}: the report is saved as .json or .html")
    return text


def _status_period_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: the status period is 0 (none) to 3600 seconds")
    return value


def _metrics_address(text: str) -> tuple[str, int]:
    from .frontends.watch_metrics import parse_address

    try:
        return parse_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give PORT or ADDR:PORT, e.g. 9400 or 0.0.0.0:9400") from None


def parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(the command line's parser, its `watch` subcommand's)."""
    from .core.option_args import option_flags

    main = argparse.ArgumentParser(
        prog="python -m torchmem_magic", description="Watch the memory of a PyTorch training run, every rank of it."
    )
    commands = main.add_subparsers(dest="action", required=True, metavar="{watch,show,compare}")
    watch = commands.add_parser(
        "watch", help="run COMMAND (a script, torchrun ...) with every rank watched; print the report",
        usage="python -m torchmem_magic watch [options] -- COMMAND ...",
    )
    for flags, keywords in option_flags("watch"):  # --interval, --no-scan, --guard: each rank takes them
        watch.add_argument(*flags, **keywords)
    watch.add_argument("--save", type=_save_path, metavar="PATH", help="also write the report to PATH (.json or .html)")
    watch.add_argument("--status-every", type=_status_period_s, default=None, metavar="S",
                       help="the live status's period on stderr, in seconds (default: 1 on a terminal, kept at the "
                            "bottom of the screen; 10 otherwise, as plain lines; 0: no live status)")
    watch.add_argument("--prometheus", type=_metrics_address, default=None, metavar="[ADDR:]PORT",
                       help="serve every rank's gauges for Prometheus at http://ADDR:PORT/metrics (ADDR defaults to "
                            "127.0.0.1, this host only; needs prometheus_client)")
    watch.add_argument("--tensorboard", default=None, metavar="DIR",
                       help="write every rank's curves and leak rate as TensorBoard scalars, a run per rank "
                            "(DIR/rank0, DIR/rank1, ...); needs the tensorboard package")
    watch.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    show = commands.add_parser("show", help="print saved .json reports (several: merged into one)")
    show.add_argument("paths", nargs="+", metavar="PATH")
    compare = commands.add_parser(
        "compare", help="what changed between two saved runs; exit status 1 when memory growth regressed",
    )
    compare.add_argument("base", metavar="BASE.json")
    compare.add_argument("new", metavar="NEW.json")
    compare.add_argument("--tolerance", type=_percent, default=20.0, metavar="PCT",
                         help="a leak's growth per step may grow this much before it counts as a regression (default 20)")
    compare.add_argument("--peak-tolerance", type=_percent, default=None, metavar="PCT",
                         help="also fail when a peak grew by more than PCT percent (default: peaks are only shown)")
    return main, watch


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage") from None
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"{text!r}: a tolerance is 0 to 10000 percent")
    return value


def _compare(base: str, new: str, tolerance_pct: float, peak_tolerance_pct: float | None) -> int:
    from .report.compare import compare, comparison_text
    from .report.saved import load_report

    reports = []
    for path in (base, new):
        try:
            reports.append(load_report(path))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            print(f"torchmem_magic compare: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    peak = None if peak_tolerance_pct is None else peak_tolerance_pct / 100
    comparison = compare(reports[0], reports[1], tolerance_pct / 100, peak)
    print(comparison_text(comparison, base, new))
    return 1 if comparison.regressed else 0


def _show(paths: Sequence[str]) -> int:
    from .report.saved import load_report, merge_reports

    reports = []
    for path in paths:
        try:
            reports.append(load_report(path))
        except (OSError, ValueError, TypeError) as exc:
            print(f"torchmem_magic show: cannot read {path}: {exc}", file=sys.stderr)
            return 1
    print(merge_reports(reports))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the exit status (the watched command's, for `watch`)."""
    main_parser, watch_parser = parsers()
    arguments = main_parser.parse_args(argv)
    if arguments.action == "show":
        return _show(arguments.paths)
    if arguments.action == "compare":
        return _compare(arguments.base, arguments.new, arguments.tolerance, arguments.peak_tolerance)
    from .core.option_args import from_parsed
    from .frontends.command import WatchOptions, command_of, run_watched

    command = command_of(arguments.command)
    if not command:
        watch_parser.error("no command to watch: put it after --, e.g. -- torchrun --nproc-per-node 2 train.py")
    return run_watched(
        WatchOptions(command, from_parsed(arguments, "watch"), arguments.save, arguments.status_every,
                     arguments.prometheus, arguments.tensorboard)
    )


if __name__ == "__main__":
    sys.exit(main())
