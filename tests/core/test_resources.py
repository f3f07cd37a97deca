"""The table of resources: the columns, the wire format, the detector, the guard and the curves all come
from it, so one new row reaches every one of them, and the published formats stay what they were."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from torchmem_magic.core import resources
from torchmem_magic.stream.protocol import row_of, row_values
from torchmem_magic.render.static import CURVES
from torchmem_magic.report.rates import RATE_COLUMNS
from torchmem_magic.core.timeline import COLUMNS
from torchmem_magic.analysis.verdict import RESOURCE_ORDER

#: the rank wire format's and the flight record's values, in order: records written before stay readable
PUBLISHED_COLUMNS = (
    "t_s", "step", "ram_bytes", "rss_bytes", "heap_bytes", "workers_bytes", "workers",
    "vram_allocated_bytes", "vram_reserved_bytes", "shm_used_bytes",
)


def test_the_columns_are_the_published_ones_in_their_order() -> None:
    assert COLUMNS == PUBLISHED_COLUMNS


def test_keys_and_columns_are_unique() -> None:
    keys = [r.key for r in resources.RESOURCES]
    columns = [r.column for r in resources.RESOURCES]
    assert len(set(keys)) == len(keys) and len(set(columns)) == len(columns)
    assert resources.by_key("vram_reserved").reported == "vram"


def test_the_readers_take_their_resources_from_the_table() -> None:
    assert RESOURCE_ORDER == ("heap", "vram", "ram", "shm")
    assert RATE_COLUMNS == {"ram": "ram_bytes", "heap": "heap_bytes", "vram": "vram_allocated_bytes", "shm": "shm_used_bytes"}
    assert [c for c, _, _ in CURVES] == [
        "ram_bytes", "heap_bytes", "workers_bytes", "vram_allocated_bytes", "vram_reserved_bytes", "shm_used_bytes",
    ]  # the kernel's own RSS only in the live figure


#: run in a fresh interpreter: a row appended to the table before any reader is imported
XPU_ROW = """
    import dataclasses, json, math
    from torchmem_magic.core import resources
    xpu = resources.Resource("xpu", "xpu_allocated_bytes", "XPU allocated", "XPU", "device", leak_rank=9,
                             limit="device", colour="#17becf")
    resources.RESOURCES = (*resources.RESOURCES, xpu)
"""


def _run(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(XPU_ROW) + textwrap.dedent(code)],
                         capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_a_new_row_reaches_the_columns_the_wire_the_detector_and_the_figure() -> None:
    result = _run("""
        from torchmem_magic.core.timeline import COLUMNS, Timeline
        from torchmem_magic.stream.protocol import row_of, row_values
        from torchmem_magic.render.static import CURVES
        from torchmem_magic.report.assemble import diagnose
        from torchmem_magic.report.rates import RATE_COLUMNS
        from torchmem_magic.analysis.verdict import RESOURCE_ORDER
        timeline = Timeline()
        for step in range(40):
            row = {"t_s": step * 0.1, "step": float(step), "ram_bytes": 1e9, "xpu_allocated_bytes": 1e6 + step * 4e6}
            timeline.by_step.append(row_of(row_values(row)))  # through the wire format
            timeline.by_time.append(row)
        diagnosis = diagnose(timeline, 40, 4.0, ram_limit_bytes=8e9, vram_limit_bytes=16e9)
        old = Timeline()
        old.by_time.append(row_of([0.5, 3.0, 1e9]))  # a record written before the row existed
        print(json.dumps({"columns": COLUMNS, "curves": [c for c, _, _ in CURVES], "rates": RATE_COLUMNS,
                          "order": RESOURCE_ORDER, "verdict": diagnosis.verdict, "resource": diagnosis.resource,
                          "old_xpu_is_nan": math.isnan(old.by_time.last_value("xpu_allocated_bytes")),
                          "old_ram": old.by_time.last_value("ram_bytes")}))
    """)
    assert result["columns"] == [*PUBLISHED_COLUMNS, "xpu_allocated_bytes"]
    assert "xpu_allocated_bytes" in result["curves"]  # type: ignore[operator]
    assert result["rates"] == {**RATE_COLUMNS, "xpu": "xpu_allocated_bytes"}
    assert result["order"] == [*RESOURCE_ORDER, "xpu"]
    assert (result["verdict"], result["resource"]) == ("leak", "xpu")
    assert result["old_xpu_is_nan"] is True and result["old_ram"] == 1e9


def test_old_rows_replay_in_the_published_order() -> None:
    values = [0.5, 3.0, 100.0, 90.0, 80.0, 70.0, 2.0, 60.0, 65.0, None]
    row = row_of(values)
    assert row["heap_bytes"] == 80.0 and row["workers"] == 2.0 and row["vram_reserved_bytes"] == 65.0
    assert row_values(row)[:-1] == values[:-1] and json.dumps(row_values(row)).endswith("null]")
