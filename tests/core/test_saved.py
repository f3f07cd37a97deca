"""Saved reports: `.json` read back equal to what was saved (nested parts and ranks included), an
offline `.html` page, and several nodes' files merged into one report with the worst rank decided again."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import torchmem_magic
from torchmem_magic.core.model import HeapSummary, RamSummary, RankSummary, SourceErrors, Suspect, WorkerSummary
from torchmem_magic.render.results import Report
from torchmem_magic.report.saved import merge_reports, report_from_dict, save_report

MIB = 1 << 20


def _holder(name: str, rank: int | None, growth: float | None) -> Suspect:
    return Suspect(
        name, f"{name}[0]", "autograd-graph", 10, 20, 5 * MIB, True, f"{name}.append(out.detach())",
        growth_per_step=growth, series=((10, MIB), (20, 2 * MIB)), first_seen_step=0, rank=rank,
    )


def _rank(rank: int, verdict: str, growth: float | None, host: str = "node") -> RankSummary:
    holders = (_holder("kept", rank, growth),) if growth else ()
    return RankSummary(
        rank=rank, pid=1000 + rank, host=host, ram=RamSummary(100 * MIB, 120 * MIB, 130 * MIB, growth, 8 << 30, "system"),
        heap=HeapSummary(50 * MIB, 70 * MIB, 71 * MIB, growth), vram=None, steps=200, verdict=verdict,  # type: ignore[arg-type]
        leak_kind="per-iteration" if growth else None, resource="heap" if growth else None,
        steps_to_exhaustion=1e5 if growth else None, suspects=holders, per_step_bytes=growth,
        advice=("per-iteration leak in heap",) if growth else (), local_rank=0, last_seen_s=3.5, wall_s=3.0,
        timeline=object(),
    )


def _report(ranks: tuple[RankSummary, ...] | None = None, worst: int | None = None) -> Report:
    from test_render_golden import full_report  # the renderers' complete synthetic report

    report = full_report()
    return replace(
        report, ranks=ranks, worst_rank=worst, sporadic_steps=((3, 4),),
        source_errors=(SourceErrors("heap probe", 2, "OSError: gone"),),
        workers=WorkerSummary(2, 3 * MIB, 2, ({"pid": 7, "pss_peak": MIB, "uss_peak": MIB // 2},)),
        suspects=(*report.suspects, _holder("kept", 1, 65_536.0)), timeline=object(),
    )


def test_a_saved_report_reads_back_equal_with_its_nested_parts_and_ranks(tmp_path: Path) -> None:
    original = _report((_rank(0, "clean", None), _rank(1, "leak", 65_536.0)), worst=1)
    path = tmp_path / "run.json"
    save_report(original, path)
    loaded = torchmem_magic.load_report(path)
    assert type(loaded) is Report and loaded == original
    assert loaded.ranks is not None and loaded.ranks[1].suspects[0].series == ((10, MIB), (20, 2 * MIB))
    assert loaded.vram is not None and loaded.vram.per_device == original.vram.per_device  # type: ignore[union-attr]
    assert loaded.timeline is None and loaded.to_dict() == json.loads(path.read_text())


def test_single_process_report_without_optional_parts_round_trips() -> None:
    from test_render_golden import minimal_report

    original = minimal_report()
    assert report_from_dict(json.loads(json.dumps(original.to_dict()))) == original


def test_not_a_report_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="schema"):
        report_from_dict({"verdict": "leak"})
    bad = dict(_report().to_dict())
    del bad["ram"]
    with pytest.raises(ValueError, match="'ram'"):
        report_from_dict(bad)
    with pytest.raises(ValueError, match=".json or .html"):
        save_report(_report(), tmp_path / "run.txt")


def test_html_is_a_whole_offline_page(tmp_path: Path) -> None:
    path = tmp_path / "run.html"
    save_report(_report((_rank(0, "clean", None), _rank(1, "leak", 65_536.0)), worst=1), path)
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<meta charset='utf-8'>" in page and "val_outputs" in page and "kept" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page


def test_nodes_merge_into_one_report_that_names_the_leaking_rank() -> None:
    node0 = _report((_rank(0, "clean", None, host="a"),), worst=0)
    node1 = _report((_rank(1, "leak", 65_536.0, host="b"),), worst=1)
    merged = merge_reports([node0, node1])
    assert merged.ranks is not None and [r.rank for r in merged.ranks] == [0, 1]
    assert (merged.worst_rank, merged.verdict, merged.steps, merged.resource) == (1, "leak", 200, "heap")
    assert [s.name for s in merged.suspects] == ["kept"] and merged.suspects[0].rank == 1  # not the nodes' own
    assert any(line.startswith("rank 1: leak") for line in merged.advice)
    assert "merged from 2 saved reports" in merged.advice[-1]
    assert merge_reports([node0]) is node0
    text = str(merged)
    assert "worst rank: 1" in text and "kept" in text


def test_a_single_process_file_counts_as_one_rank_of_the_merge() -> None:
    from test_render_golden import minimal_report

    merged = merge_reports([_report((_rank(0, "clean", None),), worst=0), minimal_report()])
    assert merged.ranks is not None and [r.rank for r in merged.ranks] == [0, 1]
    assert merged.ranks[1].ram == minimal_report().ram
