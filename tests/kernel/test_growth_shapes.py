"""Growth that stops is no leak, growth that starts late or pauses is one, in a real kernel, at the default
interval and a short one: a memo filled during the first epoch of four is clean and named as the cache that
filled, with its size; a leak that begins two thirds into the run, or pauses between two ramps, is a leak whose
holder is named first, and where the steps are slow enough to be sampled densely the curves say where it began. Each runs watched, then bare: watching must not change what it computed."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from computed import computed, differences
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from leaky_loops import GROWTH_BEGINS_AT, GROWTH_SHAPES, SETUP  # noqa: E402

pytestmark = pytest.mark.kernel


CLEAR = "for _n in [n for n in globals() if n not in _kept_names and not n.startswith('_')]:\n    del globals()[_n]\nimport gc; gc.collect()"


@pytest.fixture(scope="module")
def k(kernel: Kernel) -> Kernel:
    kernel.ok(SETUP + "_kept_names = set(globals()) | {'_kept_names'}\n")
    return kernel


@pytest.mark.parametrize("interval", ["", "--interval 10"], ids=["default", "10ms"])
@pytest.mark.parametrize("name", sorted(GROWTH_SHAPES))
def test_growth_that_stops_is_clean_and_growth_that_goes_on_leaks(k: Kernel, name: str, interval: str) -> None:
    body, verdict, holder = GROWTH_SHAPES[name]
    try:  # watched, then bare: the two must compute the same
        watched = computed(k, body, f"%%memwatch -q {interval}", timeout_s=240)
        report = k.value(
            "(lambda r: {k: r[k] for k in ('verdict', 'leak_kind', 'steps', 'advice')}"
            " | {'suspects': [s['name'] for s in r['suspects']]})(torchmem_magic.last_report().to_dict())"
        )
        k.ok(CLEAR, store_history=False)
        report["changed_by_watching"] = differences(watched, computed(k, body, timeout_s=240))
    finally:
        k.ok(CLEAR, store_history=False)
    said = json.dumps(report, indent=1)
    assert report["changed_by_watching"] == [], said
    assert report["verdict"] == verdict, said
    if verdict == "leak":
        assert report["suspects"][:1] == [holder], said
        if name in GROWTH_BEGINS_AT:  # the curves tell where it began, not only its holder
            began = re.search(r"leak in \w+: .*, since step ([\d,]+)", report["advice"][0])
            assert began and abs(int(began[1].replace(",", "")) - GROWTH_BEGINS_AT[name]) <= 40, said
    else:
        assert report["suspects"] == [], said
        # named as the cache that filled, with its size; on a busy machine the scans may all come before it
        # filled (they thin out), and only the curves then show that its growth did not go on
        filled = [line for line in report["advice"] if line.startswith(f"{holder} is a cache that filled: it grew by ")]
        ruled_out = f"{holder}'s scans rose, but the memory it lives in did not grow with it"
        assert (filled and "MiB" in filled[0]) or any(line.startswith(ruled_out) for line in report["advice"]), said


def test_a_cache_filled_early_is_clean_also_on_a_churned_heap(k: Kernel) -> None:
    """On a heap with many holes (a kernel that has run for a while) a step sample, glibc's walk of the free
    lists, costs milliseconds, and the budget alone would thin the samples to one in a thousand steps: the
    400-step loop would keep none after its first few dozen, and the memo's fill would read as growth to
    its end. The samples come at least twice each time the steps double, so its flat rest is seen."""
    body, verdict, _ = GROWTH_SHAPES["per_sample_memo_filled_in_first_epoch"]
    k.ok("_holes = [torch.randn(10 + i % 300) for i in range(40_000)]\ndel _holes[::2]", store_history=False)
    try:
        k.ok("%%memwatch -q --interval 10\n" + body, timeout_s=240)
        report = k.value("(lambda r: {k: r[k] for k in ('verdict', 'steps', 'advice')})(torchmem_magic.last_report().to_dict())")
        later = k.value("[s for s in torchmem_magic.last_report().timeline.by_step.column('step') if 150 <= s < 400]")
    finally:
        k.ok("del _holes\n" + CLEAR, store_history=False)
    assert report["steps"] == 400 and len(later) >= 2, (later, report)
    assert report["verdict"] == verdict == "clean", json.dumps(report, indent=1)


#: a memo filled with new samples until a live verdict computed during the fill calls it a leak or a suspect
#: (or 10,000 samples), then reused for twice as many steps, until a live verdict computed after them has come
#: and the live holder line no longer names the memo (or two minutes: scans thin out as they cost more, and
#: on a busy machine the first that shows the memo flat may come late): ([the verdict during the fill, the
#: verdict on the plateau], samples, steps, the live holder line)
LIVE_FILL_THEN_PLATEAU = """\
view = torchmem_magic.session.run.active_session().view
model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)
projection = torch.randn(64, 4096); memo = {}
def features(i):
    if i not in memo:
        memo[i] = torch.tanh(torch.randn(1, 64) @ projection)
    return memo[i]
def live_verdict_since(step):
    live = view.last_live_verdict()
    return live[1] if live is not None and live[0] > started[step] else None
import time
started, step, said = {}, 0, []
while not said and step < 10_000:
    started[step] = view.elapsed_s
    train_step(model, opt, features(step)[:, :64]); step += 1
    said = [v for v in [live_verdict_since(max(0, step - 20))] if v and v.startswith(("leak", "suspect"))]
filled = step
deadline = time.monotonic() + 120
names_memo = lambda: (view.live_holder() or "").startswith("memo ")
while (len(said) < 2 or names_memo()) and time.monotonic() < deadline:
    started[step] = view.elapsed_s
    train_step(model, opt, features(step % filled)[:, :64]); step += 1
    if step > 3 * filled and len(said) < 2:
        said += [v for v in [live_verdict_since(3 * filled)] if v]
live_said = (said, filled, step, view.live_holder())
"""


def test_the_live_verdict_calls_a_fill_while_it_lasts_and_comes_back_once_it_flattened(k: Kernel) -> None:
    """Also the live holder line: it stops naming the memo as growing once its scans show it flat."""
    try:
        k.ok("%%memwatch\n" + LIVE_FILL_THEN_PLATEAU, timeout_s=240)
        said, filled, steps, holder_line = k.value("live_said")
        report = k.value("torchmem_magic.last_report().verdict")
    finally:
        k.ok(CLEAR, store_history=False)
    assert filled < 10_000 and len(said) == 2, (said, filled, steps)  # a leak while it filled, then a verdict after
    assert said[1] == "clean" and report == "clean", (said, filled, steps)
    # the live holder line (the figure's and the guard's) no longer names the memo once it stopped growing
    assert holder_line is None or not holder_line.startswith("memo "), holder_line
