"""The static figure (inline SVG), the text sparklines and the one-line reprs, on synthetic timelines:
bounded in bytes however long the run, peaks kept, epochs and ranks drawn, valid XML, no scripts."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from test_render_golden import full_memcheck, full_report, minimal_report
from test_saved import _rank

from torchmem_magic.core.model import STEP_CLOCKS
from torchmem_magic.render.static import MAX_POINTS, bucket_max, embedded_figure, figure_svg, nice_ticks, sparkline_lines
from torchmem_magic.render.text import report_html, sparkline
from torchmem_magic.render.results import Report
from torchmem_magic.core.timeline import Timeline

MIB = 1 << 20
SVG = "{http://www.w3.org/2000/svg}"


def _timeline(steps: int, epochs: int = 3, spike_at: int | None = None) -> Timeline:
    """A heap leaking 1 MiB/step over a flat RAM, sampled at every step; `epochs` loader passes."""
    timeline = Timeline()
    per_epoch = max(steps // epochs, 1)
    for step in range(steps):
        if step % per_epoch == 0 and step // per_epoch < epochs:
            timeline.add_pass(step * 0.01, loader=0, steps=tuple(step for _ in STEP_CLOCKS))
        heap = 100 * MIB + step * MIB + (500 * MIB if step == spike_at else 0)
        row = {"t_s": step * 0.01, "step": float(step), "ram_bytes": 400.0 * MIB + step * MIB, "heap_bytes": float(heap)}
        timeline.by_time.append(row)
        timeline.by_step.append(row)
    timeline.add_pass(steps * 0.01, loader=1, steps=tuple(0 for _ in STEP_CLOCKS))  # a validation pass: no line
    return timeline


def _report(steps: int, **changes: object) -> Report:
    return replace(full_report(), steps=steps, epochs=3, clock="optimizer", timeline=_timeline(steps), **changes)


def _points(svg: str) -> list[int]:
    root = ET.fromstring(svg)
    return [len(p.get("points", "").split()) for p in root.iter(f"{SVG}polyline")]


def test_the_figure_is_valid_svg_with_the_curves_epochs_and_verdict() -> None:
    svg = figure_svg(_report(200))
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    titles = [p.findtext(f"{SVG}title") for p in root.iter(f"{SVG}polyline")]
    assert titles == ["RAM (process tree)", "heap in use"]
    epochs = [line for line in root.iter(f"{SVG}line") if line.get("class") == "epoch"]
    assert len({line.get("x1") for line in epochs}) == 3  # the training loader's passes, not the validation loader's
    verdict = next(t for t in root.iter(f"{SVG}text") if t.get("class") == "verdict")
    assert verdict.text is not None and verdict.text.startswith("verdict: leak")
    assert "optimizer step" in svg and "<script" not in svg


def test_the_figure_stays_small_however_long_the_run() -> None:
    short, long = figure_svg(_report(200)), figure_svg(_report(100_000))
    assert max(_points(long)) <= MAX_POINTS
    assert len(long.encode()) < 16_000 and len(short.encode()) < 16_000


def test_decimation_keeps_the_peaks() -> None:
    x = [float(i) for i in range(10_000)]
    y = [1.0] * 10_000
    y[5_001] = 99.0
    xs, ys = bucket_max(x, y, 100)
    assert len(xs) == 100 and max(ys) == 99.0 and xs[0] == 0.0
    assert bucket_max([0.0, 1.0, math.nan], [1.0, math.nan, 3.0]) == ((0.0,), (1.0,))


def test_each_curve_has_its_own_scale_so_a_small_leak_shows() -> None:
    from torchmem_magic.render.static import Curve, y_range

    low, high = y_range([Curve("heap", "#000", (0.0, 1.0), (100.0 * MIB, 104.0 * MIB))])
    assert 90 * MIB < low < 100 * MIB and 104 * MIB < high < 110 * MIB  # the 4 MiB rise fills the strip
    flat_low, flat_high = y_range([Curve("ram", "#000", (0.0, 1.0), (300.0 * MIB, 300.0 * MIB + 10))])
    assert flat_high - flat_low >= 4 * MIB  # noise is not blown up to the strip's height


def test_nice_ticks() -> None:
    assert nice_ticks(0, 100) == [0, 25, 50, 75, 100]
    assert nice_ticks(0, 0.9) == [0, 0.25, 0.5, 0.75]


def test_ranks_get_their_own_panel_worst_first() -> None:
    ranks = tuple(replace(_rank(i, "leak" if i == 1 else "clean", 65_536.0 if i == 1 else None), timeline=_timeline(50)) for i in range(3))
    svg = figure_svg(_report(50, ranks=ranks, worst_rank=1))
    titles = [p.findtext(f"{SVG}title") for p in ET.fromstring(svg).iter(f"{SVG}polyline")]
    assert titles == ["RAM (process tree)", "heap in use", "rank 1 (worst)", "rank 0", "rank 2"]
    assert "ranks: heap in use" in svg and "worst rank 1" in svg


def test_no_timeline_no_figure() -> None:
    report = minimal_report()
    assert figure_svg(report) == "" and report._repr_html_() == report_html(report)
    assert sparkline_lines(report) == []


def test_the_html_repr_holds_the_figure_above_the_table_as_an_image() -> None:
    report = _report(200)
    html = report._repr_html_()
    assert html.index("<img class='torchmem-figure'") < html.index("<table>")
    assert "<svg" not in html  # inline SVG would be stripped to its text in an untrusted notebook
    assert embedded_figure(html) == figure_svg(report) and "alt='verdict: leak" in html


def test_sparklines() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁" and sparkline([]) == ""
    assert sparkline([0, 1, 0, 1], min_span=7) == "▁▂▁▂"  # noise stays low
    lines = sparkline_lines(_report(200))
    assert [line.split()[0] for line in lines] == ["RAM", "heap"]
    assert lines[1].split()[1].startswith("▁") and lines[1].split()[1].endswith("█")
    assert "100.0 MiB → " in lines[1] and "\n" not in "".join(lines)
    pretty = pytest.importorskip("IPython.lib.pretty").pretty  # the core runs without IPython too

    text = pretty(_report(200))
    assert text.splitlines()[1].strip().startswith("RAM") and "heap  " in text
    assert "▁" not in str(_report(200))  # print(): the same text before saving and after loading


def test_one_line_reprs() -> None:
    leak = replace(full_report(), status="ok")
    assert repr(leak) == "<Report: leak · 200 steps · heap +1.0 MiB/step>", repr(leak)
    assert repr(full_report()).startswith("<Report: leak (error) · ")
    assert repr(replace(leak, verdict="clean", resource=None)) == "<Report: clean · 200 steps>"
    assert repr(replace(minimal_report(), clock="time", wall_s=2.0, verdict="unknown")) == "<Report: unknown · 2.0 s>"
    ranks = (_rank(0, "clean", None), _rank(1, "leak", 65_536.0))
    assert repr(replace(leak, ranks=ranks, worst_rank=1)).endswith("· worst rank 1>")
    assert repr(replace(leak, verdict="clean", resource=None, ranks=ranks)) == "<Report: clean · 200 steps · 2 ranks>"
    assert repr(full_memcheck()) == "<MemcheckResult: state · 6 tensors · 6.9 MiB retained>"


def test_save_html_is_offline_with_the_figure_and_refuses_other_suffixes(tmp_path: Path) -> None:
    report = _report(200)
    report.save(tmp_path / "run.html")
    page = (tmp_path / "run.html").read_text(encoding="utf-8")
    assert "<polyline" in embedded_figure(page)
    assert "<script" not in page and "http://" not in page and "https://" not in page
    with pytest.raises(ValueError, match=r"'\.png'.*\.json or \.html"):
        report.save(tmp_path / "run.png")


def test_a_sparkline_gives_each_character_an_equal_stretch_of_the_run() -> None:
    from torchmem_magic.render.static import evenly_bucketed

    steps = [*range(1, 65), *range(100, 1001, 100)]  # the first steps sampled densely, then every 100th
    heap = [float(s) for s in steps]  # a steady leak
    buckets = evenly_bucketed(steps, heap, 10)
    assert len(buckets) == 10 and list(buckets) == sorted(buckets)
    assert 400 <= buckets[4] <= 600  # the middle of the run, not the dense start's last sample
    assert evenly_bucketed([0.0, 5.0], [1.0, 2.0], 4) == (1.0, 1.0, 1.0, 2.0)  # empty stretches repeat the last


def test_a_steady_leak_climbs_evenly_in_the_reports_sparkline() -> None:
    import dataclasses

    from torchmem_magic.render.static import sparkline_lines
    from torchmem_magic.core.timeline import Timeline

    timeline = Timeline()
    for step in [*range(1, 65), *range(100, 3001, 100)]:  # dense first steps, then a sample every 100
        row = {"t_s": step / 100, "step": float(step), "ram_bytes": 3e8 + step * 65536.0, "heap_bytes": 1e8 + step * 65536.0}
        timeline.by_step.append(row)
        timeline.by_time.append(row)
    report = dataclasses.replace(full_report(), timeline=timeline, clock="optimizer")
    heap = next(line for line in sparkline_lines(report) if line.startswith("heap"))
    bars = heap.split()[1]
    assert bars[len(bars) // 2] in "▃▄▅", heap  # the middle of the run is half way up, not flat then a jump
