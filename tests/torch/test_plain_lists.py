"""The scans during a run check a long list of plain records only from where the last scan stopped: what
is appended is still found, a list rewritten or replaced is checked whole, and nothing is kept alive."""

from __future__ import annotations

import sys

import torch

from torchmem_magic.finder.scan.plain_lists import PlainListMemo
from torchmem_magic.finder.scan.results import Budget, Root
from torchmem_magic.finder.scan.scanner import scan_roots


def records(n: int, start: int = 0) -> list[object]:
    return [{"step": i, "loss": 1 / (i + 1), "phase": "train"} for i in range(start, start + n)]


def scan(obj: object, memo: PlainListMemo | None) -> tuple[int, int]:
    stats = scan_roots([Root("run", "user", "run", obj)], Budget(), plain_lists=memo).roots[0]
    return stats.tensors, stats.plain_objects


def test_a_second_scan_counts_the_same_and_checks_only_what_was_appended() -> None:
    run = {"records": records(5_000), "outputs": []}
    memo = PlainListMemo()
    assert scan(run, memo) == scan(run, None) == (0, 5_001)  # the empty list counts too
    assert memo.known_prefix(run["records"], lambda item: True) == (5_000, 5_000)
    run["records"].extend(records(10, 5_000))
    run["records"].append(torch.ones(8))  # appended after the part already checked
    assert scan(run, memo) == scan(run, None) == (1, 5_011)


def test_a_list_rewritten_or_replaced_is_checked_whole() -> None:
    run = {"records": records(5_000)}
    memo = PlainListMemo()
    scan(run, memo)
    run["records"][0] = torch.ones(8)  # its first item is not the one checked
    assert scan(run, memo) == (1, 4_999)
    run["records"] = records(4_000)  # shorter than the part checked (also: perhaps at the same address)
    scan(run, memo)
    run["records"][:] = [torch.ones(4), *records(4_999)]
    assert scan(run, memo) == (1, 4_999)


def test_the_spot_checks_find_tensors_written_over_many_old_records() -> None:
    run = {"records": records(5_000)}
    memo = PlainListMemo()
    scan(run, memo)
    for i in range(1, 4_999, 2):  # half the old part rewritten: a spot check meets one of them
        run["records"][i] = torch.ones(1)
    assert scan(run, memo) == scan(run, None)


def test_only_long_lists_of_plain_data_are_remembered_and_nothing_is_kept_alive() -> None:
    short, mixed = records(100), [*records(3_000), object()]
    long = records(3_000)
    memo = PlainListMemo()
    before = sys.getrefcount(long), sys.getrefcount(long[0])
    scan({"short": short, "mixed": mixed, "long": long}, memo)
    assert memo.known_prefix(short, lambda item: True) == (0, 0)
    assert memo.known_prefix(mixed, lambda item: True) == (0, 0)
    assert memo.known_prefix(long, lambda item: True) == (3_000, 3_000)
    assert (sys.getrefcount(long), sys.getrefcount(long[0])) == before


def test_a_check_cut_short_by_the_scans_time_goes_on_at_the_next_scan() -> None:
    """On a busy machine the first check of a long history takes longer than one scan may: the next scans
    go on from where it stopped, and one of them measures the whole object (else none ever would)."""
    run = {"records": records(200_000), "outputs": [torch.ones(8)]}
    whole = scan(run, None)  # ~0.1 s on a quiet machine: five times what each scan below may take
    memo = PlainListMemo()
    short = Budget(time_s=0.02)
    cut = []
    for _ in range(200):  # a busy machine takes more scans to get through
        cut.append(scan_roots([Root("run", "user", "run", run)], short, plain_lists=memo).roots[0])
        if not cut[-1].truncated:
            break
    assert cut[0].truncated and not cut[-1].truncated, f"all {len(cut)} scans were cut short"
    assert (cut[-1].tensors, cut[-1].plain_objects) == whole
