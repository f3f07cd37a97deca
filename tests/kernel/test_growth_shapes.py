"""Growth that stops is no leak, growth that starts late or pauses is one, in a real kernel, at the default
interval and a short one: a memo filled during the first epoch of four is clean and named as the cache that
filled, with its size; a leak that begins two thirds into the run, or pauses between two ramps, is a leak whose
holder is named first."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from leaky_loops import GROWTH_SHAPES, SETUP  # noqa: E402

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def k(kernel: Kernel) -> Kernel:
    kernel.ok(SETUP + "_kept_names = set(globals()) | {'_kept_names'}\n")
    return kernel


@pytest.mark.parametrize("interval", ["", "--interval 10"], ids=["default", "10ms"])
@pytest.mark.parametrize("name", sorted(GROWTH_SHAPES))
def test_growth_that_stops_is_clean_and_growth_that_goes_on_leaks(k: Kernel, name: str, interval: str) -> None:
    body, verdict, holder = GROWTH_SHAPES[name]
    try:
        k.ok(f"%%memwatch -q {interval}\n" + body, timeout_s=240)
        report = k.value(
            "(lambda r: {k: r[k] for k in ('verdict', 'leak_kind', 'steps', 'advice')}"
            " | {'suspects': [s['name'] for s in r['suspects']]})(torchmem_magic.last_report().to_dict())"
        )
    finally:
        k.ok("for _n in [n for n in globals() if n not in _kept_names and not n.startswith('_')]:\n"
             "    del globals()[_n]\nimport gc; gc.collect()", store_history=False)
    said = json.dumps(report, indent=1)
    assert report["verdict"] == verdict, said
    if verdict == "leak":
        assert report["suspects"][:1] == [holder], said
    else:
        assert report["suspects"] == [], said
        # named as the cache that filled, with its size; on a busy machine the scans may all come before it
        # filled (they thin out), and only the curves then show that its growth did not go on
        filled = [line for line in report["advice"] if line.startswith(f"{holder} is a cache that filled: it grew by ")]
        ruled_out = f"{holder}'s scans rose, but the memory it lives in did not grow with it"
        assert (filled and "MiB" in filled[0]) or any(line.startswith(ruled_out) for line in report["advice"]), said
