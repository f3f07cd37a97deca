"""One cell of the fault matrix, in a fresh process: `python fault_scenario.py STAGE KIND`.

A part of ours fails (KIND `error`: a ValueError) or is interrupted (KIND `interrupt`: KeyboardInterrupt)
the first time it runs, at STAGE: the start's first reading (`probes`), the hooks' install (`hooks`), the
start scan (`start_scan`), a scan between steps (`mid_scan`), the search back (`search`), the report's
assembly (`report`), the text report printed at the end (`render`). The loop keeps 16 KiB a step in a library's global (only a search names it). Prints one
JSON line: what the user's code saw, the report, the failures it counts, and what was left behind."""

from __future__ import annotations

import importlib
import json
import sys
import time
import types
from typing import Any

import torch
from left_behind import changes, snapshot

TARGETS = {
    "probes": ("torchmem_magic.probes.bundle", "ProbeBundle", "background_row"),
    "hooks": ("torchmem_magic.tracing.hooks", "TrainingHooks", "install"),
    "start_scan": ("torchmem_magic.finder.scan.memo", None, "scan_roots"),
    "mid_scan": ("torchmem_magic.finder.holder_tracking", None, "scan_roots"),
    "search": ("torchmem_magic.finder.leak_finder", None, "search_back"),
    "report": ("torchmem_magic.session.run", None, "assemble_report"),
    "render": ("torchmem_magic.render.results", None, "report_text"),
}
PRINTED = {"render"}  # the stages of a run that prints its report (the others are quiet)


def inject(stage: str, kind: str) -> list[int]:
    """Make the part at `stage` fail once, at its first call; the calls are counted in the list returned."""
    module_name, class_name, name = TARGETS[stage]
    module = importlib.import_module(module_name)
    owner = getattr(module, class_name) if class_name else module
    real, calls = getattr(owner, name), [0]

    def faulty(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyboardInterrupt if kind == "interrupt" else ValueError("injected fault")
        return real(*args, **kwargs)

    setattr(owner, name, faulty)
    return calls


def train() -> None:
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(400):
        loss = model(torch.randn(32, 64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        sys.modules["featurestore"].CACHE.append(torch.randn(64, 64))
        time.sleep(0.002)


def main(stage: str, kind: str) -> dict[str, Any]:
    import torchmem_magic
    from torchmem_magic.tracing.hooks import installed_hook_count

    warm = torch.nn.Linear(2, 1)  # torch's first step sets TORCHINDUCTOR_CACHE_DIR: before `before`
    torch.optim.SGD(warm.parameters(), lr=0.1).step()
    calls = inject(stage, kind)
    store = types.ModuleType("featurestore")
    store.CACHE = []  # type: ignore[attr-defined]
    sys.modules["featurestore"] = store
    del store
    before, seen = snapshot(), "ok"
    try:
        with torchmem_magic.memwatch(20, quiet=stage not in PRINTED):
            train()
    except BaseException as exc:  # what the user's code sees
        seen = f"{type(exc).__name__}: {exc}"
    report = torchmem_magic.last_report()
    facts = report.to_dict() if report is not None else {}
    after = snapshot()
    return {
        "calls": calls[0], "seen": seen, "report": None if report is None else report.status,
        "verdict": facts.get("verdict"),
        "failed": [] if report is None else [[e.source, e.count] for e in report.source_errors],
        "said": [line for line in facts.get("advice", []) if "injected fault" in line],
        "hooks": installed_hook_count(), **changes(before, after),
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
