"""Long lists of plain records that the earlier scans of one run checked, so the next scan checks only
what was appended.

A run-state object holding tens of thousands of plain records (`history.records.append({...})` at every
step) costs ~0.5 µs a record to check for tensors: ~20 ms for 40,000, more than the scans during a short
run may spend in all, so the holder beside those records went unmeasured until the end. Records are
appended, not rewritten: a list seen before, still as long and starting and ending its checked part
with the same objects, is checked from where the last scan stopped (also where its time ran out midway:
on a busy machine the first check of 40,000 records takes longer than one scan may), plus a few items
spread over the part already checked (a tensor written over an old record is found by the scan at the end of the cell,
which checks everything). Only ids and counts are kept: no reference to the lists or their items.
"""

from __future__ import annotations

from typing import Any

MIN_ITEMS = 1024  # shorter lists are checked whole: cheap
SPOT_CHECKS = 8  # items of the part already checked that are checked again, at each scan
MAX_LISTS = 256


class PlainListMemo:
    """For one run's scans: id of a list -> (items checked, plain containers among them, id of the first
    item, id of the last checked item)."""

    def __init__(self) -> None:
        self._lists: dict[int, tuple[int, int, int, int]] = {}
        self._round = 0  # which items the spot checks take, moved on at every scan

    def next_scan(self) -> None:
        self._round += 1

    def known_prefix(self, items: list[Any], still_plain: Any) -> tuple[int, int]:
        """(items to skip, plain containers among them) for `items`; (0, 0) when it must be checked whole.
        `still_plain(item)` tells whether an item of the checked part is still atomic or plain data."""
        entry = self._lists.get(id(items))
        if entry is None:
            return 0, 0
        checked, plain, first_id, last_id = entry
        if len(items) < checked or id(items[0]) != first_id or id(items[checked - 1]) != last_id:
            del self._lists[id(items)]  # another list at the same address, or this one rewritten
            return 0, 0
        stride = max(1, checked // SPOT_CHECKS)
        for k in range(SPOT_CHECKS):
            index = (k * stride + self._round * 7919) % checked
            if not still_plain(items[index]):
                del self._lists[id(items)]
                return 0, 0
        return checked, plain

    def remember(self, items: list[Any], plain: int, checked: int | None = None) -> None:
        """The first `checked` items of `items` (all of them by default) were checked and held only
        atomic or plain data, `plain` containers among them."""
        checked = len(items) if checked is None else checked
        if len(items) < MIN_ITEMS or checked <= 0 or (id(items) not in self._lists and len(self._lists) >= MAX_LISTS):
            return
        self._lists[id(items)] = (checked, plain, id(items[0]), id(items[checked - 1]))
