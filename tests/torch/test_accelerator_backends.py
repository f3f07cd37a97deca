"""Each accelerator backend on a fake of the torch module it reads (torch.cuda, torch.mps, torch.accelerator):
its readings reach the timeline's columns and the report's device summaries, and a device present but not
initialised is never touched: only the functions that cannot initialise it are called."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from torchmem_magic.session.actions import collect_garbage
from torchmem_magic.probes.accelerator import AcceleratorProbe, parse_device
from torchmem_magic.probes.backends import AcceleratorModuleBackend, CudaBackend, MpsBackend
from torchmem_magic.report.assemble import assemble_report
from torchmem_magic.report.evidence import RunEvidence
from torchmem_magic.render.results import Report
from torchmem_magic.core.timeline import Timeline

GIB = 1 << 30


@dataclass
class Device:
    """A fake accelerator's state, and the functions called on it before it was initialised."""

    initialised: bool = True
    touched: list[str] = field(default_factory=list)
    empties: int = 0


def fake_module(name: str, device: Device, harmless: tuple[str, ...], **functions: Callable[..., Any]) -> ModuleType:
    """A module whose functions, all but `harmless` ones, record their name when called on a device that
    is not initialised (on real torch, such a call may create the device's context)."""
    module = ModuleType(name)
    for function_name, function in functions.items():
        def call(*args: Any, _name: str = function_name, _function: Callable[..., Any] = function) -> Any:
            if not device.initialised and _name not in harmless:
                device.touched.append(_name)
            return _function(*args)

        setattr(module, function_name, call)
    return module


def fake_cuda(device: Device, in_use: dict[int, tuple[int, int]]) -> ModuleType:
    def stats(index: int) -> dict[str, Any]:
        allocated, reserved = in_use.get(index, (0, 0))
        return {"allocated_bytes": {"all": {"current": allocated, "peak": 2 * allocated}},
                "reserved_bytes": {"all": {"current": reserved, "peak": reserved}}, "num_alloc_retries": 3}

    def empty() -> None:
        device.empties += 1

    return fake_module(
        "torch.cuda", device, ("is_initialized", "device_count", "is_available"),
        is_initialized=lambda: device.initialised, device_count=lambda: 3, is_available=lambda: True,
        memory_stats_as_nested_dict=stats, memory_allocated=lambda i=None: stats(i or 0)["allocated_bytes"]["all"]["current"],
        get_device_properties=lambda i: SimpleNamespace(total_memory=80 * GIB, uuid=f"GPU-uuid-{i}"),
        mem_get_info=lambda i: (70 * GIB, 80 * GIB), empty_cache=empty, init=lambda: None, current_device=lambda: 0,
        synchronize=lambda *a: None,
    )


def fake_mps(device: Device) -> ModuleType:
    def empty() -> None:
        device.empties += 1

    return fake_module(
        "torch.mps", device, ("is_available", "driver_allocated_memory"), is_available=lambda: True,
        current_allocated_memory=lambda: 3 * GIB, driver_allocated_memory=lambda: 5 * GIB if device.initialised else 0,
        recommended_max_memory=lambda: 24 * GIB, empty_cache=empty,
    )


def fake_xpu_torch(device: Device, with_memory_api: bool = True) -> SimpleNamespace:
    """torch with an XPU: torch.accelerator names it; its memory figures come from torch.accelerator's
    memory functions (flat stats), or from torch.xpu's own where torch.accelerator has none."""
    stats = {0: (100, 300), 1: (0, 0), 2: (7, 9)}

    def flat(index: int) -> dict[str, int]:
        allocated, reserved = stats[index]
        return {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": allocated + 1,
                "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": reserved + 1, "num_alloc_retries": 0}

    def empty() -> None:
        device.empties += 1

    memory: dict[str, Callable[..., Any]] = {
        "memory_stats": flat, "get_memory_info": lambda i: (GIB, 16 * GIB), "empty_cache": empty,
    } if with_memory_api else {}
    accelerator = fake_module(
        "torch.accelerator", device, ("current_accelerator", "is_available", "device_count"),
        current_accelerator=lambda check_available=False: SimpleNamespace(type="xpu"), is_available=lambda: True,
        device_count=lambda: 3, current_device_index=lambda: 0, **memory,
    )
    xpu = fake_module(
        "torch.xpu", device, ("is_initialized", "device_count", "is_available"),
        is_initialized=lambda: device.initialised, device_count=lambda: 3, is_available=lambda: True,
        get_device_properties=lambda i: SimpleNamespace(uuid=f"XPU-{i}", total_memory=16 * GIB),
        memory_allocated=lambda i: stats[i][0], memory_reserved=lambda i: stats[i][1],
        max_memory_allocated=lambda i: stats[i][0] + 1, max_memory_reserved=lambda i: stats[i][1] + 1,
        empty_cache=empty, init=lambda: None,
    )
    return SimpleNamespace(accelerator=accelerator, xpu=xpu)


def report_of(probe: AcceleratorProbe) -> tuple[Timeline, Report]:
    """A run of three steps whose only device figures are the probe's: its rows, its start and end details."""
    timeline = Timeline()
    start = tuple(probe.details())
    for step in range(1, 4):
        row = {"t_s": 0.1 * step, "step": float(step), "ram_bytes": float(GIB), **probe.read()}
        timeline.by_time.append(row)
        timeline.by_step.append(row)
    evidence = RunEvidence(timeline=timeline, steps=3, wall_s=0.3, interval_s=0.1, ram_limit_bytes=64 * GIB,
                           ram_limit_source="system", heap_available=False, devices_start=start,
                           devices_end=tuple(probe.details()))
    return timeline, assemble_report(evidence)


def test_cuda_readings_reach_the_timeline_and_the_report() -> None:
    device = Device()
    probe = AcceleratorProbe(_torch=SimpleNamespace(cuda=fake_cuda(device, {0: (100, 200), 2: (10, 20)})))
    timeline, report = report_of(probe)
    assert timeline.by_time.last_value("vram_allocated_bytes") == 110 and timeline.by_time.last_value("vram_reserved_bytes") == 220
    assert report.vram is not None and report.vram.devices == ("cuda:0", "cuda:2")
    assert report.vram.allocated_end_bytes == 110 and report.vram.reserved_end_bytes == 220 and report.vram.limit_bytes == 160 * GIB
    assert report.to_dict()["vram"]["allocated_end"] == 110
    assert probe.device_uuids() == ["uuid-0", "uuid-2"]
    assert probe.reserved_by_device() == [("cuda:0", 200, 80 * GIB), ("cuda:2", 20, 80 * GIB)]
    collect_garbage(probe)
    assert device.empties == 1 and device.touched == []


def test_cuda_present_but_not_initialised_is_never_touched() -> None:
    """Every read asks torch.cuda.is_initialized() first: without it the probe would call the allocator's
    stats (and on real torch could create a context) in a process that never used CUDA."""
    device = Device(initialised=False)
    cuda = fake_cuda(device, {0: (100, 200)})
    probe = AcceleratorProbe(_torch=SimpleNamespace(cuda=cuda))
    reading = probe.read()
    assert set(reading) == set(probe.columns) and all(math.isnan(v) for v in reading.values())
    assert probe.details() == [] and probe.device_uuids() == [] and probe.reserved_by_device() == []
    assert probe.empty_cache() is None and collect_garbage(probe).action == "gc + empty_cache"
    assert all(math.isnan(v) for v in AcceleratorProbe(devices=[0], _torch=SimpleNamespace(cuda=cuda)).read().values())
    backend = CudaBackend(SimpleNamespace(cuda=cuda))
    assert backend.available()  # asked without initialising: the device count
    assert backend.in_use(None) == [] and backend.in_use([0]) == []
    assert backend.memory_info(0) == (None, None) and backend.uuid(0) is None and backend.empty_cache() is False
    assert device.touched == [] and device.empties == 0


def test_mps_readings_reach_the_timeline_and_the_report() -> None:
    device = Device()
    torch = SimpleNamespace(cuda=fake_cuda(Device(initialised=False), {}), mps=fake_mps(device))
    probe = AcceleratorProbe(_torch=torch)
    timeline, report = report_of(probe)
    assert timeline.by_time.last_value("vram_allocated_bytes") == 3 * GIB
    assert timeline.by_time.last_value("vram_reserved_bytes") == 5 * GIB
    assert report.vram is not None and report.vram.devices == ("mps",) and report.vram.limit_bytes == 24 * GIB
    assert report.vram.per_device[0].total_bytes == 24 * GIB
    assert probe.reserved_by_device() == [("mps", 5 * GIB, 24 * GIB)] and probe.device_uuids() == []
    assert probe.empty_cache() == "mps" and device.empties == 1


def test_mps_without_driver_memory_is_not_read() -> None:
    device = Device(initialised=False)
    probe = AcceleratorProbe(_torch=SimpleNamespace(mps=fake_mps(device)))
    assert all(math.isnan(v) for v in probe.read().values()) and probe.details() == []
    assert MpsBackend(SimpleNamespace(mps=fake_mps(device))).empty_cache() is False
    assert device.touched == []  # the driver's own count only: MPS has no is_initialized()


@pytest.mark.parametrize("with_memory_api", [True, False], ids=["torch.accelerator.memory", "device module"])
def test_xpu_readings_through_torch_accelerator_reach_the_report(with_memory_api: bool) -> None:
    device = Device()
    probe = AcceleratorProbe(_torch=fake_xpu_torch(device, with_memory_api))
    timeline, report = report_of(probe)
    assert timeline.by_time.last_value("vram_allocated_bytes") == 107
    assert timeline.by_time.last_value("vram_reserved_bytes") == 309
    assert report.vram is not None and report.vram.devices == ("xpu:0", "xpu:2")
    assert report.vram.per_device[0].allocated_peak_bytes == 101 and report.vram.num_alloc_retries == 0
    assert probe.device_uuids() == ["xpu-0", "xpu-2"]
    if with_memory_api:
        assert report.vram.limit_bytes == 32 * GIB
    assert probe.empty_cache() == "xpu" and device.empties == 1


def test_xpu_not_initialised_is_never_touched() -> None:
    device = Device(initialised=False)
    torch = fake_xpu_torch(device)
    probe = AcceleratorProbe(_torch=torch)
    assert all(math.isnan(v) for v in probe.read().values())
    assert probe.details() == [] and probe.device_uuids() == [] and probe.empty_cache() is None
    backend = AcceleratorModuleBackend(torch)
    assert backend.device_type == "xpu" and backend.available()
    assert backend.in_use(None) == [] and backend.memory_info(0) == (None, None) and backend.uuid(0) is None
    assert backend.empty_cache() is False
    assert device.touched == []


def test_the_generic_backend_leaves_cuda_and_mps_to_their_own() -> None:
    for kind in ("cuda", "mps"):
        accelerator = SimpleNamespace(current_accelerator=lambda check_available=False, k=kind: SimpleNamespace(type=k))
        backend = AcceleratorModuleBackend(SimpleNamespace(accelerator=accelerator, cuda=None, mps=None))
        assert not backend.available() and not backend.initialised()


def test_the_gc_button_reads_zero_when_empty_cache_gives_every_byte_back() -> None:
    """After empty_cache() no device holds memory, so the probe lists none: the button's 'after' figures
    are 0 B (the accelerator is still initialised), not unknown."""
    device = Device()
    in_use = {0: (0, 2 * GIB)}  # all of it cached, nothing allocated
    cuda = fake_cuda(device, in_use)
    cuda.empty_cache = lambda: in_use.clear()  # type: ignore[attr-defined]
    result = collect_garbage(AcceleratorProbe(_torch=SimpleNamespace(cuda=cuda)))
    assert (result.cuda_reserved_before, result.cuda_reserved_after, result.cuda_allocated_after) == (2 * GIB, 0, 0)
    assert "reserved 2.0 GiB → 0 B" in str(result)


def test_each_backend_reads_its_own_device_names_without_touching_a_device() -> None:
    """`--device` names a device of the accelerator in use: its backend counts the devices (asking no context)."""
    device = Device(initialised=False)
    cuda = SimpleNamespace(cuda=fake_cuda(device, {}))
    assert parse_device("cuda:2", cuda) == 2 and parse_device("gpu", cuda) == 0 and parse_device("1", cuda) == 1
    mps = SimpleNamespace(mps=fake_mps(device))
    assert parse_device("mps", mps) == 0
    with pytest.raises(ValueError, match="1 MPS device"):
        parse_device("mps:1", mps)
    xpu = fake_xpu_torch(device)
    assert parse_device("xpu:2", xpu) == 2
    with pytest.raises(ValueError, match="3 XPU device"):
        parse_device("xpu:3", xpu)
    with pytest.raises(ValueError, match=r"takes 'cuda', 'cuda:N' or 'N' \(here also 'xpu:N'\), got 'tpu'"):
        parse_device("tpu", xpu)
    assert device.touched == []


def test_a_cuda_error_in_the_driver_is_said_in_the_report_never_read_as_no_cuda() -> None:
    """A broken driver (a CUDA call in a forked child, a lost device) raises inside the backend: the probe
    still reads no device, and the report says the CUDA backend failed, with the driver's words."""

    def broken() -> int:
        raise RuntimeError("CUDA error: initialization error")

    cuda = ModuleType("torch.cuda")
    cuda.device_count = broken  # type: ignore[attr-defined]
    cuda.is_initialized = lambda: True  # type: ignore[attr-defined]
    probe = AcceleratorProbe(_torch=SimpleNamespace(cuda=cuda))
    assert probe.read() == {} or all(math.isnan(v) for v in probe.read().values())
    errors = {count.source: count for count in probe.error_counts()}
    assert errors["CUDA backend"].count >= 1 and "CUDA error: initialization error" in errors["CUDA backend"].last
    tl = Timeline()
    for step in range(20):
        tl.by_time.append({"t_s": step * 0.1, "step": float(step), "ram_bytes": float(GIB)})
    summary = next(e.summary() for e in probe.error_counts() if e.source == "CUDA backend")
    assert summary is not None
    report = assemble_report(RunEvidence(tl, 20, 2.0, 0.1, 16 * GIB, "system", False, source_errors=(summary,)))
    assert any(line.startswith("the CUDA backend failed") and "initialization error" in line for line in report.advice)
