"""CUDA (or MPS) memory as the caching allocator and the driver report it; never creates a context."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from ..model import DeviceMemory
from .base import NAN, Reading


def parse_device(spec: str) -> int:
    """'cuda:1', 'cuda' or '1' -> CUDA device index; ValueError naming the accepted forms.

    Checks the index against the visible device count, which queries the driver without
    creating a CUDA context.
    """
    text = spec.strip().lower()
    if text in ("cuda", "gpu"):
        text = "0"
    if text.startswith("cuda:"):
        text = text[5:]
    if not text.isdigit():
        raise ValueError(f"--device takes 'cuda', 'cuda:N' or 'N', got {spec!r}")
    import torch

    visible = torch.cuda.device_count()
    if int(text) >= visible:
        raise ValueError(f"--device {spec}: {visible} CUDA device(s) visible" + ("" if visible else " (no CUDA here)"))
    return int(text)


@dataclass
class AcceleratorProbe:
    """CUDA (or MPS) memory of the watched devices; reads nothing until the user's code has
    initialised the accelerator, so observing never creates a CUDA context.

    Args:
        devices: CUDA indices to watch; None watches every device the caching allocator uses.
    """

    devices: list[int] | None = None
    _torch: Any = field(default=None, repr=False)
    name: str = field(default="accelerator", init=False)
    columns: tuple[str, ...] = field(default=("vram_allocated_bytes", "vram_reserved_bytes"), init=False)
    _totals: dict[int, int | None] = field(default_factory=dict, repr=False, init=False)  # a device's size never changes

    def _torch_module(self) -> Any:
        return self._torch if self._torch is not None else sys.modules.get("torch")

    def _cuda(self) -> Any:
        torch = self._torch_module()
        if torch is None:
            return None
        cuda = getattr(torch, "cuda", None)
        try:
            return cuda if cuda is not None and cuda.is_initialized() else None
        except Exception:
            return None

    @staticmethod
    def _raw_stats(cuda: Any, index: int) -> dict[str, Any]:
        """The caching allocator's nested stats: one C call, unlike memory_allocated()'s flattening."""
        return cuda.memory_stats_as_nested_dict(index) or {}

    def _watched(self, cuda: Any) -> list[tuple[int, dict[str, Any]]]:
        indices = self.devices if self.devices is not None else range(cuda.device_count())
        out: list[tuple[int, dict[str, Any]]] = []
        for index in indices:
            stats = self._raw_stats(cuda, index)
            if self.devices is not None or stats.get("reserved_bytes", {}).get("all", {}).get("current", 0):
                out.append((index, stats))
        return out

    def device_uuids(self) -> list[str]:
        """UUIDs of the CUDA devices this process's allocator holds memory on (its own devices);
        empty before CUDA is initialised (reading them never initialises it)."""
        cuda = self._cuda()
        if cuda is None:
            return []
        out = []
        for index, _ in self._watched(cuda):
            try:
                out.append(str(cuda.get_device_properties(index).uuid).lower().removeprefix("gpu-"))
            except Exception:
                continue
        return out

    def read(self) -> Reading:
        """Allocated and reserved bytes summed over the watched devices; NaN without one in use."""
        allocated, reserved = self._allocated_reserved()
        return {"vram_allocated_bytes": allocated, "vram_reserved_bytes": reserved}

    def close(self) -> None:
        pass

    def _allocated_reserved(self) -> tuple[float, float]:
        cuda = self._cuda()
        if cuda is None:
            return self._read_mps()
        watched = self._watched(cuda)
        if not watched:
            return NAN, NAN
        allocated = sum(stats["allocated_bytes"]["all"]["current"] for _, stats in watched)
        reserved = sum(stats["reserved_bytes"]["all"]["current"] for _, stats in watched)
        return float(allocated), float(reserved)

    def _read_mps(self) -> tuple[float, float]:
        torch = self._torch_module()
        if torch is None or sys.platform != "darwin":
            return NAN, NAN
        try:
            if not torch.backends.mps.is_available() or not torch.mps.driver_allocated_memory():
                return NAN, NAN
            return float(torch.mps.current_allocated_memory()), float(torch.mps.driver_allocated_memory())
        except Exception:
            return NAN, NAN

    def reserved_by_device(self) -> list[tuple[str, int, int | None]]:
        """(name, reserved bytes, total bytes or None) of each watched CUDA device: what the memory
        guard holds against each device's size (one device can fill while another is empty)."""
        cuda = self._cuda()
        if cuda is None:
            return []
        out: list[tuple[str, int, int | None]] = []
        for index, stats in self._watched(cuda):
            if index not in self._totals:
                try:
                    self._totals[index] = int(cuda.get_device_properties(index).total_memory)
                except Exception:
                    self._totals[index] = None
            out.append((f"cuda:{index}", int(stats["reserved_bytes"]["all"]["current"]), self._totals[index]))
        return out

    def details(self) -> list[DeviceMemory]:
        """Per-device stats incl. peaks, retries and total memory (slower: call at start and end)."""
        cuda = self._cuda()
        if cuda is None:
            allocated, reserved = self._read_mps()
            if allocated != allocated:
                return []
            return [DeviceMemory("mps", int(allocated), int(reserved), int(allocated), int(reserved), None, None, None)]
        out = []
        for index, stats in self._watched(cuda):
            free: int | None = None
            total: int | None = None
            try:  # a watched device has a context already, so this creates none
                free, total = (int(v) for v in cuda.mem_get_info(index))
            except Exception:
                try:
                    total = int(cuda.get_device_properties(index).total_memory)
                except Exception:
                    pass
            out.append(
                DeviceMemory(
                    name=f"cuda:{index}",
                    allocated_bytes=stats["allocated_bytes"]["all"]["current"],
                    reserved_bytes=stats["reserved_bytes"]["all"]["current"],
                    allocated_peak_bytes=stats["allocated_bytes"]["all"]["peak"],
                    reserved_peak_bytes=stats["reserved_bytes"]["all"]["peak"],
                    num_alloc_retries=stats.get("num_alloc_retries"),
                    total_bytes=total,
                    free_bytes=free,
                )
            )
        return out
