"""The holder catalogue's table in the docs lists every loop of the catalogue as it is, with a pass count."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
from catalogue_table import END, PAGE, START, table  # noqa: E402
sys.path.insert(0, str(REPO / "examples"))
from holder_catalogue import CATALOGUE  # noqa: E402


def test_the_docs_table_is_the_catalogues_with_a_count_for_each_loop() -> None:
    shown = PAGE.read_text().split(START, 1)[1].split(END, 1)[0]
    counts = dict(re.findall(r"^\| `(\w+)` \|.*\| (\d+)/3 \|$", shown, re.MULTILINE))
    assert set(counts) == set(CATALOGUE), "run `make catalogue`: the table and the catalogue differ"
    assert shown == table({name: int(n) for name, n in counts.items()}, 3), "run `make catalogue`"
