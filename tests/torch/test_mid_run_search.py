"""The leak finder's search back mid-run, on a fake clock: asked for from another thread, it runs once, at the
next step the budget allows, and what it found is measured at every scan after it, while its own time (bounded
by its own limit) does not hold those scans back."""

from __future__ import annotations

import torch

from torchmem_magic.finder.holder_tracking import HolderTracker
from torchmem_magic.finder.scan.referrers import by_size_class
from torchmem_magic.finder.scan.results import Root

STEP_S = 0.001
SEARCH_S = 0.2  # what the search costs on the fake clock: 20 times what the 1 % budget allows by then


def _run(steps: int, ask_at: int) -> tuple[HolderTracker, list[int], list[int]]:
    """A loop of `steps` steps whose hidden list grows by a tensor a step; the search is asked for before step
    `ask_at`: (the tracker, the steps the search ran at, the steps of every scan)."""
    now = [0.0]
    hidden: list[torch.Tensor] = []
    searched: list[int] = []
    step = 0

    def search() -> list[Root]:
        searched.append(step)
        now[0] += SEARCH_S
        return [Root("module global store.CACHE", "user", "store.CACHE", hidden)]

    tracker = HolderTracker(lambda: [], clock=lambda: now[0], cpu_clock=lambda: now[0], start_allowance_s=0.0)
    scans = []
    for step in range(1, steps + 1):
        if step == ask_at:
            tracker.want_search(search)
        hidden.append(torch.ones(1024))
        now[0] += STEP_S
        if tracker.due_at(step):
            scans.append(step)
            tracker.scan(step)
    return tracker, searched, scans


def test_the_search_runs_once_at_the_next_step_and_what_it_found_is_measured_from_then_on() -> None:
    tracker, searched, scans = _run(4000, ask_at=1000)
    assert searched == [1000] and 1000 in scans  # at once: the budget had room, and the search is not charged to it
    points = tracker.snapshot()["module global store.CACHE"]
    # measured from the search's own scan on (a scan that its time limit cut short records nothing)
    assert points[0][0] == 1000 and {step for step, _ in points} <= {s for s in scans if s >= 1000}
    assert len(points) >= 3 and all(b > a for (_, a), (_, b) in zip(points, points[1:]))  # growing, scan by scan
    assert tracker.spent_s >= 0.99 * SEARCH_S  # counted as the finder's time


def test_the_search_does_not_hold_back_the_scans_after_it() -> None:
    """The scans after it come where they would without it, a quarter of the run so far apart (about 300 steps
    here), not a hundred times its cost later (20 s, 20,000 steps: charged to the 1 % budget, it would be)."""
    _, _, scans = _run(4000, ask_at=1000)
    after = [s for s in scans if s > 1000]
    assert after and after[0] <= 1500, scans


def test_it_searches_from_a_few_storages_of_each_size_that_holds_the_most_bytes() -> None:
    """What piles up is many storages of one size: 1,000 small ones outweigh 30 large ones alive since before,
    each of the few searched from stands for its share of its size's bytes, and they are spread over its
    storages (the oldest and the newest among them)."""
    small = [(16 << 10, [f"small{i}"]) for i in range(1000)]  # 16 MiB in all
    large = [(256 << 10, [f"large{i}"]) for i in range(30)]  # 7.5 MiB
    single = [(10 << 20, ["single"])]  # 10 MiB
    chosen = by_size_class(large + single + small, count=12, per_class=5)
    assert [tensors[0] for _, tensors in chosen] == [
        "small0", "small200", "small400", "small600", "small800", "single",
        "large0", "large6", "large12", "large18", "large24",
    ]
    assert [weight for weight, _ in chosen] == [200 * (16 << 10)] * 5 + [10 << 20] + [6 * (256 << 10)] * 5
    assert len(by_size_class(small + large, count=3, per_class=8)) == 3
