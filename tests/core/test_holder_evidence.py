"""A holder's growth needs evidence a cycle cannot fake: scans are few and far apart and may land on
the rising part of a cycle every time, but the curves are read at every sampled step, and an
accumulating holder's exact size never falls. Graph-only leaks, below what the curves can show,
stay found from their own series."""

from __future__ import annotations

from dataclasses import replace

import pytest

from torchmem_magic.analysis.holders import HolderSearch, fuse, without_ruled_out
from torchmem_magic.render.advice import advice_lines
from torchmem_magic.analysis.holder_trends import holder_trend, without_flat
from torchmem_magic.core.model import Suspect
from torchmem_magic.analysis.findings import Diagnosis, ResourceFinding

KIB, MIB = 1 << 10, 1 << 20
FILL = 128 * KIB  # a window of detached tensors: one 128 KiB tensor a step, cleared every CYCLE steps
CYCLE = 50
#: the scans' steps: doubling at first, then a quarter of the run apart; each lands later in its cycle
ALIASED_STEPS = (2, 4, 8, 16, 32, 85, 140, 196, 248, 299)


def window(steps: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(s, (s % CYCLE) * FILL) for s in steps]


def cache(name: str, series: list[tuple[int, int]], kind: str = "tensor-cache") -> Suspect:
    return Suspect(name, f"{name}[0]", kind, 10, 0, series[-1][1], True, f"fix {name}", series=tuple(series))


def curve(resource: str, per_step: float, error: float, verdict: str = "clean") -> ResourceFinding:
    return ResourceFinding(resource, verdict, None, per_step, error, 0, 100.0, per_step * 300)  # type: ignore[arg-type]


def curves(*findings: ResourceFinding) -> Diagnosis:
    return Diagnosis("clean", None, None, None, None, None, None, (), findings)


#: a sawtooth heap over 300 steps: the Theil-Sen slope of many cycles is about nothing, and well measured
SAWTOOTH_HEAP = curve("heap", 400.0, 2 * KIB)


def test_scans_that_land_on_a_cycles_rise_are_not_a_leak_when_the_heap_did_not_grow() -> None:
    series = window(ALIASED_STEPS)
    assert all(b > a for (_, a), (_, b) in zip(series, series[1:]))  # every scan rose: the trap
    fused = fuse(curves(SAWTOOTH_HEAP, curve("rss", 0.0, 5 * KIB)), [cache("window", series)], "optimizer",
                 headroom_bytes=8 << 30, steps_per_s=500.0)
    assert fused.verdict == "clean", fused
    assert any("window's scans rose" in line and "cycles" in line for line in advice_lines(fused.advice)), advice_lines(fused.advice)


def test_graph_only_leaks_stay_found_whether_the_curves_agree_or_cannot_tell() -> None:
    total = cache("total_loss", [(s, 2800 + s * 5600) for s in (2, 4, 8, 16, 32, 144, 259)], kind="autograd-graph")
    agreeing = curves(curve("heap", 5400.0, 1.0), curve("rss", 0.0, 2 * KIB))  # below the curves' 2 MiB floor
    unmeasured = curves(ResourceFinding("heap", "unknown", None, None, None, 0, 0.0, 0.0))
    for diagnosis in (agreeing, unmeasured, curves()):
        fused = fuse(diagnosis, [total], "optimizer", headroom_bytes=8 << 30, steps_per_s=500.0)
        assert (fused.verdict, fused.leak_kind) == ("leak", "per-iteration"), fused
        assert advice_lines(fused.advice)[0].startswith("per-iteration leak: total_loss grows +5.5 KiB/step")
    # noisy curves (a busy notebook's RSS, no heap reading) cannot rule out a few KiB a step either
    noisy = curves(curve("rss", 0.0, 40 * KIB))
    assert fuse(noisy, [total], "optimizer", None, None).verdict == "leak"


def test_a_holder_on_an_accelerator_agrees_with_the_device_memory_not_the_heap() -> None:
    features = cache("features", [(s, s * 256 * KIB) for s in (2, 4, 8, 16, 32, 90, 160, 250)])
    on_device = curves(curve("heap", 0.0, 100.0), curve("vram", 256 * KIB, 10.0))
    assert fuse(on_device, [features], "optimizer", None, None).verdict == "leak"


def test_a_holder_of_worker_batches_is_judged_against_shm_not_the_heap() -> None:
    """Batches kept from DataLoader workers live in shared-memory segments: /dev/shm grows with the holder
    while the heap stays flat. Against the heap the holder is ruled out (its scans rose, the heap did not);
    against the memory it lives in, it is where the shm leak goes, and a leak found from it alone runs out
    against the mount."""
    seen = cache("seen", [(s, s * 256 * KIB) for s in (2, 4, 8, 16, 32, 90, 160, 250)])
    shm_leak = replace(curve("shm", 256 * KIB, 10.0, "leak"), leak_kind="per-iteration")
    diagnosis = Diagnosis("leak", "per-iteration", "shm", 256 * KIB, 10.0, None, None, (),
                          (curve("heap", 0.0, 100.0), shm_leak))
    assert without_ruled_out([seen], diagnosis) == ()
    assert without_ruled_out([seen], diagnosis, {"seen": "shm"}) == (seen,)
    fused = fuse(diagnosis, [seen], "optimizer", None, None, memory={"seen": "shm"})
    assert advice_lines(fused.advice)[0].startswith("shm +256.0 KiB/step, and seen grows +256.0 KiB/step"), fused
    alone = fuse(curves(curve("heap", 0.0, 100.0)), [seen], "optimizer", headroom_bytes=8 << 30, steps_per_s=100.0,
                 memory={"seen": "shm"}, shm_headroom_bytes=float(64 * MIB))
    assert (alone.verdict, alone.resource, alone.steps_to_exhaustion) == ("leak", "shm", 256.0), alone


def test_a_holder_that_gives_memory_back_between_scans_does_not_grow() -> None:
    # a cycle whose scans mostly rose but once fell: a leak's exact size never falls
    mostly_up = window((2, 4, 8, 16, 32, 45, 55, 70, 85, 96, 147, 198, 249))
    assert not holder_trend("window", mostly_up).growing
    # seen in a kernel: a scan after a clear met the window at its smallest, and every later scan rose
    after_a_clear = [(2, 131072), (4, 393216), (8, 917504), (16, 1966080), (32, 4063232), (83, 131072),
                     (133, 1572864), (186, 3276800), (240, 4980736), (300, 6291456)]
    assert not holder_trend("window", after_a_clear).growing
    # a name reassigned in the cell starts from its old size: the fall from before the cell is a restart
    restarted = [(0, 40 * MIB), *((s, s * 64 * KIB) for s in (2, 4, 8, 16, 32, 80, 150))]
    assert holder_trend("history", restarted).growing


def test_a_holder_its_own_scans_found_flat_is_no_suspect() -> None:
    """The last step's outputs (a dict of tensors with graphs, reassigned every step) or a buffer filled once:
    a single scan's rules flag them, the scans during the run show them flat, and the report drops them.
    A growing holder, one scanned too few times to judge, and the notebook's own caches stay."""
    flat = [(0, 0), *((s, 750_000) for s in (2, 4, 8, 16, 32, 48, 64))]
    rising = [(s, 40_000 * s) for s in (2, 4, 8, 16, 32, 48, 64)]
    nodes_only = [(0, 0), *((s, 5_000 + 60 * s) for s in (2, 4, 8, 16, 32, 40))]  # a graph-only leak: tiny, but rising
    kept = without_flat((
        cache("outputs", flat, kind="autograd-graph"), cache("buffers", flat), cache("history", rising),
        cache("losses", nodes_only, kind="autograd-graph"), cache("Out", flat, kind="output-cache"),
        cache("young", flat[:4], kind="autograd-graph"),
    ))
    assert [s.name for s in kept] == ["history", "losses", "Out", "young"]


def test_a_leak_found_from_a_holder_alone_is_where_its_tensors_live() -> None:
    """Graph nodes piling up on a GPU show on no curve: the holder's own series finds the leak, and it is a
    VRAM leak, projected against the device's headroom, when the holder's tensors are mostly on a device."""
    total = cache("total_loss", [(s, 2800 + s * 5600) for s in (2, 4, 8, 16, 32, 144, 259)], kind="autograd-graph")
    on_gpu = fuse(curves(), [total], "optimizer", headroom_bytes=8 << 30, steps_per_s=500.0,
                  memory={"total_loss": "vram"}, device_headroom_bytes=float(1 << 30))
    assert (on_gpu.verdict, on_gpu.resource) == ("leak", "vram"), on_gpu
    assert on_gpu.steps_to_exhaustion == pytest.approx((1 << 30) / 5600, rel=0.01)
    assert any("CUDA runs out of memory" in line for line in advice_lines(on_gpu.advice)), advice_lines(on_gpu.advice)
    on_host = fuse(curves(), [total], "optimizer", headroom_bytes=8 << 30, steps_per_s=500.0)
    assert (on_host.verdict, on_host.resource) == ("leak", "heap") and "OOM-killed" in " ".join(advice_lines(on_host.advice))


def test_a_holder_that_filled_and_stayed_is_a_cache_not_a_leak() -> None:
    """Exact sizes: a memo filled over the first 100 steps of 400 stops growing; a steady leak never does,
    nor does one whose last scans came too soon after its last rise to tell."""
    memo = [(0, 0), *((s, min(s, 100) * 64 * KIB) for s in (2, 4, 8, 16, 32, 58, 94, 150, 260, 400))]
    trend = holder_trend("memo", memo)
    assert not trend.growing and trend.bounded and trend.filled is not None
    assert (trend.filled.first_step, trend.filled.full_step, trend.filled.last_step) == (0, 150, 400)
    assert trend.filled.grown_bytes == 100 * 64 * KIB
    steady = [(s, s * 64 * KIB) for s in (2, 4, 8, 16, 32, 58, 94, 150, 260, 400)]
    assert holder_trend("history", steady).growing and holder_trend("history", steady).filled is None
    stopped_late = [(s, min(s, 300) * 64 * KIB) for s in (2, 4, 8, 16, 32, 58, 94, 150, 260, 330, 400)]
    assert holder_trend("history", stopped_late).growing
    # scans that thinned out as the memo grew (each costs more): the fill's dense scans, then one scan long
    # after it ended; that interval, longer than all before, grew at a fraction of the rate: no longer growing
    thinned = [*((s, min(s, 5724) * 16 * KIB) for s in (1, 2, 4, 8, 16, 32, 117, 304, 554, 986, 1663, 2817, 3667)),
               (16668, 5724 * 16 * KIB)]
    assert not holder_trend("memo", thinned).growing
    # the same scans of a holder that keeps growing, and of one whose last interval is short: still growing
    assert holder_trend("history", [(s, s * 16 * KIB) for s, _ in thinned]).growing
    assert holder_trend("memo", [*thinned[:-1], (3700, 3700 * 16 * KIB)]).growing
    dropped = without_flat((cache("memo", memo), cache("history", steady)))
    assert [s.name for s in dropped] == ["history"]
    said = fuse(Diagnosis("clean", None, None, None, None, None, None, ()), [cache("memo", memo)], "optimizer", None, None)
    assert said.verdict == "clean"
    assert advice_lines(said.advice) == ("memo is a cache that filled: it grew by 6.2 MiB over steps 0–150, then stayed the same "
                           "size for 250 steps (bounded by the data: not a leak)",)


def test_a_search_that_found_nothing_says_where_a_registry_in_c_grew() -> None:
    """atexit keeps its callbacks (and what they were registered with) in C, where no referrer search can
    follow: a search that found nothing says the registry grew, with what to do; nothing is said without it."""
    leak = Diagnosis("leak", "per-iteration", "heap", 256 * KIB, 10.0, None, None, (), (curve("heap", 256 * KIB, 10.0, "leak"),))
    searched = HolderSearch((), 0, 149, 149, True, 0.5, (("atexit", 150),))
    said = advice_lines(fuse(leak, [], "optimizer", None, None, searched=searched).advice)
    assert any("atexit gained 150 entries during the run" in line and "atexit.unregister" in line for line in said), said
    quiet = advice_lines(fuse(leak, [], "optimizer", None, None, searched=replace(searched, opaque_grown=())).advice)
    assert not any("atexit" in line for line in quiet), quiet
