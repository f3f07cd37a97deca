"""The top holder as the CI gate's message, the guard's message and each rank's live line name it:
the one rule (largest positive growth per step), so a shrinking holder is never "growing"."""

from __future__ import annotations

from dataclasses import dataclass, field

from torchmem_magic.frontends.gate import leak_message
from torchmem_magic.analysis.guard_rules import GuardTrip, Level
from torchmem_magic.render.advice.guard import guard_message
from torchmem_magic.tracing.guard import _top_holder
from torchmem_magic.core.model import RamSummary, RankSummary, Suspect
from torchmem_magic.stream.feed import RankFeed
from torchmem_magic.ranks.live import from_summary, judge_rank
from torchmem_magic.render.results import Report

MIB = 1 << 20
RAM = RamSummary(1 << 30, 1 << 30, 1 << 30, None, 64 << 30, "system")


def suspect(name: str, retained_mib: float, growth_mib: float | None) -> Suspect:
    growth = None if growth_mib is None else growth_mib * MIB
    return Suspect(name, f"{name}[0]", "autograd-graph", 4, 40, int(retained_mib * MIB), True, f"del {name}",
                   growth_per_step=growth)


BIG_FLAT, SHRINKING, KEPT = suspect("big", 100, None), suspect("shrinking", 10, -1.0), suspect("kept", 1, 0.5)


def leak_report(*suspects: Suspect) -> Report:
    return Report("ok", 2.0, 200, 0.01, 200, 1, RAM, None, None, None, None, verdict="leak",
                  leak_kind="per-iteration", resource="heap", suspects=suspects, advice=("per-iteration leak in heap",))


def test_the_gate_names_the_growing_holder_else_the_largest_never_a_shrinking_one() -> None:
    holder_line = leak_message(leak_report(SHRINKING, BIG_FLAT)).splitlines()[1]
    assert holder_line.startswith("top holder: big autograd-graph, 100.0 MiB retained"), holder_line
    holder_line = leak_message(leak_report(SHRINKING, BIG_FLAT, KEPT)).splitlines()[1]
    assert holder_line.startswith("top holder: kept +512.0 KiB/step, autograd-graph"), holder_line


@dataclass
class Session:
    """What the guard reads of a session: its holders so far and the live holder line."""

    suspects: tuple[Suspect, ...]
    live: str | None = None
    clock: str = "optimizer"
    steps: int = 100
    elapsed_s: float = 1.0
    raised: list[BaseException] = field(default_factory=list)

    def holders_so_far(self) -> tuple[dict[str, list[tuple[int, int]]], tuple[Suspect, ...]]:
        return {}, self.suspects

    def live_holder(self) -> str | None:
        return self.live

    def raise_at_step(self, exc: BaseException) -> None:
        self.raised.append(exc)


def test_the_guards_message_never_names_a_shrinking_holder() -> None:
    assert _top_holder(Session((SHRINKING, BIG_FLAT))) is None  # nothing grows, no live line yet
    assert _top_holder(Session((SHRINKING,), live="kept +1.0 MiB/step, tensors")) == "kept +1.0 MiB/step, tensors"
    assert _top_holder(Session((SHRINKING, KEPT))) == "kept +512.0 KiB/step, autograd-graph — fix: del kept"
    level = Level("RAM", 95 * MIB, 100 * MIB, "system", per_s_bytes=MIB, per_step_bytes=MIB)
    text = guard_message(GuardTrip(level, 0.9, False, 0.0), "optimizer", _top_holder(Session((SHRINKING, BIG_FLAT))))
    assert "shrinking" not in text and "top holder so far: none named yet" in text


def test_a_ranks_live_line_never_names_a_shrinking_holder() -> None:
    feed = RankFeed(11, rank=1, offset_s=0.5, ram_limit_bytes=64 << 30, heap_available=True,
                    clock="optimizer", counts={"optimizer": 120}, elapsed_s=1.2)
    feed.holder_series = {"shrinking": [(s, (200 - s) * MIB) for s in range(10, 130, 10)]}
    assert judge_rank(feed, 1).holder is None
    feed.holder_series["kept"] = [(s, s * 65536) for s in range(10, 130, 10)]
    assert judge_rank(feed, 1).holder == "kept"


def test_a_finished_ranks_live_line_follows_the_report_rule() -> None:
    def summary(verdict: str, *suspects: Suspect) -> RankSummary:
        return RankSummary(1, 1001, "node0", RAM, None, None, 200, verdict, None, None, None, suspects)  # type: ignore[arg-type]

    assert from_summary(summary("leak", SHRINKING, BIG_FLAT)).holder == "big"  # held by the largest
    assert from_summary(summary("clean", SHRINKING, BIG_FLAT)).holder is None
    assert from_summary(summary("clean", SHRINKING, KEPT)).holder == "kept"
