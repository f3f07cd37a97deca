"""Which processes hold memory on which GPU, as the NVIDIA driver sees it (NVML, `nvidia-ml-py`).

torch's allocator only knows its own process and its own device. A rank that touched CUDA before
`torch.cuda.set_device(rank)` also holds a context (~300–500 MiB) on device 0, which only the
driver's per-process view shows. Devices are named by UUID: NVML's indices need not match CUDA's
(`CUDA_VISIBLE_DEVICES`, device order). Optional: without `nvidia-ml-py` or a driver this says
nothing (None), never zeros.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def normalized_uuid(uuid: str) -> str:
    """'GPU-8f0c…' (NVML) and '8f0c…' (torch) name the same device."""
    text = str(uuid).strip().lower()
    return text.removeprefix("gpu-")


class NvmlProcesses:
    """Reads {device UUID: {pid: used bytes}} for every GPU; `read()` is None where NVML is unavailable.

    Args:
        nvml: the `pynvml` module (imported on first use when not given).
    """

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nvml = nvml
        self._initialized = False
        self.unavailable: str | None = None  # why it cannot say, once known

    def _init(self) -> Any | None:
        if self._initialized:
            return self._nvml
        if self.unavailable is not None:
            return None
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except Exception as exc:  # no package, no driver, no device
            self.unavailable = f"{type(exc).__name__}: {exc}"
            return None
        self._initialized = True
        return self._nvml

    def read(self) -> dict[str, dict[int, int]] | None:
        nvml = self._init()
        if nvml is None:
            return None
        try:
            out: dict[str, dict[int, int]] = {}
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                out[normalized_uuid(uuid)] = {int(p.pid): int(p.usedGpuMemory or 0) for p in processes}
            return out
        except Exception as exc:
            self.unavailable = f"{type(exc).__name__}: {exc}"
            return None

    def close(self) -> None:
        if self._initialized and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
        self._initialized = False
