"""Suspects are largest first (`retained_bytes`, then name, path, rank) wherever they come from:
a scan, the report's assembly, a merge of ranks, a saved file read back."""

from __future__ import annotations

import json
from dataclasses import replace

from test_report import MIB, evidence, timeline

from torchmem_magic.report.merge import with_ranks
from torchmem_magic.core.model import MemcheckData, RamSummary, RankSummary, ReportData, Suspect, by_retained
from torchmem_magic.report.assemble import assemble_report
from torchmem_magic.report.saved import report_from_dict
from torchmem_magic.finder.scan.results import RootStats
from torchmem_magic.finder.suspects import grown_place, suspects_from_stats

RAM = RamSummary(1 << 30, 1 << 30, 1 << 30, None, 64 << 30, "system")


def suspect(name: str, retained_mib: float, rank: int | None = None, path: str | None = None) -> Suspect:
    return Suspect(name, path or f"{name}[0]", "autograd-graph", 4, 40, int(retained_mib * MIB), True, f"del {name}",
                   rank=rank)


def sizes(suspects: tuple[Suspect, ...] | list[Suspect]) -> list[tuple[str, int]]:
    return [(s.name, s.retained_bytes) for s in suspects]


def is_largest_first(suspects: tuple[Suspect, ...] | list[Suspect]) -> bool:
    return all(a.retained_bytes >= b.retained_bytes for a, b in zip(suspects, suspects[1:]))


SMALL, LARGE, MIDDLE = suspect("small", 1), suspect("large", 9), suspect("middle", 4)


def test_the_order_is_by_retained_bytes_then_name_path_and_rank() -> None:
    assert [s.name for s in by_retained([SMALL, LARGE, MIDDLE])] == ["large", "middle", "small"]
    tied = [suspect("b", 2), suspect("a", 2, rank=1), suspect("a", 2), suspect("a", 2, path="a.x"), suspect("a", 2, rank=0)]
    assert [(s.name, s.path, s.rank) for s in by_retained(tied)] == [
        ("a", "a.x", None), ("a", "a[0]", None), ("a", "a[0]", 0), ("a", "a[0]", 1), ("b", "b[0]", None),
    ]


def test_every_result_holds_its_suspects_largest_first_whoever_built_it() -> None:
    report = ReportData("ok", 1.0, 10, 0.1, 10, 1, RAM, None, None, None, None, suspects=(SMALL, LARGE, MIDDLE))
    assert sizes(report.suspects) == sizes((LARGE, MIDDLE, SMALL))
    assert sizes(replace(report, suspects=(MIDDLE, SMALL, LARGE)).suspects) == sizes((LARGE, MIDDLE, SMALL))
    rank = RankSummary(1, 1001, "node0", RAM, None, None, 10, "clean", None, None, None, (SMALL, LARGE))
    assert [s.name for s in rank.suspects] == ["large", "small"]
    check = MemcheckData("*", 0, 0, 0, 0, 0, (), False, (), (), suspects=(SMALL, MIDDLE))
    assert [s.name for s in check.suspects] == ["middle", "small"]


def test_a_scans_suspects_are_largest_first() -> None:
    def holder(name: str, tensor_bytes: int) -> RootStats:
        return RootStats(name, "user", name, "list", tensors=4, tensor_bytes=tensor_bytes, graph_tensors=4, graph_nodes=8)

    found = suspects_from_stats([holder("small", MIB), holder("large", 9 * MIB), holder("middle", 4 * MIB)], [])
    assert [s.name for s in found] == ["large", "middle", "small"]


def test_the_assembled_report_is_largest_first() -> None:
    report = assemble_report(evidence(timeline(50), 50, suspects=(SMALL, LARGE, MIDDLE)))
    assert [s.name for s in report.suspects] == ["large", "middle", "small"]


def test_merged_ranks_suspects_are_largest_first_across_ranks() -> None:
    """The watcher's own holders, the worst rank's and the others' go into one list, in size order."""
    own = ReportData("ok", 1.0, 10, 0.1, 20, 1, RAM, None, None, None, None, clock="optimizer",
                     suspects=(suspect("own", 2),))
    worst = RankSummary(1, 1001, "node0", RAM, None, None, 20, "leak", "per-iteration", "heap", None,
                        (suspect("outputs", 1, rank=1),), per_step_bytes=MIB)
    other = RankSummary(0, 1000, "node0", RAM, None, None, 20, "clean", None, None, None, (suspect("cache", 6, rank=0),))
    merged = with_ranks(own, (worst, other))
    assert [(s.name, s.rank) for s in merged.suspects] == [("cache", 0), ("own", None), ("outputs", 1)]


def test_a_saved_report_read_back_is_largest_first() -> None:
    data = ReportData("ok", 1.0, 10, 0.1, 10, 1, RAM, None, None, None, None, suspects=(SMALL, LARGE)).to_dict()
    data["suspects"].reverse()  # a file written by an older version, or by hand
    assert [s["name"] for s in data["suspects"]] == ["small", "large"]
    loaded = report_from_dict(json.loads(json.dumps(data)))
    assert [s.name for s in loaded.suspects] == ["large", "small"] and is_largest_first(loaded.suspects)


def test_a_containers_many_small_items_outgrow_one_larger_place_filled_once() -> None:
    """A LightningModule whose list of (embedding, label) pairs grew by 50 items of 258 KiB, and whose
    optimizer's state (one place of 676 KiB) was filled at the first step: the holder is named at the list."""
    stats = RootStats("model", "user", "model", "Embedder")
    stats.places["model._trainer.optimizers[0].state[<Parameter>]"] = 692_376
    stats.places["model._trainer.dataset.tensors"] = 1_081_344
    for i in range(50):
        stats.places[f"model.validation_step_outputs[{i}]"] = 264_192
    before = {"model._trainer.dataset.tensors": 1_081_344}
    assert grown_place(stats, before) == "model.validation_step_outputs[49]"
    assert grown_place(stats, {**before, **{f"model.validation_step_outputs[{i}]": 264_192 for i in range(50)}}) == (
        "model._trainer.optimizers[0].state[<Parameter>]")  # the list was that full already: the state grew
