"""Verdicts on real CPU training loops in a real kernel: six leaks (each of its kind) and five clean loops."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from leaky_loops import CLEAN, LEAKS, SETUP  # noqa: E402

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def k(kernel: Kernel) -> Kernel:
    kernel.ok(SETUP)
    return kernel


def _verdict(k: Kernel, body: str) -> dict:
    k.ok("%%memwatch -q --interval 50\n" + body, timeout_s=180)
    report = k.value(
        "{k: torchmem_magic.last_report().to_dict()[k]"
        " for k in ('verdict', 'leak_kind', 'resource', 'advice', 'steps', 'sporadic_steps', 'heap')}"
        " | {'heap_after_steps': [torchmem_magic.last_report().timeline.by_step.first_value('heap_bytes'),"
        " torchmem_magic.last_report().timeline.by_step.last_value('heap_bytes')]}"
    )
    k.ok("for _n in [n for n in list(globals()) if not n.startswith('_') and n not in ('torch', 'torchmem_magic', 'DataLoader', 'TensorDataset', 'mlp', 'train_step', 'gc', 'sys', 'json')]:\n    del globals()[_n]\nimport gc; gc.collect()")
    return report


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_leaking_loops(k: Kernel, name: str) -> None:
    body, kind = LEAKS[name]
    report = _verdict(k, body)
    assert (report["verdict"], report["leak_kind"]) == ("leak", kind), report
    assert report["resource"] == "heap"
    # the rate the verdict quotes, over the steps, is the growth the step-aligned heap shows (whatever the kind)
    first, last = report["heap_after_steps"]
    per_step = report["heap"]["per_step"]
    assert per_step * (report["steps"] - 1) == pytest.approx(last - first, rel=0.3), (per_step, first, last)
    if kind == "sporadic":  # the kept tensor shows from the sample after optimizer step 40, 80, ...
        # (two jumps may share one range when sampling is thinned between them)
        ranges = report["sporadic_steps"]
        assert all(any(lo <= step <= hi for lo, hi in ranges) for step in (41, 81, 121, 161)), ranges
        assert all(hi - lo < 80 for lo, hi in ranges), ranges


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_clean_loops(k: Kernel, name: str) -> None:
    report = _verdict(k, CLEAN[name])
    assert report["verdict"] == "clean", report
