"""A verdict rule switched off in the table is off for a real run: its live verdict and its report alike
(both are worked out by the same rules, read from the same table)."""

from __future__ import annotations

import torch

from torchmem_magic import memwatch
from torchmem_magic.analysis.findings import Diagnosis
from torchmem_magic.analysis.verdict_table import switched
from torchmem_magic.render.results import Report
from torchmem_magic.session.run import active_session


def _leaking_run() -> tuple[Report, Diagnosis | None]:
    """300 optimizer steps that keep 256 KiB each: (the report, the live verdict at the last step)."""
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kept, live = [], None
    with memwatch(20, quiet=True, scan=False) as watch:
        for step in range(300):
            loss = model(torch.randn(8, 16)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept.append(torch.ones(64 * 1024))
            if step == 299:
                session = active_session()
                assert session is not None and session.view is not None
                session.view._live = None  # work it out now, not a second ago
                live = session.view.live_verdict()
    assert watch.report is not None
    return watch.report, live


def test_the_rule_switched_off_is_off_for_the_live_verdict_and_the_report() -> None:
    report, live = _leaking_run()
    assert (report.verdict, report.leak_kind) == ("leak", "per-iteration"), report.advice
    assert live is not None and (live.verdict, live.leak_kind) == ("leak", "per-iteration"), live
    with switched("per-iteration"):
        report, live = _leaking_run()
    assert report.leak_kind != "per-iteration", report.advice
    assert live is not None and live.leak_kind != "per-iteration", live
