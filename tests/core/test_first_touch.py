"""DataLoader workers' first touch against copy-on-access. Forked workers copy pages of the parent's
heap as soon as refcounts and the collector touch them: a bounded rise at each worker's start that
stops once touched. Copy-on-access copies a dataset's Python objects as they are read: it goes on
with the batches. PSS is read a few times a second and carried into the steps in between."""

from __future__ import annotations

from torchmem_magic.analysis.findings import Series
from torchmem_magic.render.advice import advice_lines
from torchmem_magic.analysis.verdict import MIB, decide

BASE = 230 * MIB


def carried(readings: list[tuple[int, float]], steps: int) -> list[float]:
    """Each step's value: the last PSS reading at or before it (0 before the first)."""
    out, value, pending = [], 0.0, sorted(readings)
    for step in range(1, steps + 1):
        while pending and pending[0][0] <= step:
            value = pending.pop(0)[1]
        out.append(value)
    return out


def run(
    readings: list[tuple[int, float]], steps: int, epochs: tuple[float, ...], workers: int = 2, persistent: bool = False
) -> list[str]:
    xs = [float(s) for s in range(1, steps + 1)]
    heap = Series("heap", xs, [128 * MIB + (i % 3) * 1024 for i in range(steps)])
    tree = Series("ram", xs, [700 * MIB + v for v in carried(readings, steps)])
    # the workers' series as the report hands it over: their readings, where a new one shows
    pss = Series("workers", [float(s) for s, _ in readings], [v for _, v in readings])
    v = decide([heap, tree, pss], epoch_steps=epochs, worker_count=workers, workers_persistent=persistent)
    return [v.verdict, *advice_lines(v.advice)]


def test_a_first_touch_that_stopped_is_no_leak_and_no_copy_on_access() -> None:
    # 2 workers, 2 epochs of 300 batches, new workers each epoch: each touches ~11 MiB at its start;
    # the last reading happens to be a few KiB up (pages shared by fewer processes as others exit)
    first_epoch = [(4, BASE), (60, BASE + 21.9 * MIB), (170, BASE + 22.0 * MIB), (280, BASE + 22.1 * MIB)]
    second_epoch = [(305, BASE - 8 * MIB), (360, BASE + 21.0 * MIB), (470, BASE + 21.1 * MIB), (590, BASE + 21.2 * MIB)]
    verdict, *advice = run(first_epoch + second_epoch, 600, (1.0, 301.0))
    assert verdict == "clean", advice
    assert not any("copy-on-access" in line for line in advice), advice
    # one epoch, the first reading before the touch, a small rise at the very last reading
    verdict, *advice = run([(3, BASE), (90, BASE + 21.9 * MIB), (200, BASE + 21.9 * MIB), (300, BASE + 22.3 * MIB)], 300, (1.0,))
    assert verdict == "clean", advice


def test_copy_on_access_that_goes_on_with_the_batches_stays_a_leak() -> None:
    # 1.5 M strings read in order by 2 workers: ~0.5 MiB more a batch, to the end of the epoch
    readings = [(5, BASE + 167 * MIB), (110, BASE + 196 * MIB), (231, BASE + 289 * MIB)]
    verdict, *advice = run(readings, 300, (1.0,))
    assert verdict == "leak" and advice[0].startswith("per-iteration leak in ram"), advice
    assert any("copy-on-access" in line for line in advice)
    # again with new workers in the second epoch: they copy again as they read
    second = [(305, BASE), (400, BASE + 50 * MIB), (500, BASE + 100 * MIB), (590, BASE + 145 * MIB)]
    verdict, *advice = run(readings + second, 600, (1.0, 301.0))
    assert verdict == "leak", advice


def test_a_dataset_copied_in_the_first_pass_is_explained_however_many_workers() -> None:
    # persistent workers, shuffled: every page touched early in the first epoch, then flat
    readings = [(1, BASE + 60 * MIB), (116, BASE + 193 * MIB), (266, BASE + 194 * MIB), (500, BASE + 194 * MIB)]
    verdict, *advice = run(readings, 900, (1.0, 301.0, 601.0))
    assert verdict == "clean" and any("copy-on-access" in line for line in advice), advice
    # what 8 workers' first touches add up to is no dataset copied
    verdict, *advice = run([(3, BASE), (60, BASE + 90 * MIB), (200, BASE + 90 * MIB)], 300, (1.0,), workers=8)
    assert verdict == "clean" and not any("copy-on-access" in line for line in advice), advice


def test_persistent_workers_are_judged_over_the_run_however_few_readings_an_epoch_has() -> None:
    # a fast loop: 489 steps an epoch, PSS read about every 400 steps, so no epoch holds two readings;
    # the same two workers all along copied a dataset of strings in the first pass
    readings = [(100, BASE + 10 * MIB), (520, BASE + 75 * MIB), (940, BASE + 77 * MIB), (1400, BASE + 77 * MIB)]
    verdict, *advice = run(readings, 1467, (1.0, 490.0, 979.0), persistent=True)
    assert verdict == "clean" and any("copy-on-access" in line for line in advice), advice
    # new workers each epoch: each epoch's one reading says nothing of what its workers added
    verdict, *advice = run(readings, 1467, (1.0, 490.0, 979.0), persistent=False)
    assert verdict == "clean" and not any("copy-on-access" in line for line in advice), advice
