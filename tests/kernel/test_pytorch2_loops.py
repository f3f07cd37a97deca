"""PyTorch 2 machinery under %%memwatch, in a real kernel: each loop of examples/pytorch2_loops.py runs twice
from the same seed with dynamo's caches emptied, as a user's notebook would, in two parts: two bare cells, then
two watched cells (the compiled callables made inside the first, the second over what the first compiled). Watching must not change what was computed (losses bitwise,
the RNG state after, grad mode) nor what dynamo did (graphs, graph breaks, frames compiled: no recompile of
ours across the two watched cells); the step clock counts the loop's steps; the leaking variant is a leak whose
holder is named, the clean one clean.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from kernel_client import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from pytorch2_loops import LOOPS, SETUP  # noqa: E402

pytestmark = pytest.mark.kernel

STEPS = 150  # a part's steps: enough for the leak's ~256 KiB a step to show in the heap's curve
REPORT = (
    "(lambda r: {k: r[k] for k in ('verdict', 'leak_kind', 'clock', 'steps', 'status', 'advice')}"
    " | {'suspects': [{k: s[k] for k in ('name', 'path', 'kind')} for s in r['suspects']]})"
    "(torchmem_magic.last_report().to_dict())"
)
#: what a part leaves behind to compare: its losses, dynamo's figures, the RNG state and grad mode after it
AFTER = "{'losses': losses, 'dynamo': dynamo_figures(), 'rng': torch.get_rng_state().tolist(), 'grad': torch.is_grad_enabled()}"


@pytest.fixture(scope="module")
def k(kernel: Kernel) -> Kernel:
    kernel.ok(SETUP + "import torchmem_magic.tracing.hooks\n")
    return kernel


def _part(k: Kernel, state: str, keep: bool, watched: bool, first: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One part of a loop on `state` (made anew, with dynamo's caches emptied, when `first`)."""
    k.ok("dynamo_counters.clear(); kept_outputs.clear()\n" + ("torch._dynamo.reset()\n" if first else ""),
         store_history=False)
    body = (f"torch.manual_seed(0); {state} = make()\n" if first else "") + (
        f"torch.manual_seed(1); losses = []\n"
        f"for i in range({STEPS}):\n"
        f"    losses.append(step({state}, i, {keep}))\n"
    )
    k.ok(("%%memwatch -q --interval 50\n" if watched else "") + body, timeout_s=300)
    after = k.value(AFTER, store_history=False)
    report = k.value(REPORT, store_history=False) if watched else None
    assert k.value("torchmem_magic.tracing.hooks.installed_hook_count()", store_history=False) == 0
    return after, report


def _said(*parts: Any) -> str:
    return json.dumps(parts, indent=1)[:6000]


def _differences(bare: dict[str, Any], watched: dict[str, Any]) -> str:
    """What a watched part computed differently from the bare one (the first loss that differs, in full)."""
    said = []
    for key in bare:
        if bare[key] == watched[key]:
            continue
        if key == "losses":
            i = next((i for i, (a, b) in enumerate(zip(bare[key], watched[key])) if a != b), None)
            said.append(f"losses[{i}]: {bare[key][i] if i is not None else len(bare[key])} bare, "
                        f"{watched[key][i] if i is not None else len(watched[key])} watched")
        elif key == "rng":
            said.append("the RNG state after the part")
        else:
            said.append(f"{key}: {bare[key]} bare, {watched[key]} watched")
    return "; ".join(said)


@pytest.mark.parametrize("variant", ["leak", "clean"])
@pytest.mark.parametrize("name", sorted(LOOPS))
def test_watching_changes_nothing_and_judges_the_loop(k: Kernel, name: str, variant: str) -> None:
    loop = LOOPS[name]
    if not k.value(loop.available, store_history=False):
        pytest.skip(f"this torch lacks what {name} needs: {loop.available}")
    k.ok("def make():\n" + loop.make + "def step(state, i, keep):\n" + loop.step, store_history=False)
    keep = variant == "leak"
    first_bare, _ = _part(k, "state", keep, watched=False, first=True)
    second_bare, _ = _part(k, "state", keep, watched=False, first=False)
    first_watched, first_report = _part(k, "state", keep, watched=True, first=True)
    second_watched, report = _part(k, "state", keep, watched=True, first=False)
    k.ok("del state; kept_outputs.clear(); import gc; gc.collect()", store_history=False)

    assert first_watched == first_bare, _differences(first_bare, first_watched)
    assert second_watched == second_bare, _differences(second_bare, second_watched)
    assert first_report is not None and report is not None
    expected_steps = round(STEPS * loop.steps_per_iteration) if loop.clock != "time" else 0
    for r in (first_report, report):
        assert (r["status"], r["clock"], r["steps"]) == ("ok", loop.clock, expected_steps), _said(r)
    if keep:
        assert report["verdict"] == "leak" and report["suspects"], _said(report)
        assert report["suspects"][0]["name"] == "kept_outputs", _said(report)
    else:
        assert report["verdict"] == "clean" and not report["suspects"], _said(report)
