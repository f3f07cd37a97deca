"""One rule for "the top holder": the largest positive growth per step, never a shrinking holder,
and the pure places that name one (the live line, a rank's line, the ranks table, the figure's
verdict line) all follow it."""

from __future__ import annotations

from torchmem_magic.analysis.holder_trends import HolderTrend, grows, largest_holder, top_holder, top_trend
from torchmem_magic.render.advice.holders import live_holder_line
from torchmem_magic.render.advice.ranks import rank_line
from torchmem_magic.core.model import RamSummary, RankSummary, ReportData, Suspect
from torchmem_magic.render.static import verdict_line
from torchmem_magic.render.text import ranks_text

MIB = 1 << 20


def suspect(name: str, retained_mib: float, growth_mib: float | None) -> Suspect:
    growth = None if growth_mib is None else growth_mib * MIB
    return Suspect(name, f"{name}[0]", "autograd-graph", 4, 40, int(retained_mib * MIB), True, f"del {name}",
                   growth_per_step=growth)


def trend(name: str, growth_mib: float | None, growing: bool, last_mib: float = 10.0) -> HolderTrend:
    growth = None if growth_mib is None else growth_mib * MIB
    return HolderTrend(name, growth, growing, not growing, int(last_mib * MIB))


#: the largest holder does not grow, a smaller one shrinks: nothing grows here
BIG_FLAT, SHRINKING = suspect("big", 100, 0.0), suspect("shrinking", 10, -1.0)
UNMEASURED = suspect("unmeasured", 50, None)


def rank(verdict: str, suspects: tuple[Suspect, ...]) -> RankSummary:
    ram = RamSummary(1 << 30, 1 << 30, 1 << 30, None, 64 << 30, "system")
    return RankSummary(1, 1001, "node0", ram, None, None, 200, verdict, "per-iteration" if verdict == "leak" else None,  # type: ignore[arg-type]
                       "heap" if verdict == "leak" else None, None, suspects, per_step_bytes=MIB if verdict == "leak" else None)


def report(verdict: str, suspects: tuple[Suspect, ...]) -> ReportData:
    ram = RamSummary(1 << 30, 1 << 30, 1 << 30, None, 64 << 30, "system")
    return ReportData("ok", 2.0, 200, 0.01, 200, 1, ram, None, None, None, None, verdict=verdict,  # type: ignore[arg-type]
                      suspects=suspects)


# ----------------------------------------------------------------------------- the rule


def test_the_top_holder_is_the_fastest_growing_and_a_shrinking_one_never_grows() -> None:
    slow, fast = suspect("slow", 200, 0.5), suspect("fast", 5, 2.0)
    assert top_holder([BIG_FLAT, SHRINKING, slow, fast, UNMEASURED]) is fast
    assert top_holder([BIG_FLAT, SHRINKING, UNMEASURED]) is None  # nothing grows: nobody is named
    assert not grows(SHRINKING) and not grows(BIG_FLAT) and not grows(UNMEASURED) and grows(slow)


def test_when_none_grows_a_caller_that_must_name_one_gets_the_largest() -> None:
    assert top_holder([SHRINKING, UNMEASURED, BIG_FLAT], or_largest=True) is BIG_FLAT
    assert top_holder([SHRINKING], or_largest=True) is SHRINKING  # named as the largest, not as growing
    assert top_holder([], or_largest=True) is None and largest_holder([]) is None


def test_ties_go_to_the_larger_holder_then_by_name() -> None:
    a, b, c = suspect("a", 10, 1.0), suspect("b", 20, 1.0), suspect("c", 20, 1.0)
    assert top_holder([a, c, b]) is b
    assert largest_holder([a, c, b]) is b


def test_trends_count_only_once_judged_growing() -> None:
    clear = trend("clear", 0.5, growing=True)
    unclear = trend("unclear", 3.0, growing=False)  # positive slope, not yet a clear trend
    shrinking = trend("shrinking", -2.0, growing=False)
    assert top_trend([shrinking, unclear, clear]) is clear
    assert top_trend([shrinking, unclear]) is None


# ----------------------------------------------------------------------------- the places that name one


def test_the_live_status_line_never_names_a_shrinking_holder() -> None:
    """What session.live_holder shows as 'growing: ...' in the status line."""
    kinds = {"history": "autograd-graph"}
    assert live_holder_line([trend("history", -1.0, growing=False)], kinds, "optimizer") is None
    line = live_holder_line([trend("history", -1.0, growing=False), trend("kept", 0.5, growing=True)], kinds, "optimizer")
    assert line == "kept +512.0 KiB/step, tensors"


def test_a_ranks_line_says_held_by_the_largest_never_grows_by_a_negative_rate() -> None:
    line = rank_line(rank("leak", (BIG_FLAT, SHRINKING)))
    assert line.endswith("; held by big") and "grows -" not in line
    assert rank_line(rank("clean", (BIG_FLAT, SHRINKING))) == "rank 1: clean"
    growing = rank_line(rank("leak", (BIG_FLAT, SHRINKING, suspect("kept", 1, 1.0))))
    assert growing.endswith("; kept grows +1.0 MiB/step")


def test_the_ranks_table_names_the_top_holder_by_the_rule() -> None:
    def holder_cell(summary: RankSummary) -> str:
        row = ranks_text((summary,))[2]
        return row.split("  ")[-1].strip()

    assert holder_cell(rank("leak", (BIG_FLAT, SHRINKING))) == "big"
    assert ranks_text((rank("clean", (BIG_FLAT, SHRINKING)),))[2].rstrip().endswith("clean")  # no holder named


def test_the_figures_verdict_line_is_held_by_the_largest_when_none_grows() -> None:
    assert verdict_line(report("leak", (BIG_FLAT, SHRINKING))).endswith("held by big")
    assert verdict_line(report("leak", (BIG_FLAT, SHRINKING, suspect("kept", 1, 1.0)))).endswith("held by kept")
