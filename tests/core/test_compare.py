"""`compare`: two saved runs, rank by rank; growth that regressed fails, the rest is said."""

from __future__ import annotations

from torchmem_magic.report.compare import compare, comparison_text
from torchmem_magic.core.model import RamSummary, RankSummary, ReportData, ShmSummary, Suspect

MIB, KIB = 2**20, 2**10


def _ram(peak_mib: float) -> RamSummary:
    return RamSummary(start_bytes=100 * MIB, end_bytes=int(peak_mib * MIB), peak_bytes=int(peak_mib * MIB),
                      per_step_bytes=None, limit_bytes=16 * 1024 * MIB, limit_source="system")


def _holder(name: str, rank: int | None = None) -> Suspect:
    return Suspect(name=name, path=f"{name}[0]", kind="autograd-graph", tensors=10, graph_nodes=20,
                   retained_bytes=8 * MIB, new_in_cell=True, fix=f"{name}.append(x.detach())", rank=rank)


def _rank(rank: int, verdict: str = "clean", rate_kib: float | None = None, peak_mib: float = 300.0,
          holders: tuple[str, ...] = (), clock: str = "optimizer") -> RankSummary:
    return RankSummary(
        rank=rank, pid=100 + rank, host="a", ram=_ram(peak_mib), heap=None, vram=None, steps=200, verdict=verdict,
        leak_kind="per-iteration" if verdict == "leak" else None, resource="heap" if rate_kib else None,
        steps_to_exhaustion=None, suspects=tuple(_holder(h, rank) for h in holders), clock=clock,  # type: ignore[arg-type]
        per_step_bytes=None if rate_kib is None else rate_kib * KIB,
    )


def _run(*ranks: RankSummary) -> ReportData:
    worst = max(ranks, key=lambda r: r.verdict == "leak")
    return ReportData(status="ok", wall_s=10.0, samples=100, interval_s=0.1, steps=200, epochs=0, ram=_ram(50.0),
                      heap=None, vram=None, shm=None, workers=None, verdict=worst.verdict, ranks=ranks,
                      worst_rank=worst.rank)


def test_a_rank_that_starts_leaking_is_a_regression_named_with_its_rate_and_holder() -> None:
    base = _run(_rank(0), _rank(1))
    new = _run(_rank(0), _rank(1, "leak", 64.0, peak_mib=340, holders=("kept_outputs",)))
    result = compare(base, new)
    assert result.regressed
    assert [c.regressions for c in result.changes] == [(), ("rank 1 was clean, now leak at +64.0 KiB/step",)]
    text = comparison_text(result, "a.json", "b.json")
    row = next(line.split("  ") for line in text.splitlines() if line.startswith("  rank 1"))
    assert [cell.strip() for cell in row if cell.strip()] == [
        "rank 1", "300.0 MiB → 340.0 MiB (+13.3%)", "flat → +64.0 KiB/step", "clean → leak", "+kept_outputs",
    ]
    assert text.endswith("  regressed: rank 1 was clean, now leak at +64.0 KiB/step")
    assert not compare(new, base).regressed  # the fix is no regression


def test_a_leak_that_got_faster_past_the_tolerance_regresses_and_within_it_does_not() -> None:
    base = _run(_rank(0, "leak", 64.0, holders=("history",)))
    assert compare(base, _run(_rank(0, "leak", 75.0, holders=("history",)))).regressed is False  # +17%
    faster = compare(base, _run(_rank(0, "leak", 96.0, holders=("history",))))
    assert faster.changes[0].regressions == ("rank 0's growth +64.0 KiB → +96.0 KiB/step (tolerance 20%)",)
    assert compare(base, _run(_rank(0, "leak", 96.0)), tolerance=0.6).regressed is False


def test_a_peak_fails_only_when_a_peak_tolerance_is_given() -> None:
    base, new = _run(_rank(0, peak_mib=300)), _run(_rank(0, peak_mib=420))
    assert not compare(base, new).regressed
    assert compare(base, new, peak_tolerance=0.25).changes[0].regressions == (
        "rank 0's RAM peak 300.0 MiB → 420.0 MiB (tolerance 25%)",)


def test_rates_of_other_clocks_and_ranks_in_one_run_only_are_said_not_judged() -> None:
    base = _run(_rank(0, "leak", 10.0), _rank(1))
    new = _run(_rank(0, "leak", 900.0, clock="batch"))
    result = compare(base, new)
    assert not result.regressed
    assert result.notes == ("rank 0: growth per step and per batch are not compared", "rank 1 is only in the base run")


def test_a_single_process_run_is_compared_as_one() -> None:
    clean = ReportData(status="ok", wall_s=1.0, samples=10, interval_s=0.1, steps=100, epochs=0, ram=_ram(200),
                       heap=None, vram=None, shm=None, workers=None, verdict="clean")
    leaking = ReportData(status="ok", wall_s=1.0, samples=10, interval_s=0.1, steps=100, epochs=0,
                         ram=RamSummary(100 * MIB, 300 * MIB, 300 * MIB, 2.0 * MIB, 16 * 1024 * MIB, "system"),
                         heap=None, vram=None, shm=None, workers=None, verdict="leak", resource="ram",
                         suspects=(_holder("cache"),))
    result = compare(clean, leaking)
    assert [c.label for c in result.changes] == ["run"]
    assert result.changes[0].regressions == ("run was clean, now leak at +2.0 MiB/step",)


def test_a_leak_in_shared_memory_is_compared_at_its_own_rate() -> None:
    """Every resource a verdict can name is compared at its own summary's rate, /dev/shm too."""
    def shm_run(rate_mib: float) -> ReportData:
        shm = ShmSummary(0, 64 * MIB, 64 * MIB, 256 * MIB, "file_descriptor", rate_mib * MIB, "/dev/shm")
        return ReportData(status="ok", wall_s=1.0, samples=10, interval_s=0.1, steps=100, epochs=0, ram=_ram(200),
                          heap=None, vram=None, shm=shm, workers=None, verdict="leak", resource="shm")
    result = compare(shm_run(1.0), shm_run(2.0))
    assert result.changes[0].regressions == ("run's growth +1.0 MiB → +2.0 MiB/step (tolerance 20%)",)


def test_every_resource_that_can_leak_is_held_to_the_peak_tolerance() -> None:
    """/dev/shm filling further in the new run fails a peak tolerance although RAM's peak stayed put."""
    def run(shm_mib: int) -> ReportData:
        shm = ShmSummary(0, shm_mib * MIB, shm_mib * MIB, 2048 * MIB, "file_descriptor", None, "/dev/shm")
        return ReportData(status="ok", wall_s=1.0, samples=10, interval_s=0.1, steps=100, epochs=0, ram=_ram(200),
                          heap=None, vram=None, shm=shm, workers=None, verdict="clean")
    assert compare(run(1024), run(1600)).regressed is False
    assert compare(run(1024), run(1600), peak_tolerance=0.25).changes[0].regressions == (
        "run's shm peak 1.0 GiB → 1.6 GiB (tolerance 25%)",)
