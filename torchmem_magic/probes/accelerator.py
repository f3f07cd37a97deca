"""Accelerator memory as the allocators and drivers report it (backends.py); never creates a context."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from ..core.model import DeviceMemory
from ..core.resources import VRAM, VRAM_RESERVED
from .backends import AcceleratorBackend, DeviceStats, backends_of
from .base import NAN, ErrorCount, Reading


def parse_device(spec: str, torch: Any = None) -> int:
    """'cuda:1', 'cuda' or '1' (a CUDA index), 'mps', 'xpu:0' (any device type torch.accelerator names) ->
    the device index, checked against the device count of the backend its type names, which asks the
    driver without creating a context; ValueError naming the accepted forms."""
    if torch is None:
        import torch
    text = spec.strip().lower()
    kind, colon, index = text.partition(":")
    if not colon:
        kind, index = ("cuda", text) if text.isdigit() else (text, "0")
    kind = "cuda" if kind == "gpu" else kind
    backends = backends_of(torch)
    backend = next((b for b in backends if b.device_type == kind and kind != "accelerator"), None)
    if backend is None or not index.isdigit():
        others = [f"'{b.device_type}:N'" if b.device_count() > 1 else f"'{b.device_type}'"
                  for b in backends if b.device_type != "cuda" and b.device_count()]
        also = f" (here also {', '.join(others)})" if others else ""
        raise ValueError(f"--device takes 'cuda', 'cuda:N' or 'N'{also}, got {spec!r}")
    visible, name = backend.device_count(), kind.upper()
    if int(index) >= visible:
        raise ValueError(f"--device {spec}: {visible} {name} device(s) visible" + ("" if visible else f" (no {name} here)"))
    return int(index)


@dataclass
class AcceleratorProbe:
    """Accelerator memory of the watched devices, through the backend the user's code initialised
    (CUDA, MPS, or another device type of torch.accelerator); reads nothing before that, so observing
    never creates a device context.

    Args:
        devices: device indices to watch; None watches every device whose allocator holds memory.
    """

    devices: list[int] | None = None
    _torch: Any = field(default=None, repr=False)
    name: str = field(default="accelerator", init=False)
    columns: tuple[str, ...] = field(default=(VRAM.column, VRAM_RESERVED.column), init=False)
    _totals: dict[str, int | None] = field(default_factory=dict, repr=False, init=False)  # a device's size never changes
    _backends: tuple[Any, tuple[AcceleratorBackend, ...]] | None = field(default=None, repr=False, init=False)
    _chosen: AcceleratorBackend | None = field(default=None, repr=False, init=False)
    _asked: tuple[AcceleratorBackend, ...] = field(default=(), repr=False, init=False)  # every backend asked

    def error_counts(self) -> list[ErrorCount]:
        """What the backends' calls into torch raised: a driver's error says so in the report."""
        return [backend.errors for backend in self._asked]

    def _torch_module(self) -> Any:
        return self._torch if self._torch is not None else sys.modules.get("torch")

    def backend(self) -> AcceleratorBackend | None:
        """The backend in use: the first one the user's code initialised (None before any). Read at every
        sampled step, so it asks only the backends this torch has, and keeps the one found (an
        accelerator, once initialised, stays so for the life of the process)."""
        torch = self._torch_module()
        if torch is None:
            return None
        if self._backends is None or self._backends[0] is not torch:  # torch imported after the probe was made
            every = backends_of(torch)
            self._asked = every
            self._backends = (torch, tuple(b for b in every if b.available()))
            self._chosen = None
        if self._chosen is None:
            self._chosen = next((b for b in self._backends[1] if b.initialised()), None)
        return self._chosen

    def _in_use(self) -> tuple[AcceleratorBackend | None, list[DeviceStats]]:
        backend = self.backend()
        return backend, [] if backend is None else backend.in_use(self.devices)

    def device_uuids(self) -> list[str]:
        """UUIDs of the devices this process's allocator holds memory on (its own devices); empty
        before the accelerator is initialised (reading them never initialises it)."""
        backend, stats = self._in_use()
        uuids = [] if backend is None else [backend.uuid(s.index) for s in stats]
        return [u for u in uuids if u]

    def read(self) -> Reading:
        """Allocated and reserved bytes summed over the watched devices; NaN without one in use."""
        _, stats = self._in_use()
        if not stats:
            return {VRAM.column: NAN, VRAM_RESERVED.column: NAN}
        return {VRAM.column: float(sum(s.allocated_bytes for s in stats)),
                VRAM_RESERVED.column: float(sum(s.reserved_bytes for s in stats))}

    def close(self) -> None:
        pass

    def empty_cache(self) -> str | None:
        """Have the accelerator in use return its unused cached memory; which one it was (None: none in use)."""
        backend = self.backend()
        return backend.device_type if backend is not None and backend.empty_cache() else None

    def _total(self, backend: AcceleratorBackend, index: int) -> int | None:
        name = backend.name(index)
        if name not in self._totals:
            self._totals[name] = backend.memory_info(index)[1]
        return self._totals[name]

    def reserved_by_device(self) -> list[tuple[str, int, int | None]]:
        """(name, reserved bytes, total bytes or None) of each watched device: what the memory guard
        holds against each device's size (one device can fill while another is empty)."""
        backend, stats = self._in_use()
        if backend is None:
            return []
        return [(backend.name(s.index), s.reserved_bytes, self._total(backend, s.index)) for s in stats]

    def details(self) -> list[DeviceMemory]:
        """Per-device stats incl. peaks, retries and total memory (slower: call at start and end)."""
        backend, stats = self._in_use()
        if backend is None:
            return []
        out = []
        for s in stats:
            free, total = backend.memory_info(s.index)
            out.append(DeviceMemory(
                name=backend.name(s.index), allocated_bytes=s.allocated_bytes, reserved_bytes=s.reserved_bytes,
                allocated_peak_bytes=s.allocated_peak_bytes, reserved_peak_bytes=s.reserved_peak_bytes,
                num_alloc_retries=s.num_alloc_retries, total_bytes=total, free_bytes=free,
            ))
        return out
