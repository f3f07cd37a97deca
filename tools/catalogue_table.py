"""Run the holder catalogue's kernel test RUNS times and write its table, with each loop's pass count, into
docs/leak-finder.md (between the catalogue markers).

    python tools/catalogue_table.py [RUNS]      (default 3; `make catalogue` runs it)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
from holder_catalogue import CATALOGUE, Loop  # noqa: E402

PAGE = REPO / "docs" / "leak-finder.md"
START, END = "<!-- catalogue:start -->\n", "<!-- catalogue:end -->"
TEST = "tests/kernel/test_holder_catalogue.py"
_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR) \S+\[(\w+)\]")


def passes(runs: int) -> dict[str, int]:
    """How many of `runs` runs of the catalogue test each loop passed."""
    counts = dict.fromkeys(CATALOGUE, 0)
    for run in range(1, runs + 1):
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", TEST],
                              cwd=REPO, capture_output=True, text=True)
        for line in done.stdout.splitlines():
            found = _OUTCOME.match(line)
            if found and found[1] == "PASSED" and found[2] in counts:
                counts[found[2]] += 1
        print(f"run {run}: {done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.returncode}")
    return counts


def _expected(loop: Loop) -> str:
    if loop.verdict == "clean":
        return "clean"
    if loop.holder is None:
        return f"leak; no holder can be named: the advice says \"{(loop.said or '').strip('; ')}…\""
    return f"leak; `{loop.holder}` at `{loop.path}…`, freed by `{loop.release}`"


def table(counts: dict[str, int], runs: int) -> str:
    """The markdown table: each loop, the class of holder it stands for, what it must give, its passes."""
    rows = ["| loop | class | expected | passed |", "|---|---|---|---|"]
    rows += [f"| `{name}` | {loop.holder_class} | {_expected(loop)} | {counts[name]}/{runs} |"
             for name, loop in CATALOGUE.items()]
    return "\n".join(rows) + "\n"


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    counts = passes(runs)
    page = PAGE.read_text()
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(head + START + table(counts, runs) + END + tail)
    print(f"wrote the catalogue's table ({sum(counts.values())} of {runs * len(counts)} passed) into {PAGE}")


if __name__ == "__main__":
    main()
