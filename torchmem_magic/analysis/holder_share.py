"""What share of a leak's growth each holder explains (pure).

A holder is the answer to "what keeps the memory" only when it explains a stated share of what the memory
it lives in grew by (`holder_trends.MIN_HOLDER_SHARE`): a 4-byte module constant found beside a 300 MiB
leak is no answer, however it was found. The share is the holder's net growth per step between its first
and last scan over the curves' growth per step of the memory its tensors live in: the heap in use (or the
kernel's RSS where the heap is not read) plus accelerator memory; the device alone for a holder whose
tensors are on one, /dev/shm alone for one whose storages are shared-memory segments (batches from
DataLoader workers). A holder with a single size (found by the search at the end) has no rate: what it
holds over what the run grew is the most it can explain, and that is its share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..core.model import Suspect
from .findings import Diagnosis, growth_unaccounted


#: where a holder's tensors mostly live, by its name, where that is not the host's heap: "vram" (an
#: accelerator) or "shm" (shared-memory segments); a name not in it lives in the heap
HolderMemory = Mapping[str, str]


def curves_rate(diagnosis: Diagnosis, memory: str | None = None) -> tuple[float, float] | None:
    """(growth per step, its standard error) of the memory a holder's objects can live in: the heap in
    use (the kernel's RSS where the heap is not read) plus accelerator memory, or for a holder whose
    tensors are on a device (`memory` "vram") that device's memory alone, in shared memory ("shm") /dev/shm
    alone; None when no curve had enough steps to measure it (what no curve measures, no curve can rule out)."""
    measured = {f.resource: f for f in diagnosis.findings if f.verdict != "unknown" and f.per_step_bytes is not None}
    if memory == "shm":
        parts = [measured["shm"]] if "shm" in measured else []
        return None if not parts else (parts[0].per_step_bytes or 0.0, parts[0].per_step_error_bytes or 0.0)
    on_device = memory == "vram"
    host = measured.get("heap") or measured.get("rss") or measured.get("ram")
    parts = [] if on_device else [host] if host is not None else []
    if "vram" in measured and (parts or on_device):
        parts.append(measured["vram"])
    if not parts:
        return None
    return sum(p.per_step_bytes or 0.0 for p in parts), sum(p.per_step_error_bytes or 0.0 for p in parts)


def growth_share(suspect: Suspect, curves: Diagnosis, memory: str | None) -> float | None:
    """The share (0–1) of the curves' growth `suspect` explains; None where the curves show no growth to share.
    A holder with a rate is measured against a leak's rate only (a suspect's is not established: the holder's
    own growth may still make it a leak); one with a single size against what a leak or a suspect grew by."""
    if suspect.growth_per_step is None:
        grown = growth_unaccounted(curves)
        return None if grown is None else min(suspect.retained_bytes / grown, 1.0)
    measured = curves_rate(curves, memory)
    if curves.verdict != "leak" or measured is None or measured[0] <= 0:
        return None
    return min(max(net_growth_per_step(suspect), 0.0) / measured[0], 1.0)


def net_growth_per_step(suspect: Suspect) -> float:
    """What the holder grew by between its first and last scan, per step: the rate a share is measured with.
    A robust slope of a holder that grows in steps (once a validation pass, once an epoch) swings with where
    the scans fell between the steps; the net growth over the span does not, and for a steady holder the two agree."""
    if len(suspect.series) < 2 or suspect.series[-1][0] <= suspect.series[0][0]:
        return suspect.growth_per_step or 0.0
    (first_step, first_bytes), (last_step, last_bytes) = suspect.series[0], suspect.series[-1]
    return (last_bytes - first_bytes) / (last_step - first_step)


def with_growth_shares(suspects: Sequence[Suspect], curves: Diagnosis,
                       memory: HolderMemory | None = None) -> tuple[Suspect, ...]:
    """The suspects with `growth_share` filled in from the curves (before the holders' evidence is fused in)."""
    memory = memory or {}
    return tuple(replace(s, growth_share=growth_share(s, curves, memory.get(s.name))) for s in suspects)
