"""Holders named through the frameworks users train with, in a real kernel: the catalogue's HOLDER_LEAKS must be
called leaks of their kind with the expected holder named first among the suspects, and its HOLDER_CLEAN loops
clean with no suspect at all.

Each loop runs watched, then bare, from the same seeds: watching must not change what it computed.
One kernel runs every loop (each framework imported once, outside the watched cells, as a notebook's first cell
does); what a loop left in the namespace is deleted before the next. `make stress-holders` runs this file three
times and fails on a loop whose outcome flips between runs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from computed import computed, differences
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from leaky_loops import FRAMEWORK_SETUP, FRAMEWORKS, HOLDER_CLEAN, HOLDER_LEAKS, HOLDERS, SETUP  # noqa: E402

pytestmark = pytest.mark.kernel

#: what the tests read of a report (of the holders' scan series, only the steps scanned: a failure message says
#: how many scans measured a holder whose growth is missing)
REPORT = (
    "(lambda r: {k: r[k] for k in ('verdict', 'leak_kind', 'resource', 'clock', 'steps', 'epochs', 'wall_s', 'advice')}"
    " | {'heap_per_step': (r['heap'] or {}).get('per_step'),"
    " 'suspects': [{k: s[k] for k in ('name', 'path', 'kind', 'tensors', 'graph_nodes', 'retained_bytes',"
    " 'new_in_cell', 'growth_per_step', 'first_seen_step', 'fix')}"
    " | {'scanned_at_steps': [point[0] for point in s['series'] or ()]} for s in r['suspects']]})"
    "(torchmem_magic.last_report().to_dict())"
)


def _said(report: dict[str, Any]) -> str:
    """The report as a failure message: in full (pytest shortens a dict), the other helpers read it."""
    return json.dumps(report, indent=1)


def _installed(framework: str | None) -> bool:
    return framework is None or importlib.util.find_spec(framework) is not None


@pytest.fixture(scope="module")
def k(kernel: Kernel, tmp_path_factory: pytest.TempPathFactory) -> Kernel:
    kernel.ok(SETUP + f"lightning_root = {str(tmp_path_factory.mktemp('lightning'))!r}\n")
    for framework, setup in FRAMEWORK_SETUP.items():
        if _installed(framework):
            kernel.ok(setup, timeout_s=120)
    # what every loop may use; anything else a loop leaves in the namespace is deleted after it
    kernel.ok("_kept_names = set(globals())")
    return kernel


#: deletes what a loop left in the namespace
CLEAR = (
    "for _n in [n for n in globals() if n not in _kept_names and not n.startswith('_')]:\n"
    "    del globals()[_n]\n"
    "import gc; gc.collect()"
)
#: each loop's report, for the tests that read it after the first (one run per loop)
_REPORTS: dict[str, dict[str, Any]] = {}


def _report(k: Kernel, name: str) -> dict[str, Any]:
    """The report of the catalogue's loop `name`, run once in the shared kernel."""
    framework = FRAMEWORKS[name]
    if not _installed(framework):
        pytest.skip(f"{framework} is not installed (`make setup` installs the test group)")
    if name not in _REPORTS:
        body = HOLDER_LEAKS[name][0] if name in HOLDER_LEAKS else HOLDER_CLEAN[name]
        try:  # watched first (as a user's first run is), then bare: the two must compute the same
            watched = computed(k, body, "%%memwatch -q --interval 50")
            _REPORTS[name] = k.value(REPORT)
            k.ok(CLEAR, store_history=False)
            _REPORTS[name]["changed_by_watching"] = differences(watched, computed(k, body))
        finally:
            k.ok(CLEAR, store_history=False)
    return _REPORTS[name]


@pytest.mark.parametrize("name", sorted(HOLDER_LEAKS))
def test_leak_is_called_and_its_holder_named_first(k: Kernel, name: str) -> None:
    kind = HOLDER_LEAKS[name][1]
    holder, path = HOLDERS[name]
    report = _report(k, name)
    assert (report["verdict"], report["leak_kind"]) == ("leak", kind), _said(report)
    assert report["suspects"], _said(report)
    top = report["suspects"][0]
    assert top["name"] == holder and top["path"].startswith(path), _said(report)


@pytest.mark.parametrize("name", sorted(HOLDER_LEAKS))
def test_leak_holders_growth_is_measured_while_the_loop_runs(k: Kernel, name: str) -> None:
    """The named holder's own mid-run scans show it growing, at about the rate the curves show (the holder
    is where the memory goes; a graph-only leak's rate is the holder's alone)."""
    report = _report(k, name)
    holder = HOLDERS[name][0]
    top = next((s for s in report["suspects"] if s["name"] == holder), None)
    assert top is not None and top["growth_per_step"] is not None, _said(report)
    assert top["growth_per_step"] == pytest.approx(report["heap_per_step"], rel=0.5), _said(report)


def test_a_metric_never_reset_is_fixed_by_resetting_it(k: Kernel) -> None:
    report = _report(k, "torchmetrics_cat_metric_never_reset")
    assert report["suspects"] and "all_embeddings.reset()" in report["suspects"][0]["fix"], _said(report)


@pytest.mark.parametrize("name", sorted(HOLDER_CLEAN))
def test_clean_loop_is_clean_with_no_suspect(k: Kernel, name: str) -> None:
    report = _report(k, name)
    assert report["verdict"] == "clean" and report["suspects"] == [], _said(report)


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_watching_changes_nothing_the_loop_computes(k: Kernel, name: str) -> None:
    """Run watched, then bare, from the same seeds: the same parameters and tensors left (bitwise), RNG states
    and grad mode."""
    report = _report(k, name)
    assert report["changed_by_watching"] == [], _said(report)


def test_every_leak_names_its_holder() -> None:
    assert set(HOLDERS) == set(HOLDER_LEAKS)
    assert not set(HOLDER_LEAKS) & set(HOLDER_CLEAN)
    assert {f for f in FRAMEWORKS.values() if f} == set(FRAMEWORK_SETUP)
