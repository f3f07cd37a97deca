"""Accelerators behind one protocol: CUDA, MPS, and any other device type `torch.accelerator` reports.

Each backend is handed the user's torch module (a fake one in the tests) and reads it only once the
user's own code has initialised that accelerator: every read checks `initialised()` first, so a
session never creates a device context, which would cost the user memory and break a later fork.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .base import ErrorCount


@dataclass(frozen=True)
class DeviceStats:
    """One device's allocator figures at one reading (bytes)."""

    index: int
    allocated_bytes: int
    reserved_bytes: int
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    num_alloc_retries: int | None = None


class AcceleratorBackend(Protocol):
    """One kind of accelerator as torch exposes it. Nothing here initialises the device: a backend that
    is not `initialised()` answers every read with nothing."""

    device_type: str  # "cuda", "mps", "xpu": the prefix of its devices' names
    errors: ErrorCount  # what its calls into torch raised (a driver's error), counted into the report

    def available(self) -> bool:
        """This torch has the accelerator and a device is visible (asked without initialising it)."""
        ...

    def initialised(self) -> bool:
        """The user's code has initialised it, so reading its counters creates nothing."""
        ...

    def in_use(self, devices: Sequence[int] | None) -> list[DeviceStats]:
        """The figures of `devices`, or of every device whose allocator holds memory (None)."""
        ...

    def memory_info(self, index: int) -> tuple[int | None, int | None]:
        """(free, total) bytes of a device as the driver reports them; None where unknown."""
        ...

    def uuid(self, index: int) -> str | None:
        """The device's UUID (to match the driver's view of which process uses which device)."""
        ...

    def empty_cache(self) -> bool:
        """Return the allocator's unused cached memory to the device; False when not initialised."""
        ...

    def name(self, index: int) -> str:
        """'cuda:0', 'mps', 'xpu:1'."""
        ...

    def device_count(self) -> int:
        """Devices visible, counted without initialising the accelerator (0: none, or not this torch's)."""
        ...


def _calls(module: Any, name: str, *args: Any) -> Any:
    """`module.name(*args)`, None where this torch has no such function."""
    function = getattr(module, name, None)
    return None if function is None else function(*args)


class CudaBackend:
    """torch.cuda: the caching allocator's nested stats, one C call per device."""

    device_type = "cuda"

    def __init__(self, torch: Any) -> None:
        self._cuda: Any = getattr(torch, "cuda", None)
        self.errors = ErrorCount("CUDA backend")  # a driver's error is said as such, never read as "no CUDA"

    def available(self) -> bool:
        return self.device_count() > 0

    def device_count(self) -> int:
        try:  # asks the driver (NVML where it can) without creating a context
            return int(self._cuda.device_count()) if self._cuda is not None else 0
        except Exception as exc:
            self.errors.record(exc)
            return 0

    def initialised(self) -> bool:
        try:
            return self._cuda is not None and bool(self._cuda.is_initialized())
        except Exception as exc:
            self.errors.record(exc)
            return False

    def in_use(self, devices: Sequence[int] | None) -> list[DeviceStats]:
        if not self.initialised():
            return []
        cuda = self._cuda
        out = []
        for index in devices if devices is not None else range(cuda.device_count()):
            stats = cuda.memory_stats_as_nested_dict(index) or {}
            allocated, reserved = stats.get("allocated_bytes", {}).get("all", {}), stats.get("reserved_bytes", {}).get("all", {})
            if devices is None and not reserved.get("current", 0):
                continue  # no memory there: a device this process does not use
            out.append(DeviceStats(
                index, int(allocated.get("current", 0)), int(reserved.get("current", 0)),
                int(allocated.get("peak", allocated.get("current", 0))), int(reserved.get("peak", reserved.get("current", 0))),
                stats.get("num_alloc_retries"),
            ))
        return out

    def memory_info(self, index: int) -> tuple[int | None, int | None]:
        if not self.initialised():
            return None, None
        try:  # a device in use has a context already, so this creates none
            free, total = (int(v) for v in self._cuda.mem_get_info(index))
            return free, total
        except Exception as exc:
            self.errors.record(exc)
            try:
                return None, int(self._cuda.get_device_properties(index).total_memory)
            except Exception as exc:
                self.errors.record(exc)
                return None, None

    def uuid(self, index: int) -> str | None:
        if not self.initialised():
            return None
        try:
            return str(self._cuda.get_device_properties(index).uuid).lower().removeprefix("gpu-")
        except Exception as exc:
            self.errors.record(exc)
            return None

    def empty_cache(self) -> bool:
        if not self.initialised():
            return False
        self._cuda.empty_cache()
        return True

    def name(self, index: int) -> str:
        return f"cuda:{index}"


class MpsBackend:
    """torch.mps (Apple silicon): one device; the driver's allocation counts as reserved. It has no
    peak counters and no is_initialized(): it counts as initialised once the driver holds memory."""

    device_type = "mps"

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._mps: Any = getattr(torch, "mps", None)
        self.errors = ErrorCount("MPS backend")

    def available(self) -> bool:
        if self._mps is None:
            return False
        try:  # False on a build without Metal, before anything else of torch.mps is called
            check = getattr(self._mps, "is_available", None) or self._torch.backends.mps.is_available
            return bool(check())
        except Exception as exc:
            self.errors.record(exc)
            return False

    def initialised(self) -> bool:
        try:
            return self.available() and bool(self._mps.driver_allocated_memory())
        except Exception as exc:
            self.errors.record(exc)
            return False

    def device_count(self) -> int:
        return 1 if self.available() else 0  # one GPU, shared with the CPU

    def in_use(self, devices: Sequence[int] | None) -> list[DeviceStats]:
        if not self.initialised():
            return []
        allocated, reserved = int(self._mps.current_allocated_memory()), int(self._mps.driver_allocated_memory())
        return [DeviceStats(0, allocated, reserved, allocated, reserved)]

    def memory_info(self, index: int) -> tuple[int | None, int | None]:
        if not self.initialised():
            return None, None
        try:
            total = _calls(self._mps, "recommended_max_memory")  # what Metal recommends this process stays within
            return None, None if total is None else int(total)
        except Exception as exc:
            self.errors.record(exc)
            return None, None

    def uuid(self, index: int) -> str | None:
        return None

    def empty_cache(self) -> bool:
        if not self.initialised():
            return False
        self._mps.empty_cache()
        return True

    def name(self, index: int) -> str:
        return "mps"


class AcceleratorModuleBackend:
    """Any other accelerator torch.accelerator reports (XPU, HPU, ...), through torch.accelerator's
    memory functions where this torch has them, else the device module's own. It reads only once the
    device module says it is initialised; a device type that cannot say is never read."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._accelerator: Any = getattr(torch, "accelerator", None)
        self.errors = ErrorCount("accelerator backend")
        self.device_type = self._type() or "accelerator"
        self.errors.source = f"{self.device_type} backend"

    def _type(self) -> str | None:
        try:  # the compile-time accelerator: asks no driver
            device = _calls(self._accelerator, "current_accelerator")
        except Exception as exc:
            self.errors.record(exc)
            return None
        kind = getattr(device, "type", None)
        return None if kind in (None, "cuda", "mps", "cpu") else str(kind)  # those two have their own backends

    def _module(self) -> Any:
        kind = self._type()
        return None if kind is None else getattr(self._torch, kind, None)

    def available(self) -> bool:
        try:
            return self._type() is not None and bool(self._accelerator.is_available())
        except Exception as exc:
            self.errors.record(exc)
            return False

    def device_count(self) -> int:
        try:
            return int(_calls(self._accelerator, "device_count") or 0) if self.available() else 0
        except Exception as exc:
            self.errors.record(exc)
            return 0

    def initialised(self) -> bool:
        try:
            return bool(_calls(self._module(), "is_initialized"))
        except Exception as exc:
            self.errors.record(exc)
            return False

    def _memory(self) -> Any:
        """torch.accelerator.memory's functions where this torch has them, else the device module's."""
        return self._accelerator if hasattr(self._accelerator, "memory_stats") else self._module()

    def in_use(self, devices: Sequence[int] | None) -> list[DeviceStats]:
        if not self.initialised():
            return []
        memory = self._memory()
        count = _calls(self._accelerator, "device_count") or _calls(self._module(), "device_count") or 0
        out = []
        for index in devices if devices is not None else range(int(count)):
            stats = _calls(memory, "memory_stats", index) or {}
            allocated = int(stats.get("allocated_bytes.all.current", _calls(memory, "memory_allocated", index) or 0))
            reserved = int(stats.get("reserved_bytes.all.current", _calls(memory, "memory_reserved", index) or 0))
            if devices is None and not reserved:
                continue
            peak = stats.get("allocated_bytes.all.peak", _calls(memory, "max_memory_allocated", index))
            reserved_peak = stats.get("reserved_bytes.all.peak", _calls(memory, "max_memory_reserved", index))
            out.append(DeviceStats(index, allocated, reserved, int(peak or allocated), int(reserved_peak or reserved),
                                   stats.get("num_alloc_retries")))
        return out

    def memory_info(self, index: int) -> tuple[int | None, int | None]:
        if not self.initialised():
            return None, None
        try:
            info = _calls(self._accelerator, "get_memory_info", index) or _calls(self._module(), "mem_get_info", index)
            return (None, None) if info is None else (int(info[0]), int(info[1]))
        except Exception as exc:
            self.errors.record(exc)
            return None, None

    def uuid(self, index: int) -> str | None:
        if not self.initialised():
            return None
        try:
            value = getattr(_calls(self._module(), "get_device_properties", index), "uuid", None)
            return None if value is None else str(value).lower()
        except Exception as exc:
            self.errors.record(exc)
            return None

    def empty_cache(self) -> bool:
        if not self.initialised():
            return False
        _calls(self._memory(), "empty_cache")
        return True

    def name(self, index: int) -> str:
        return f"{self.device_type}:{index}"


def backends_of(torch: Any) -> tuple[AcceleratorBackend, ...]:
    """Every backend this torch could have, in the order a session asks them which one is in use."""
    return (CudaBackend(torch), MpsBackend(torch), AcceleratorModuleBackend(torch))
