"""A resource declared in this test alone, as a row of the resources table, reaches every reader:
the report's `to_dict()`, its text and HTML, a merged rank report (and its saved file), `compare`,
the ranks' Prometheus gauges and the live figure's series, with no other file changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

MIB = 2**20

#: run in a fresh interpreter: the row is appended to the table before any reader is imported
CODE = """
    import json, sys
    from torchmem_magic.core import resources
    xpu = resources.Resource("xpu", "xpu_allocated_bytes", "XPU allocated", "XPU", "device", summary="xpu",
                             report_row=5, leak_rank=9, limit="device", colour="#17becf")
    resources.RESOURCES = (*resources.RESOURCES, xpu)

    from dataclasses import replace
    from torchmem_magic.core.timeline import Timeline
    from torchmem_magic.frontends.watch_metrics import rank_samples
    from torchmem_magic.ranks.live import from_summary
    from torchmem_magic.render.text import report_html, report_text
    from torchmem_magic.report.assemble import assemble_report
    from torchmem_magic.report.compare import compare, comparison_text
    from torchmem_magic.report.evidence import RunEvidence
    from torchmem_magic.report.merge import summary_of, with_ranks
    from torchmem_magic.report.saved import report_from_dict
    from torchmem_magic.widgets.live import LiveFigure
    from idle_views import idle_view

    MIB = 2**20

    def run(xpu_per_step):
        timeline = Timeline()
        for step in range(60):
            row = {"t_s": step * 0.1, "step": float(step), "ram_bytes": 900.0 * MIB, "heap_bytes": 100.0 * MIB,
                   "xpu_allocated_bytes": 8.0 * MIB + step * xpu_per_step}
            timeline.by_step.append(row)
            timeline.by_time.append(row)
        evidence = RunEvidence(timeline=timeline, steps=60, wall_s=6.0, interval_s=0.1, ram_limit_bytes=64 << 30,
                               ram_limit_source="system", heap_available=True)
        return assemble_report(evidence)

    leaking, clean = run(4 * MIB), run(0.0)
    rank = summary_of(leaking, rank=1, pid=123, host="node-a")
    watcher = replace(clean, steps=0, clock="time", verdict="unknown", resource=None)
    merged = with_ranks(watcher, (rank,))
    figure = LiveFigure()
    figure.draw(idle_view(leaking.timeline).snapshot())
    comparison = compare(clean, leaking, peak_tolerance=0.5)
    print(json.dumps({
        "verdict": [leaking.verdict, leaking.resource], "dict": leaking.to_dict(),
        "text": report_text(leaking), "html": report_html(leaking),
        "merged": merged.to_dict(), "merged_text": report_text(merged),
        "saved_again": report_from_dict(merged.to_dict()).to_dict() == merged.to_dict(),
        "compare": comparison_text(comparison, "a.json", "b.json"),
        "gauges": rank_samples((from_summary(rank),))["rank_memory_bytes"][1],
        "labels": list(figure.labels),
    }))
"""


def _run() -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_a_resource_declared_once_reaches_every_reader() -> None:
    result = _run()
    assert result["verdict"] == ["leak", "xpu"]
    saved = result["dict"]
    assert isinstance(saved, dict)
    keys = list(saved)
    assert keys.index("xpu") == keys.index("workers") + 1  # beside the report's other summaries
    xpu = saved["xpu"]
    assert (xpu["start"], xpu["end"], xpu["peak"], xpu["limit"]) == (8 * MIB, 244 * MIB, 244 * MIB, None)
    assert abs(xpu["per_step"] - 4 * MIB) < 1e-6 * MIB
    text_row = next(line for line in str(result["text"]).splitlines() if "XPU allocated" in line)
    assert text_row.split() == ["XPU", "allocated", "8.0", "MiB", "244.0", "MiB", "244.0", "MiB", "+4.0", "MiB/step"]
    assert ">XPU allocated</td>" in str(result["html"]) and ">+4.0 MiB/step</td>" in str(result["html"])
    merged = result["merged"]
    assert isinstance(merged, dict)
    assert merged["ranks"][0]["xpu"]["per_step"] == xpu["per_step"]  # the rank's own
    assert merged["xpu"]["per_step"] is None  # the watcher's, without steps of its own
    merged_lines = str(result["merged_text"]).splitlines()
    header = next(line for line in merged_lines if line.strip().startswith("rank  pid"))
    assert header.split()[3:11] == ["RAM", "peak", "heap", "peak", "VRAM", "peak", "XPU", "peak"]
    assert "rank 1: leak (per-iteration), xpu +4.0 MiB/step" in merged_lines[-2]
    assert result["saved_again"] is True
    comparison = str(result["compare"])
    assert "regressed: run was clean, now leak at +4.0 MiB/step" in comparison
    assert "regressed: run's XPU peak 8.0 MiB → 244.0 MiB (tolerance 50%)" in comparison
    gauges = result["gauges"]
    assert isinstance(gauges, list)
    assert [labels["resource"] for labels, _ in gauges] == ["ram", "heap", "xpu"]
    assert gauges[-1][1] == 244 * MIB
    assert result["labels"] == ["RAM (process tree)", "heap in use", "XPU allocated"]
