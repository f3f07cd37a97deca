"""Verdicts on real CPU training loops in a real kernel: the catalogue's leaks (each of its kind) and clean loops.
Each loop runs watched, then bare, from the same seed: watching must not change what it computed (every tensor
and module it left, bitwise), nor the RNG state or grad mode after it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from computed import computed, differences
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from leaky_loops import CLEAN, LEAKS, SETUP  # noqa: E402

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def k(kernel: Kernel) -> Kernel:
    kernel.ok(SETUP)
    return kernel


MAGIC = "%%memwatch -q --interval 50"
CLEAR = (
    "for _n in [n for n in list(globals()) if not n.startswith('_') and n not in ('torch', 'torchmem_magic', "
    "'DataLoader', 'TensorDataset', 'mlp', 'train_step', 'gc', 'sys', 'json')]:\n    del globals()[_n]\n"
    "import gc; gc.collect()"
)


def _verdict(k: Kernel, body: str) -> dict:
    """The watched run's report (the watched run first: it runs as it did before any bare run), once the bare
    run computed the same."""
    watched = computed(k, body, MAGIC)
    report = k.value(
        "{k: torchmem_magic.last_report().to_dict()[k]"
        " for k in ('verdict', 'leak_kind', 'resource', 'clock', 'advice', 'steps', 'sporadic_steps', 'heap', 'ram')}"
        " | {f'{c}_after_steps': [(s, v) for s, v in zip(torchmem_magic.last_report().timeline.by_step.column('step'),"
        " torchmem_magic.last_report().timeline.by_step.column(f'{c}_bytes')) if v > 0] for c in ('heap', 'ram', 'workers')}"
    )
    k.ok(CLEAR)
    bare = computed(k, body)
    k.ok(CLEAR, store_history=False)
    assert watched == bare, differences(watched, bare)
    return report


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_leaking_loops(k: Kernel, name: str) -> None:
    body, kind = LEAKS[name]
    report = _verdict(k, body)
    assert (report["verdict"], report["leak_kind"]) == ("leak", kind), report
    # copy-on-access grows the DataLoader workers (their PSS, part of the process tree), not the kernel's heap
    resource = "ram" if "copy_on_access" in name else "heap"
    assert report["resource"] == resource, report
    # the rate the verdict quotes, over the steps, is the growth the step-aligned series shows (whatever the
    # kind); for copy-on-access, the workers' own series (the tree's RAM also switches from RSS to PSS)
    samples = report["workers_after_steps" if "copy_on_access" in name else f"{resource}_after_steps"]
    if "copy_on_access" in name:  # PSS is read every 0.25 s or more and carried into the steps in between, and
        # the workers exit with the loader: the readings are where the value changes, the tail after the last is stale
        samples = [point for i, point in enumerate(samples) if i == 0 or point[1] != samples[i - 1][1]]
    (first_step, first), (last_step, last) = samples[0], samples[-1]
    per_step = report[resource]["per_step"]
    assert per_step * (last_step - first_step) == pytest.approx(last - first, rel=0.3), (per_step, samples[0], samples[-1])
    if kind == "sporadic":  # the kept memory shows from the sample after step N, 2N, ... (N from the name)
        # (two jumps may share one range when sampling is thinned between them)
        period = re.search(r"every_(\d+)th_step", name)
        assert period, f"a sporadic loop's name says after which steps it jumps: {name}"
        every = int(period.group(1))
        jumps = [every * i + 1 for i in range(1, report["steps"] // every)]
        ranges = report["sporadic_steps"]
        assert all(any(lo <= step <= hi for lo, hi in ranges) for step in jumps), (jumps, ranges)
        # no range without a jump (the last step's jump shows only in the reading after the block)
        shown = [*jumps, report["steps"]]
        unexplained = [(lo, hi) for lo, hi in ranges if not any(lo <= step <= hi for step in shown)]
        # what the heap did there (it failed once beside a CPU burner, with a range at step 64 alone)
        near = [point for point in samples if any(lo - 3 <= point[0] <= hi + 3 for lo, hi in unexplained)]
        assert not unexplained, (shown, ranges, near, report[resource])
        # each range is as narrow as the sampling allows: from the step after one sample to the next
        # sample (how many steps that is depends on how fast the loop ran beside the sampler), or the last
        # step for what only the reading after the block (which repeats that step) shows
        sampled = [step for step, _ in samples]
        narrowest = {(min(a + 1, b), b) for a, b in zip(sampled, sampled[1:])}
        assert all((lo, hi) in narrowest for lo, hi in ranges), (ranges, sampled)


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_clean_loops(k: Kernel, name: str) -> None:
    report = _verdict(k, CLEAN[name])
    assert report["verdict"] == "clean", report


def test_a_clean_loop_as_a_fresh_kernels_first_cell_is_clean(fresh_kernel: Kernel) -> None:
    """A user's first cell: the process's RSS grows while the first epoch touches its pages for the first
    time, then stays; the heap rises within each epoch and falls at its end. Sampled at every step at
    first and thinly later, both once read as a per-iteration leak here (6 of 6 runs)."""
    fresh_kernel.ok(SETUP)
    report = _verdict(fresh_kernel, CLEAN["epoch_features_cleared"])
    assert report["verdict"] == "clean", json.dumps(report, default=str)  # all of it: the series say why
