"""The leak detector on synthetic step-aligned series: each class, false positives, speed of detection."""

from __future__ import annotations

import math
import random

import pytest

from torchmem_magic.core.units import format_bytes
from torchmem_magic.render.advice import advice_lines
from torchmem_magic.core.slopes import warmup_length
from torchmem_magic.analysis.findings import Series
from torchmem_magic.analysis.verdict import MIB, analyse, decide

BASE = 600 * MIB


def series(values: list[float], resource: str = "heap", limit: float | None = 16 * 1024 * MIB) -> Series:
    return Series(resource, [float(i + 1) for i in range(len(values))], values, limit)


def noisy(n: int, noise: float, seed: int, per_step: float = 0.0, warmup_jump: float = 0.0) -> list[float]:
    rng = random.Random(seed)
    return [BASE + per_step * i + (warmup_jump if i > 0 else 0.0) + rng.gauss(0, noise) for i in range(n)]


@pytest.mark.parametrize("rate_mib", [0.2, 0.5, 1.0, 5.0])
def test_linear_leaks_at_several_rates(rate_mib: float) -> None:
    f = analyse(series(noisy(120, 64 * 1024, seed=1, per_step=rate_mib * MIB, warmup_jump=40 * MIB)))
    assert (f.verdict, f.leak_kind) == ("leak", "per-iteration")
    assert f.per_step_bytes == pytest.approx(rate_mib * MIB, rel=0.1)
    assert f.per_step_error_bytes < 0.1 * rate_mib * MIB


def test_one_mib_per_step_is_found_within_50_steps_at_realistic_noise() -> None:
    for seed in range(20):
        f = analyse(series(noisy(50, 256 * 1024, seed=seed, per_step=MIB, warmup_jump=30 * MIB)))
        assert f.verdict == "leak", seed


def test_staircase_is_a_per_epoch_leak() -> None:
    rng = random.Random(3)
    values, epochs = [], []
    for epoch in range(6):
        epochs.append(epoch * 30)
        values += [BASE + epoch * 40 * MIB + rng.gauss(0, 64 * 1024) for _ in range(30)]
    f = analyse(series(values), epoch_steps=[e + 1 for e in epochs])
    assert (f.verdict, f.leak_kind) == ("leak", "per-epoch")
    assert f.per_step_bytes == pytest.approx(40 * MIB / 30, rel=0.15)
    # a validation loader starts an "epoch" at the same step as the next training pass: same rate
    both_loaders = analyse(series(values), epoch_steps=sorted([e + 1 for e in epochs] * 2))
    assert both_loaders.per_step_bytes == pytest.approx(40 * MIB / 30, rel=0.15)


def _jumps_every_40th_step() -> list[float]:
    """200 steps of a heap that jumps by 50 MiB every 40th step, flat between."""
    rng = random.Random(4)
    values, level = [], BASE
    for i in range(200):
        if i and i % 40 == 0:
            level += 50 * MIB
        values.append(level + rng.gauss(0, 64 * 1024))
    return values


def test_jumps_every_40th_step_are_sporadic_and_named() -> None:
    values = _jumps_every_40th_step()
    f = analyse(series(values))
    assert (f.verdict, f.leak_kind) == ("leak", "sporadic")
    assert f.sporadic_steps == ((41, 41), (81, 81), (121, 121), (161, 161))


def test_plateau_after_warmup_and_adams_first_step_are_clean() -> None:
    values = noisy(100, 64 * 1024, seed=5)
    for i in range(1, 100):
        values[i] += 80 * MIB  # Adam's state at step 1
    for i in range(3, 100):
        values[i] += 30 * MIB  # a cache that fills once
    assert analyse(series(values)).verdict == "clean"


def test_rss_flipping_between_two_levels_is_not_a_sporadic_leak() -> None:
    """Big temporaries served by mmap: RSS at each step is one of two levels, often repeated (measured
    on the quickstart's clean loop); a few MiB of drift must not read as jumps that never come back."""
    for seed in range(10):
        rng = random.Random(seed)
        levels = [0.0] * 12 + [12 * MIB if rng.random() < 0.75 else 0.0 for _ in range(180)] + [12 * MIB]
        values = [BASE + level + rng.choice((0.0, 0.0, 1.0, 3.0)) * MIB for level in levels for _ in range(rng.randint(1, 3))]
        f = analyse(series(values))
        assert f.verdict == "clean", (seed, f)


def test_sawtooth_of_big_temporaries_is_clean() -> None:
    rng = random.Random(6)
    values = [BASE + (200 * MIB if i % 7 in (3, 4) else 0.0) + rng.gauss(0, 64 * 1024) for i in range(150)]
    assert analyse(series(values)).verdict == "clean"


def test_cuda_reserved_growing_with_flat_allocated_is_caching_not_a_leak() -> None:
    allocated = series(noisy(100, 32 * 1024, seed=7), "vram")
    reserved = series(noisy(100, 32 * 1024, seed=8, per_step=2 * MIB), "vram_reserved")
    v = decide([allocated, reserved])
    assert v.verdict == "clean" and any("caching allocator" in a and "expandable_segments" in a for a in advice_lines(v.advice))


@pytest.mark.parametrize("noise_kib", [1, 64, 1024, 16 * 1024])
def test_false_positive_rate_on_pure_noise_is_below_one_percent(noise_kib: int) -> None:
    leaks = sum(
        analyse(series(noisy(80, noise_kib * 1024, seed=seed))).verdict == "leak" for seed in range(250)
    )
    assert leaks <= 2  # < 1% of 250


def test_too_few_steps_is_unknown_and_says_how_many() -> None:
    v = decide([series(noisy(8, 1024, seed=9, per_step=MIB))])
    assert v.verdict == "unknown" and "needs at least" in advice_lines(v.advice)[0]




def test_exhaustion_in_steps_and_time_said_plainly() -> None:
    values = noisy(100, 64 * 1024, seed=11, per_step=2 * MIB)
    v = decide([series(values, limit=values[-1] + 2000 * 2 * MIB)], steps_per_s=2.0)
    assert v.verdict == "leak" and v.resource == "heap"
    assert v.steps_to_exhaustion == pytest.approx(2000, rel=0.1)
    assert v.seconds_to_exhaustion == pytest.approx(1000, rel=0.1)
    assert "this kernel is OOM-killed in ~" in advice_lines(v.advice)[1] and "(~17 min)" in advice_lines(v.advice)[1]


def test_rss_growth_with_flat_heap_is_fragmentation() -> None:
    v = decide([series(noisy(100, 8 * 1024, seed=12)), series(noisy(100, 8 * 1024, seed=13, per_step=MIB), "ram")])
    assert v.verdict == "clean" and any("malloc_trim" in a for a in advice_lines(v.advice))


def test_rss_jumps_are_no_leak_where_the_heap_had_no_verdict_and_grew_far_less() -> None:
    """A fresh kernel's first cell, on a busy machine: the heap's cycle sampled at every step only while it
    rose, then 3 times, reads as a warm-up with too few steps after it (no verdict); RSS, which the
    first epoch touches page by page and the epochs' ends raise (freed memory the allocator keeps),
    reads as jumps. The heap in use, which grew by nothing over the run, says they are no retention."""
    xs = [float(x) for x in [*range(1, 32), 87, 130, 172, 200]]
    # the reading after the block: the last epoch's features cleared, a little below the first reading
    heap = [BASE + (int(x - 1) % 50) * 64 * 1024 for x in xs[:-1]] + [BASE - 112 * 1024]
    ram = [2 * BASE + min(x, 50) * 96 * 1024 for x in xs[:-3]] + [2 * BASE + 7 * MIB, 2 * BASE + 9.5 * MIB, 2 * BASE + 12 * MIB]
    def judged(heap_bytes: list[float]):
        return decide([Series("heap", xs, heap_bytes), Series("ram", xs, ram)], [1, 51, 101, 151], ends_after_block=True)

    v = judged(heap)
    findings = {f.resource: f for f in v.findings}
    assert findings["heap"].verdict == "unknown" and findings["ram"].verdict == "leak", findings
    assert v.verdict == "clean", v
    assert any(a.startswith("RSS grows while the heap in use grew far less") for a in advice_lines(v.advice)), advice_lines(v.advice)
    # where the heap grew as much as RSS, RSS's growth is what the heap holds: its leak stands
    assert judged([h + (r - ram[0]) for h, r in zip(heap, ram)]).verdict == "leak"


def test_workers_still_growing_with_a_flat_heap_are_the_process_trees_leak_explained() -> None:
    heap = series(noisy(100, 8 * 1024, seed=14))
    workers = series(noisy(100, 8 * 1024, seed=15, per_step=MIB), "workers")  # ~100 MiB over the run
    ram = series(noisy(100, 8 * 1024, seed=16, per_step=MIB), "ram")
    v = decide([heap, ram, workers])
    assert (v.verdict, v.leak_kind, v.resource) == ("leak", "per-iteration", "ram")  # the OOM killer counts it
    assert v.per_step_bytes == pytest.approx(MIB, rel=0.05)
    assert any("copy-on-access" in a and "grew by" in a for a in advice_lines(v.advice))


def test_a_heap_without_a_verdict_does_not_hide_the_workers_copy_on_access() -> None:
    heap = series(noisy(10, 8 * 1024, seed=20))  # too few heap readings for a verdict: "unknown", not "clean"
    workers = series(noisy(100, 8 * 1024, seed=21, per_step=MIB), "workers")
    ram = series(noisy(100, 8 * 1024, seed=22, per_step=1.5 * MIB), "ram")  # the tree: workers and more
    v = decide([heap, ram, workers])
    assert (v.verdict, v.resource) == ("leak", "ram") and any("copy-on-access" in a for a in advice_lines(v.advice))
    assert v.per_step_bytes == pytest.approx(MIB, rel=0.05)  # the workers' rate, not the whole tree's


def test_workers_that_stopped_growing_after_the_first_pass_are_explained_not_a_leak() -> None:
    heap = series(noisy(120, 8 * 1024, seed=19))
    rise = [BASE + min(i, 30) * 4 * MIB for i in range(120)]  # 120 MiB copied during the first pass, then flat
    v = decide([heap, series(rise, "workers")], first_pass_steps=(1, 30))
    assert v.verdict == "clean"
    advice = next(a for a in advice_lines(v.advice) if "copy-on-access" in a)
    assert "grew by 120.0 MiB" in advice and "The first pass is complete" in advice


def test_copy_on_access_projection_to_the_end_of_the_first_pass() -> None:
    heap = series(noisy(100, 8 * 1024, seed=17))
    workers = series(noisy(100, 8 * 1024, seed=18, per_step=MIB), "workers")
    v = decide([heap, workers], first_pass_steps=(1, 300))
    advice = next(a for a in advice_lines(v.advice) if "copy-on-access" in a)
    assert "Projected: ~" in advice and "(step 300)" in advice
    projected_mib = float(advice.split("Projected: ~")[1].split(" MiB")[0])
    assert projected_mib == pytest.approx(600 + 300, rel=0.05)  # 600 MiB base + 1 MiB/step over 300 steps


def sampler_steps(last: int, dense: int = 64, stride: int = 70) -> list[float]:
    """Steps the step sampler reads when steps are fast: every one of the first `dense`, then every
    `stride`-th, and the final step at the end of the run."""
    return [float(x) for x in [*range(1, dense + 1), *range(dense + stride, last, stride), last]]


def fill(i: int, steps: int, total: float, stepwise: bool) -> float:
    """A cache filling to `total` over its first `steps` steps, smoothly or in five increments."""
    done = min(i, steps) / steps
    return total * (math.floor(done * 5) / 5 if stepwise else done)


@pytest.mark.parametrize("stepwise", [False, True])
@pytest.mark.parametrize("steps", [5, 15, 30, 50])
def test_a_warmup_of_any_length_then_flat_is_clean(steps: int, stepwise: bool) -> None:
    for seed in range(5):
        rng = random.Random(seed)
        values = [BASE + fill(i, steps, 30 * MIB, stepwise) + rng.gauss(0, 64 * 1024) for i in range(steps + 150)]
        f = analyse(series(values))
        assert f.verdict == "clean", (seed, f)
        assert steps - 1 <= f.warmup_steps <= steps + 2, (seed, f)


def test_a_warmup_then_a_steady_leak_is_per_iteration_at_the_rate_after_warmup() -> None:
    for seed in range(5):
        rng = random.Random(seed)
        values = [BASE + fill(i, 15, 40 * MIB, False) + 0.5 * MIB * i + rng.gauss(0, 64 * 1024) for i in range(200)]
        f = analyse(series(values))
        assert (f.verdict, f.leak_kind) == ("leak", "per-iteration"), (seed, f)
        assert f.per_step_bytes == pytest.approx(0.5 * MIB, rel=0.05)
        assert 14 <= f.warmup_steps <= 17, (seed, f)


def test_one_jump_in_the_first_tenth_then_flat_is_a_warmup() -> None:
    for seed in range(5):
        rng = random.Random(seed)
        values = [BASE + (40 * MIB if i >= 14 else 0.0) + rng.gauss(0, 64 * 1024) for i in range(200)]
        f = analyse(series(values))
        assert f.verdict == "clean" and f.warmup_steps == 14, (seed, f)


def test_growth_through_most_of_the_run_is_no_warmup() -> None:
    """A warm-up leaves a flat rest of at least two thirds of the run: a fill still going at 60% is not one."""
    rng = random.Random(20)
    values = [BASE + fill(i, 120, 60 * MIB, False) + rng.gauss(0, 64 * 1024) for i in range(200)]
    assert warmup_length([float(i + 1) for i in range(200)], values) == 0


@pytest.mark.parametrize("last", [1000, 1500])
@pytest.mark.parametrize("rate_kib", [20, 70, 1024])
def test_a_thinned_steady_leak_is_per_iteration_not_sporadic(last: int, rate_kib: int) -> None:
    """Sampled every step, then every 70th: each thinned interval grows 70 times the rate, which is
    the rate, not a jump."""
    xs = sampler_steps(last)
    for seed in range(5):
        rng = random.Random(seed)
        values = [BASE + 30 * MIB * (x > 1) + rate_kib * 1024 * x + rng.gauss(0, 16 * 1024) for x in xs]
        f = analyse(Series("heap", xs, values, 16 * 1024 * MIB))
        assert (f.verdict, f.leak_kind) == ("leak", "per-iteration"), (seed, f)
        assert f.per_step_bytes == pytest.approx(rate_kib * 1024, rel=0.05)
        assert f.warmup_steps in (1, 2), (seed, f)  # the optimizer's first step, not the dense start


def test_jumps_every_40th_step_sampled_thinned_are_sporadic() -> None:
    xs = sampler_steps(200, stride=8)
    rng = random.Random(21)
    values = [BASE + 50 * MIB * ((int(x) - 1) // 40) + rng.gauss(0, 64 * 1024) for x in xs]
    f = analyse(Series("heap", xs, values, 16 * 1024 * MIB))
    assert (f.verdict, f.leak_kind) == ("leak", "sporadic")
    assert f.sporadic_steps == ((41, 41), (81, 88), (121, 128), (161, 168))  # each between two sampled steps


def test_the_optimizers_first_step_is_cut_before_sporadic_jumps() -> None:
    rng = random.Random(22)
    values = [BASE + (80 * MIB if i else 0.0) + 50 * MIB * (i // 40) + rng.gauss(0, 64 * 1024) for i in range(200)]
    f = analyse(series(values))
    assert (f.verdict, f.leak_kind) == ("leak", "sporadic") and f.warmup_steps in (1, 2)
    assert f.sporadic_steps == ((41, 41), (81, 81), (121, 121), (161, 161))


def test_jumps_only_at_the_start_are_not_a_sporadic_leak() -> None:
    """Three fills early, then part freed for good: the rest is no line, so no warm-up is cut, yet
    jumps only at the start are no sporadic leak (that keeps jumping through the run)."""
    for seed in range(5):
        rng = random.Random(seed)
        values = [
            BASE + 50 * MIB * sum(i >= s for s in (5, 10, 15)) - (20 * MIB if i >= 45 else 0.0) + rng.gauss(0, 64 * 1024)
            for i in range(60)
        ]
        f = analyse(series(values))
        assert f.verdict == "clean", (seed, f)


def test_a_warmup_in_the_dense_start_of_a_thinned_run_then_flat_is_clean() -> None:
    xs = sampler_steps(1500)
    for seed in range(5):
        rng = random.Random(seed)
        values = [BASE + fill(int(x) - 1, 40, 30 * MIB, False) + rng.gauss(0, 64 * 1024) for x in xs]
        f = analyse(Series("heap", xs, values, 16 * 1024 * MIB))
        assert f.verdict == "clean" and 39 <= f.warmup_steps <= 42, (seed, f)


def test_what_the_block_end_released_is_said_and_not_taken_for_the_end_of_the_growth() -> None:
    """A thinned steady leak in a list local to a function: the reading after the block finds it freed."""
    xs = sampler_steps(300)
    for seed in range(5):
        rng = random.Random(seed)
        values = [BASE + 66 * 1024 * x + rng.gauss(0, 4 * 1024) for x in xs]
        values[-1] = BASE + rng.gauss(0, 4 * 1024)  # the helper returned: its list is gone
        f = analyse(Series("heap", xs, values, 16 * 1024 * MIB))
        assert (f.verdict, f.leak_kind) == ("leak", "per-iteration"), (seed, f)
        assert f.per_step_bytes == pytest.approx(66 * 1024, rel=0.05)
        assert f.released_bytes == pytest.approx(values[-2] - values[-1])
    diagnosis = decide([Series("heap", xs, values, 16 * 1024 * MIB)])
    assert any(line.startswith(f"{format_bytes(f.released_bytes)} of it came back when the block ended")
               for line in advice_lines(diagnosis.advice)), advice_lines(diagnosis.advice)


def test_a_list_cleared_at_every_epochs_end_including_the_last_stays_clean() -> None:
    """The last fall repeats the earlier ones: the loop's own pattern, not the block's end."""
    rng = random.Random(7)
    values = []
    for epoch in range(4):
        values += [BASE + i * 60 * 1024 + rng.gauss(0, 16 * 1024) for i in range(50)]
    values.append(BASE + rng.gauss(0, 16 * 1024))  # cleared after the last epoch's steps
    f = analyse(series(values), epoch_steps=[1 + 50 * e for e in range(4)])
    assert f.verdict == "clean" and f.released_bytes == 0, f


def test_a_small_last_fall_in_noise_is_left_in() -> None:
    values = noisy(150, 256 * 1024, seed=8)
    values[-1] -= 300 * 1024  # within what the noise does at every step
    assert analyse(series(values)).released_bytes == 0


#: a window of 256 KiB tensors cleared every 64 steps, 310 steps, as a real run's step samples read the heap:
#: at every step up to 64, then every 11 to 22 steps
WINDOW_64_STEPS = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29,
    30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56,
    57, 58, 59, 60, 61, 62, 63, 64, 75, 84, 98, 113, 129, 143, 163, 181, 197, 216, 239, 262, 288, 310
]
WINDOW_64_HEAP_BYTES = [
    119024080, 119290096, 119552528, 119815280, 120077552, 120340144, 120602656, 120865344, 121127632,
    121390128, 121652592, 121915152, 122177616, 122440112, 122702560, 122965280, 123227616, 123490080,
    123752592, 124015040, 124277600, 124540064, 124802576, 125065056, 125327600, 125590032, 125852480,
    126114928, 126377472, 126639936, 126902544, 127165552, 127428080, 127690544, 127952928, 128215424,
    128478048, 128740560, 129002944, 129265424, 129527920, 129790448, 130052944, 130315408, 130577888,
    130840400, 131102896, 131365504, 131628000, 131890384, 132152848, 132415488, 132677968, 132940464,
    133202960, 133465456, 133727936, 133990448, 134252848, 134515440, 134777952, 135040416, 135303040,
    135565504, 121653264, 124015776, 127690528, 131628144, 119028288, 122703248, 127953168, 132678064,
    120078256, 125065712, 131113200, 120350864, 127175760, 133205984
]


def test_a_cycle_sampled_at_every_step_at_first_and_thinly_later_is_clean() -> None:
    """Fitted as sampled, the dense start's steady rise outweighs the rest (a leak of ~256 KiB/step with
    residuals of nothing); fitted with every stretch of steps weighed alike, the cycles cancel."""
    xs = [float(x) for x in WINDOW_64_STEPS]
    finding = analyse(Series("heap", xs, [float(b) for b in WINDOW_64_HEAP_BYTES], 16 * 1024 * MIB))
    assert finding.verdict == "clean", finding
    # a real leak sampled the same way stays a leak, at its rate
    fill = 256 * 1024
    leaking = analyse(Series("heap", xs, [113 * MIB + x * fill for x in xs], 16 * 1024 * MIB))
    assert (leaking.verdict, leaking.leak_kind) == ("leak", "per-iteration")
    assert leaking.per_step_bytes == pytest.approx(fill, rel=0.01)


@pytest.mark.parametrize("thin_end", [(91, 137, 181, 200), (98, 135, 158, 168, 200)], ids=["falling", "low-then-high"])
def test_a_cycle_sampled_thinly_after_a_dense_start_that_holds_most_samples_is_clean(thin_end: tuple[int, ...]) -> None:
    """Features of 64 KiB a step kept for an epoch of 50 steps and cleared at its end, sampled at every
    step up to 64 and then only 4 or 5 times (two real runs on a busy machine).

    The last quarter of the samples lies in the dense start: thinned to their spacing (1 step), the fit
    read the start's rise as a leak of 64 KiB/step with no error. The last quarter of the steps has the
    spacing of the thinned end. And the dense start is no warm-up: it reached the level of the rest and
    fell back below it (cut as one, the rest left too few samples for any verdict)."""
    xs = [float(x) for x in [*range(1, 65), *thin_end]]
    kept = 64 * 1024
    heap = [BASE + (int(x - 1) % 50) * kept for x in xs[:-1]] + [BASE]  # the last reading: after the last clear
    finding = analyse(Series("heap", xs, heap, 16 * 1024 * MIB), epoch_steps=[1, 51, 101, 151], ends_after_block=True)
    assert finding.verdict == "clean", finding
    leaking = analyse(Series("heap", xs, [BASE + x * kept for x in xs], 16 * 1024 * MIB))
    assert (leaking.verdict, leaking.leak_kind) == ("leak", "per-iteration")
    assert leaking.per_step_bytes == pytest.approx(kept, rel=0.01)


@pytest.mark.parametrize("dense_to, thin_end", [(26, (90, 129, 177, 200)), (8, (35, 94, 140, 184, 200))],
                         ids=["dense-half-epoch", "dense-8-steps"])
def test_a_cycle_whose_dense_start_ends_inside_the_first_epoch_is_clean(dense_to: int, thin_end: tuple[int, ...]) -> None:
    """The same epochs, on a machine busy enough that sampling every step stopped inside the first epoch
    (its samples cost more than the dense phase allows): the dense start is only the cycle's rise. Fitted,
    it gave a leak of 64 KiB/step with no error, while the later samples and the end lie back near the
    start. A leak shows its fitted growth there."""
    xs = [float(x) for x in [*range(1, dense_to + 1), *thin_end]]
    kept = 64 * 1024
    heap = [BASE + (int(x - 1) % 50) * kept for x in xs[:-1]] + [BASE]
    finding = analyse(Series("heap", xs, heap, 16 * 1024 * MIB), epoch_steps=[1, 51, 101, 151], ends_after_block=True)
    assert finding.verdict == "clean", finding
    leaking = analyse(Series("heap", xs, [BASE + x * kept for x in xs], 16 * 1024 * MIB))
    assert (leaking.verdict, leaking.leak_kind) == ("leak", "per-iteration")
    assert leaking.per_step_bytes == pytest.approx(kept, rel=0.01)


def test_a_steady_leak_sampled_further_apart_than_its_epochs_is_per_iteration_not_per_epoch() -> None:
    # every interval of 100 steps holds an epoch's start (epochs of 60 steps): the growth is all "across
    # epochs", yet the few intervals inside an epoch grow at the same rate: no staircase
    rng = random.Random(8)
    steps = [1.0 + 100 * i for i in range(150)] + [15_000.0 + 30 * i for i in range(1, 20)]
    values = [BASE + 64 * 1024 * x + rng.gauss(0, 64 * 1024) for x in steps]
    epochs = [1.0 + 60 * k for k in range(1, 270)]
    f = analyse(Series("heap", steps, values, 16 * 1024 * MIB), epoch_steps=epochs)
    assert (f.verdict, f.leak_kind) == ("leak", "per-iteration")
    assert f.per_step_bytes == pytest.approx(64 * 1024, rel=0.05)


def test_a_staircase_sampled_every_fifth_step_is_still_per_epoch() -> None:
    rng = random.Random(9)
    steps = [float(s) for s in range(1, 241, 5)]
    values = [BASE + ((int(x) - 1) // 30) * 40 * MIB + rng.gauss(0, 64 * 1024) for x in steps]
    f = analyse(Series("heap", steps, values, 16 * 1024 * MIB), epoch_steps=[1.0 + 30 * k for k in range(8)])
    assert (f.verdict, f.leak_kind) == ("leak", "per-epoch")


def _thinned_staircase(last_rows: list[float], per_epoch: float) -> tuple[list[float], list[float]]:
    """Measured in a kernel: 6 epochs of 20 optimizer steps, a step-aligned row at every step up to 64,
    then thinned; what each epoch keeps is kept after its last step (read at the next step)."""
    steps = [float(s) for s in range(1, 65)] + last_rows
    values = [BASE + ((int(x) - 1) // 20) * per_epoch for x in steps[:64]]
    values += [BASE + ((int(x) - 1) // 20) * per_epoch for x in last_rows[:-1]] + [BASE + 6 * per_epoch]
    return steps, values


@pytest.mark.parametrize(
    "last_rows, with_validation_loader",
    [
        # the reading after the block repeats step 120; the validation loader started after it (at 121)
        ([93.0, 120.0, 120.0], True),
        # no validation loader: the outputs kept after the last epoch's last step, read in (114, 120]
        ([91.0, 114.0, 120.0], False),
    ],
)
def test_what_the_last_epoch_keeps_after_its_last_step_is_that_epochs_end(
    last_rows: list[float], with_validation_loader: bool
) -> None:
    steps, values = _thinned_staircase(last_rows, 8.5 * MIB)
    starts = [1.0 + 20 * e for e in range(6)] + ([1.0 + 20 * e for e in range(1, 7)] if with_validation_loader else [])
    f = analyse(Series("heap", steps, values, 16 * 1024 * MIB), epoch_steps=sorted(starts), ends_after_block=True)
    assert (f.verdict, f.leak_kind) == ("leak", "per-epoch")
    assert f.per_epoch_bytes == pytest.approx(8.5 * MIB, rel=0.05)


def test_a_block_end_that_kept_nothing_is_no_epoch_of_a_staircase() -> None:
    # the growth comes at each epoch's start; the after-block interval is flat and adds no epoch
    steps = [float(s) for s in range(1, 121)] + [120.0]
    values = [BASE + ((int(x) - 1) // 20 + 1) * 8 * MIB for x in steps]
    f = analyse(Series("heap", steps, values, 16 * 1024 * MIB), epoch_steps=[1.0 + 20 * e for e in range(6)], ends_after_block=True)
    assert (f.verdict, f.leak_kind) == ("leak", "per-epoch")
    assert f.per_epoch_bytes == pytest.approx(8 * MIB, rel=0.01)


def test_a_staircase_sampled_more_thinly_than_its_epochs_in_places_has_each_epochs_growth() -> None:
    # seen in a kernel on a busy machine: 6 epochs of 20 steps, 8 MiB kept at each epoch's end, and two gaps
    # between samples each holding two epochs' starts (and both their growths)
    steps = [float(s) for s in [*range(1, 31), 62, *range(63, 81), 120, 120]]
    values = [BASE + ((int(x) - 1) // 20) * 8 * MIB for x in steps[:-1]] + [BASE + 6 * 8 * MIB]
    f = analyse(Series("heap", steps, values, 16 * 1024 * MIB), epoch_steps=[1.0 + 20 * e for e in range(6)], ends_after_block=True)
    assert (f.verdict, f.leak_kind) == ("leak", "per-epoch")
    assert f.per_epoch_bytes == pytest.approx(8 * MIB, rel=0.01)
    assert f.per_step_bytes == pytest.approx(8 * MIB / 20, rel=0.01)


def test_a_jump_only_the_reading_after_the_block_shows_lies_in_the_last_step() -> None:
    # seen in a kernel: what the last step kept is read after the block, a row that repeats step 250
    rng = random.Random(5)
    steps = [float(s) for s in range(1, 251)] + [250.0]
    values = [BASE + ((int(x) - 1) // 50) * 8 * MIB + rng.gauss(0, 64 * 1024) for x in steps[:-1]]
    values.append(values[-1] + 8 * MIB)
    f = analyse(Series("heap", steps, values, 16 * 1024 * MIB), ends_after_block=True)
    assert (f.verdict, f.leak_kind) == ("leak", "sporadic")
    assert f.sporadic_steps == ((51, 51), (101, 101), (151, 151), (201, 201), (250, 250))


@pytest.mark.parametrize("thin_end", [(176, 250), (151, 250), (114, 203, 250)])
def test_jumps_every_50th_step_with_one_in_the_dense_start_and_a_thin_tail_are_sporadic(thin_end: tuple[int, ...]) -> None:
    """4 MiB kept after every 50th of 250 steps, sampled at every step up to 64 and then only 2 or 3
    times (a busy machine): the dense start holds one jump, and the tail's intervals each hold one or two.

    The jump in the dense start is no warm-up: the rest, measured at its end in steps, grows as fast on
    average. Its end level was the median of the last 5 samples, mostly the dense start's, so the rest
    read as flat, the jump was cut, and the tail's few intervals alone read as a steady leak."""
    rng = random.Random(3)
    xs = [float(x) for x in [*range(1, 65), *thin_end]]
    kept = 4 * MIB
    heap = [BASE + kept * sum(x >= j for j in (51, 101, 151, 201)) + rng.gauss(0, 16 * 1024) for x in xs]
    heap[-1] += kept  # the last step's, read after the block
    f = analyse(Series("heap", xs, heap, 16 * 1024 * MIB), ends_after_block=True)
    assert (f.verdict, f.leak_kind, f.warmup_steps) == ("leak", "sporadic", 0), f
    assert f.sporadic_steps[0] == (51, 51), f


def test_one_rise_late_in_the_run_is_a_suspect_not_a_sporadic_leak() -> None:
    """RSS rising once, by 6 MiB, at the reading after the block (an epoch's end temporaries the allocator
    kept), or a cache filled late: a level change, not yet a leak; the same rise twice is one."""
    rng = random.Random(9)
    once = [BASE + rng.gauss(0, 64 * 1024) for _ in range(199)] + [BASE + 6 * MIB]
    f = analyse(series(once), ends_after_block=True)
    assert (f.verdict, f.leak_kind) == ("suspect", "sporadic") and f.sporadic_steps == ((200, 200),), f
    twice = [v + (6 * MIB if i >= 100 else 0.0) for i, v in enumerate(once)]
    f = analyse(series(twice), ends_after_block=True)
    assert (f.verdict, f.leak_kind) == ("leak", "sporadic") and f.sporadic_steps == ((101, 101), (200, 200)), f


@pytest.mark.parametrize("full_at", [3, 5, 9])
def test_a_mount_filled_to_its_limit_early_ran_out_and_is_a_leak_not_a_warmup(full_at: int) -> None:
    """DataLoader workers running ahead of a slow loop fill a 16 MiB /dev/shm within a few steps, and it
    stays full until they die of a bus error: read as a fit, a warm-up then a plateau (clean), or too few
    steps after the warm-up (unknown). A full mount cannot grow: it is judged by how it filled."""
    xs = [float(s) for s in range(1, 17)] + [16.0]
    shm = [min(16.0, 16.0 * (x - 1) / (full_at - 1)) * MIB for x in xs]
    heap = [100 * MIB] * len(xs)
    d = decide([Series("shm", xs, shm, 16 * MIB), Series("heap", xs, heap, 16 * 1024 * MIB)], ends_after_block=True)
    assert (d.verdict, d.leak_kind, d.resource) == ("leak", "per-iteration", "shm"), d
    assert d.per_step_bytes == pytest.approx(16 * MIB / (full_at - 1))
    assert f"it was at its limit from step {full_at} on" in advice_lines(d.advice)[1], advice_lines(d.advice)
    # VRAM near full is the caching allocator's way, no sign it ran out; shm that emptied again did not run out
    vram = decide([Series("vram_reserved", xs, shm, 16 * MIB), Series("heap", xs, heap, 16 * 1024 * MIB)])
    assert vram.verdict != "leak", vram
    emptied = decide([Series("shm", xs, [*shm[:-4], *[2 * MIB] * 4], 16 * MIB)])
    assert not any("at its limit" in line for line in advice_lines(emptied.advice)), emptied


def _thinned(n: int) -> list[float]:
    """Steps sampled as a run samples them: every step at first, then further and further apart."""
    steps, step = [], 1.0
    while step <= n:
        steps.append(step)
        step += max(1.0, step // 16)
    return steps


def _shaped(shape: str, steps: list[float], seed: int) -> Series:
    """A memo filled over the first 40 % of the run (a pass over its samples)."""
    rng = random.Random(seed)
    n = steps[-1]
    grown = {
        "fill": lambda s: min(s, 0.4 * n),
    }[shape]
    return Series("heap", steps, [BASE + 256 * 1024 * grown(s) + rng.gauss(0, 128 * 1024) for s in steps])


@pytest.mark.parametrize("thinned", [False, True], ids=["every-step", "thinned"])
def test_growth_that_stopped_is_clean(thinned: bool) -> None:
    steps = _thinned(400) if thinned else [float(s) for s in range(1, 401)]
    for seed in range(5):
        diagnosis = decide([_shaped("fill", steps, seed)])
        assert diagnosis.verdict == "clean", (seed, advice_lines(diagnosis.advice))


def test_a_ramp_then_a_plateau_as_long_is_what_the_verdict_comes_back_from() -> None:
    """The verdict as it forms: a leak while the ramp lasts, clean once the plateau is as long as the ramp."""
    whole = _shaped("fill", [float(s) for s in range(1, 401)], 3)  # fills over steps 1-160
    verdicts = {last: decide([Series("heap", whole.steps[:last], whole.values[:last])]).verdict
                for last in (120, 200, 340, 400)}
    assert verdicts[120] == verdicts[200] == "leak" and verdicts[340] == verdicts[400] == "clean", verdicts


def test_the_rules_that_explain_growth_away_are_named_and_each_can_be_switched_off() -> None:
    """RSS creeping while the heap in use stays flat is what the allocator keeps: no leak, said as a note. The
    same run with that one rule switched off is a leak in RAM, and its note is gone."""
    from torchmem_magic.analysis.explaining_rules import EXPLAINING_RULES
    from torchmem_magic.analysis.verdict_table import switched

    assert [name for name, _ in EXPLAINING_RULES] == ["caching-allocator", "copy-on-access", "allocator-keeps-rss"]
    steps = [float(s) for s in range(1, 101)]
    series = [Series("heap", steps, noisy(100, 64 * 1024, seed=1)),
              Series("ram", steps, noisy(100, 64 * 1024, seed=2, per_step=1 * MIB))]
    kept = decide(series)
    assert kept.verdict == "clean" and any(line.startswith("RSS grows while the heap in use is flat") for line in advice_lines(kept.advice))
    with switched("allocator-keeps-rss"):
        off = decide(series)
    assert (off.verdict, off.resource) == ("leak", "ram") and not any(line.startswith("RSS grows") for line in advice_lines(off.advice))


def test_the_shapes_of_growth_are_named_rules_and_each_can_be_switched_off() -> None:
    """Jumps every 40th step are sporadic; with that one rule off, the same readings fall to the next rule
    (a line through the jumps) and are a per-iteration leak; with every shape off they are clean."""
    from torchmem_magic.analysis.shape_rules import SHAPE_RULES
    from torchmem_magic.analysis.verdict_table import switched

    names = [name for name, _ in SHAPE_RULES]
    assert names == ["per-epoch", "level-change", "filled-then-flat", "sporadic", "started-late", "per-iteration", "ramp-read-thinly"]
    values = _jumps_every_40th_step()
    assert analyse(series(values)).leak_kind == "sporadic"
    with switched("sporadic"):
        assert (analyse(series(values)).verdict, analyse(series(values)).leak_kind) == ("leak", "per-iteration")
    with switched(*names):
        assert analyse(series(values)).verdict == "clean"


def _late(steps: list[float], seed: int, start_share: float, second_ramp_from: float | None = None) -> Series:
    """Flat, then 256 KiB kept per step from `start_share` of the run on (or a ramp, a pause from
    `start_share`, and a second ramp from `second_ramp_from`)."""
    rng = random.Random(seed)
    n = steps[-1]
    if second_ramp_from is None:
        grown = [max(0.0, s - start_share * n) for s in steps]
    else:
        grown = [min(s, start_share * n) + max(0.0, s - second_ramp_from * n) for s in steps]
    return Series("heap", steps, [BASE + 256 * 1024 * g + rng.gauss(0, 128 * 1024) for g in grown])


@pytest.mark.parametrize("thinned", [False, True], ids=["every-step", "thinned"])
@pytest.mark.parametrize("start_share", [0.3, 0.5, 0.7])
def test_a_leak_that_starts_late_is_a_leak_from_where_it_began(thinned: bool, start_share: float) -> None:
    """A line through a hockey stick fits so badly that its residuals hid the rise: a leak that began
    half-way was called clean. The part after the hinge is judged alone: its rate, and where it began."""
    steps = _thinned(400) if thinned else [float(s) for s in range(1, 401)]
    for seed in range(4):
        d = decide([_late(steps, seed, start_share)])
        assert (d.verdict, d.leak_kind) == ("leak", "per-iteration"), (seed, advice_lines(d.advice))
        assert d.per_step_bytes == pytest.approx(256 * 1024, rel=0.15), seed
        finding = d.findings[0]
        if finding.started_at_step is not None:  # an early start is a line through the whole run
            assert finding.started_at_step == pytest.approx(start_share * 400, abs=0.1 * 400), seed
            assert f"since step {finding.started_at_step:,.0f}" in advice_lines(d.advice)[0]
    assert decide([_late(steps, 0, 0.7)]).findings[0].started_at_step is not None


@pytest.mark.parametrize("thinned", [False, True], ids=["every-step", "thinned"])
def test_a_pause_between_two_ramps_does_not_hide_them(thinned: bool) -> None:
    steps = _thinned(400) if thinned else [float(s) for s in range(1, 401)]
    for seed in range(4):
        d = decide([_late(steps, seed, 0.3, second_ramp_from=0.7)])
        assert d.verdict == "leak", (seed, advice_lines(d.advice))


@pytest.mark.parametrize("thinned", [False, True], ids=["every-step", "thinned"])
def test_a_cache_that_filled_part_way_and_stayed_flat_as_long_is_clean(thinned: bool) -> None:
    """Flat, a fill over steps 120-240, then flat for the 160 steps left (longer than the fill): growth that
    stopped, also where a slow drift of 4 KiB/step stays within its band."""
    steps = _thinned(400) if thinned else [float(s) for s in range(1, 401)]
    for seed in range(4):
        rng = random.Random(seed)
        values = [BASE + 256 * 1024 * min(max(0.0, s - 120), 120) + 4096 * s + rng.gauss(0, 128 * 1024)
                  for s in steps]
        d = decide([Series("heap", steps, values)])
        assert d.verdict == "clean", (seed, advice_lines(d.advice))


def test_the_late_and_the_stopped_rules_can_each_be_switched_off() -> None:
    """Without `started-late` a leak that began half-way is clean again; without `filled-then-flat` a
    cache filled part-way is a per-iteration leak (the line through it rises)."""
    from torchmem_magic.analysis.verdict_table import switched

    steps = [float(s) for s in range(1, 401)]
    late = _late(steps, 1, 0.5)
    rng = random.Random(1)
    filled = Series("heap", steps, [BASE + 256 * 1024 * min(max(0.0, s - 120), 120) + rng.gauss(0, 128 * 1024)
                                    for s in steps])
    assert (decide([late]).verdict, decide([filled]).verdict) == ("leak", "clean")
    with switched("started-late"):
        assert decide([late]).verdict == "clean"
    with switched("filled-then-flat"):
        assert decide([filled]).verdict == "leak"


@pytest.mark.parametrize("period", [64, 130, 180])
def test_a_sawtooth_ends_on_a_rise_and_is_no_late_leak(period: int) -> None:
    """A list cleared every `period` steps: the run ends on a rise, but never above the earlier peaks."""
    steps = [float(s) for s in range(1, 401)]
    for seed in range(4):
        rng = random.Random(seed)
        values = [BASE + 256 * 1024 * (s % period) + rng.gauss(0, 128 * 1024) for s in steps]
        assert decide([Series("heap", steps, values)]).verdict == "clean", (period, seed)


def test_a_late_ramp_read_five_times_is_still_a_leak_when_too_short_for_a_line() -> None:
    """Steps as a fast kernel loop samples them (every step to 64, then 88, 128, 168, 210, 238, 261, 293 and
    the end), a leak of 293 KiB/step from step 180: five jumps in a row are a ramp read thinly, too few
    readings for the late rule's line. Judged as a line only, it was clean (seen in a kernel); its jumps
    still make it a leak."""
    steps = [float(s) for s in [*range(1, 65), 88, 128, 168, 210, 238, 261, 293, 300]]
    for seed in range(4):
        rng = random.Random(seed)
        values = [BASE + 293 * 1024 * max(0.0, s - 180) + rng.gauss(0, 64 * 1024) for s in steps]
        f = analyse(Series("heap", steps, values), ends_after_block=True)
        assert f.verdict == "leak", (seed, f)



def memo_readings(filled: int, last: int, chunk_bytes: float, late_steps_bytes: tuple[float, float] = (0.0, 0.0),
                  seed: int = 4) -> tuple[list[float], list[float], list[float]]:
    """The readings of a run whose memo keeps 16 KiB a step for its first `filled` steps, then none: every
    step up to 64, then each 15 % further on to the fill's end, then every 1,024th (scans and samples
    thinned as they cost more). (steps, heap in use, RSS): the allocator maps the memo in `chunk_bytes`
    steps, and the flat rest's RSS steps up at 60 % and 90 % of the run by `late_steps_bytes`."""
    xs = [float(x) for x in range(1, 65)]
    while xs[-1] * 1.15 < filled * 1.1:
        xs.append(float(int(xs[-1] * 1.15)))
    xs += [float(x) for x in range(int(xs[-1]) + 1024, last, 1024)] + [float(last)]
    rng = random.Random(seed)
    memo = [16 * 1024 * min(x, filled) for x in xs]
    heap = [BASE / 2 + m + rng.gauss(0, 4096) for m in memo]
    late = [late_steps_bytes[0] * (x >= 0.6 * last) + late_steps_bytes[1] * (x >= 0.9 * last) for x in xs]
    rss = [BASE + chunk_bytes * (m // chunk_bytes) + extra + rng.gauss(0, 4096) for m, extra in zip(memo, late)]
    return xs, heap, rss


@pytest.mark.parametrize("late_steps_bytes", [(0.0, 0.0), (1.5 * MIB, 1 * MIB)])
@pytest.mark.parametrize("chunk_mib", [8, 16])
def test_a_fill_in_the_allocators_steps_then_flat_for_longer_is_clean_not_sporadic(
        chunk_mib: int, late_steps_bytes: tuple[float, float]) -> None:
    """RSS of a memo filled over the first 40 % of a run, mapped in 8 or 16 MiB steps: a few jumps, the
    last ones past the run's first third, then flat for longer than the fill took. Growth that stopped is
    clean, tried before the jumps rule: a sporadic leak keeps jumping."""
    for seed in range(10):  # the noise decides where a jump shows: read as a sporadic leak in 7 of 10
        xs, _, rss = memo_readings(5258, 13145, chunk_mib * MIB, late_steps_bytes, seed)
        f = analyse(Series("ram", xs, rss, 16 * 1024 * MIB))
        assert f.verdict == "clean", (seed, f)


def test_a_fill_cut_as_warmup_then_flat_read_too_few_times_is_clean() -> None:
    """A memo filled over the first 28 % of 13,145 steps, then flat, read nine times on its flat rest: the
    warm-up cut leaves fewer readings than a verdict needs, yet growth that stopped for longer than it took
    is clean, not unknown; and the RSS beside it, with two small steps on the rest, is no sporadic leak."""
    xs, heap, rss = memo_readings(3754, 13145, 16 * MIB, (1.5 * MIB, 1 * MIB))
    f = analyse(Series("heap", xs, heap, 16 * 1024 * MIB))
    assert f.verdict == "clean" and f.warmup_steps > len(xs) - 12, f
    d = decide([Series("heap", xs, heap, 16 * 1024 * MIB), Series("ram", xs, rss, 16 * 1024 * MIB)])
    assert d.verdict == "clean", d
    still_rising = [h + 64 * 1024 * max(0.0, x - 3754) for x, h in zip(xs, heap)]  # growth that goes on is no fill
    assert analyse(Series("heap", xs, still_rising, 16 * 1024 * MIB)).verdict == "leak"
