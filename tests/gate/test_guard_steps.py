"""The memory guard at step boundaries: a fast optimizer loop writing a segment into a small tmpfs (the
watched shared-memory filesystem, `shm_path`) at every step fills it within one sampling interval. The
sampler's interval here is 10 s, so only the checks at steps can stop it; they must stop it at the last
step under the threshold, never at ENOSPC, both over the dense first steps and once the sampling stride
has thinned. RAM's limit is set far away (the sampler's first rows, a few ms apart while torch sets up,
would project its start-up growth over a 10 s interval). Each tmpfs is mounted for its test; where
mounting is not permitted the tests skip."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from torchmem_magic import MemoryGuardError, MemwatchSession
from torchmem_magic.core.options import SessionOptions
from torchmem_magic.probes.limits import RAM_LIMIT_VARIABLE

MIB, KIB = 1 << 20, 1 << 10
PAGE = 4 * KIB  # tmpfs counts whole pages
SHARE = 0.8
LONG_INTERVAL_MS = 10_000.0  # the sampler thread's checks never come during the loop


@pytest.fixture(autouse=True)
def _ram_limit_far_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RAM_LIMIT_VARIABLE, str(1 << 40))


def _mount_tmpfs(where: Path, size_mib: int) -> Iterator[Path]:
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no `mount` command here: a small tmpfs cannot be made for the fill")
    where.mkdir()
    done = subprocess.run([mount, "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a {size_mib} MiB tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.fixture()
def tmpfs_16mib(tmp_path: Path) -> Iterator[Path]:
    yield from _mount_tmpfs(tmp_path / "shm", 16)


@pytest.fixture()
def tmpfs_64mib(tmp_path: Path) -> Iterator[Path]:
    yield from _mount_tmpfs(tmp_path / "shm", 64)


def _used_bytes(where: Path) -> int:
    return shutil.disk_usage(where).used


def filling_loop(where: Path, segment_bytes: int, written: list[int], steps: int, warm_up_steps: int = 0,
                 sized_by_stride: Callable[[int], int] | None = None, session: MemwatchSession | None = None) -> None:
    """An optimizer loop that writes a segment of `segment_bytes` into `where` after every step (the
    warm-up steps write one and remove it: as long a step, nothing kept). With `sized_by_stride`, the
    segments written after the warm-up are as big as it says for the sampling stride the session has
    then (how far apart its step checks are depends on how fast this machine runs the steps)."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    segment = b"\1" * segment_bytes
    for i in range(warm_up_steps + steps):
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()  # the guard's MemoryGuardError comes out of here
        if i == warm_up_steps and sized_by_stride is not None and session is not None:
            segment = b"\1" * sized_by_stride(session.step_counter.sampling.stride)
        path = where / f"segment{i}"
        path.write_bytes(segment)
        if i < warm_up_steps:
            path.unlink()
            continue
        written.append(i)


def _assert_stopped_at_the_last_segment_under_the_threshold(
    caught: pytest.ExceptionInfo[MemoryGuardError], session: MemwatchSession, where: Path, size_bytes: int,
    segment_bytes: int, written: list[int],
) -> None:
    threshold_bytes = SHARE * size_bytes
    under = int(threshold_bytes // segment_bytes)  # segments that fit under the threshold
    assert len(written) == under, (len(written), under)
    assert _used_bytes(where) == under * segment_bytes < threshold_bytes  # never at the threshold, far from ENOSPC
    trip = caught.value.trip
    assert trip is not None and trip.level.resource == "/dev/shm" and trip.projected
    first = str(caught.value).splitlines()[0]
    assert first.startswith("memwatch guard: /dev/shm at ") and f"of its {size_bytes // MIB}.0 MiB limit (its size)" in first
    assert "would pass 80%" in first and "/step (" in first and first.endswith("stopped before a DataLoader worker's bus error")
    report = session.report
    assert report is not None and report.status == "error"
    assert report.advice[0].startswith(f"the memory guard stopped the run after {report.steps:,} steps with MemoryGuardError")


def test_a_fill_from_the_first_step_stops_at_the_last_segment_under_the_threshold(tmpfs_16mib: Path) -> None:
    """1 MiB a step into 16 MiB: 12 segments fit under 80% (12.8 MiB), the 17th would be ENOSPC."""
    written: list[int] = []
    session = MemwatchSession(SessionOptions(LONG_INTERVAL_MS, shm_path=str(tmpfs_16mib), guard=SHARE))
    with pytest.raises(MemoryGuardError) as caught:
        with session:
            filling_loop(tmpfs_16mib, MIB, written, steps=20)
    _assert_stopped_at_the_last_segment_under_the_threshold(caught, session, tmpfs_16mib, 16 * MIB, MIB, written)
    assert session.report is not None and session.report.steps == len(written) + 1  # it raised before writing


def test_a_fill_after_the_stride_thinned_stops_at_the_last_segment_under_the_threshold(tmpfs_64mib: Path) -> None:
    """After 400 steps the step samples are every few dozen steps; then a fill into 64 MiB that reaches
    80% (51.2 MiB) in about four strides: its growth per step, seen at the first check after it began,
    brings the checks closer, to every step near the threshold. Checked only at the thinned stride, the
    fill would pass the threshold."""
    written: list[int] = []
    chosen: list[tuple[int, int]] = []  # (the stride after the warm-up, the segments' size for it)

    def four_strides_to_the_threshold(stride: int) -> int:
        chosen.append((stride, max(PAGE, int(SHARE * 64 * MIB / (4 * stride)) // PAGE * PAGE)))
        return chosen[-1][1]

    session = MemwatchSession(SessionOptions(LONG_INTERVAL_MS, shm_path=str(tmpfs_64mib), guard=SHARE))
    with pytest.raises(MemoryGuardError) as caught:
        with session:
            filling_loop(tmpfs_64mib, 256 * KIB, written, steps=1_000_000, warm_up_steps=400,
                         sized_by_stride=four_strides_to_the_threshold, session=session)
    assert chosen and chosen[0][0] >= 4, f"the stride did not thin over the warm-up ({chosen}): nothing to test"
    segment_bytes = chosen[0][1]
    _assert_stopped_at_the_last_segment_under_the_threshold(caught, session, tmpfs_64mib, 64 * MIB, segment_bytes, written)


def test_without_the_guard_the_fill_runs_into_enospc(tmpfs_16mib: Path) -> None:
    """The fill itself: without --guard it ends in `No space left on device` at the 17th segment."""
    written: list[int] = []
    with pytest.raises(OSError, match="No space left on device"):
        with MemwatchSession(SessionOptions(LONG_INTERVAL_MS, shm_path=str(tmpfs_16mib))):
            filling_loop(tmpfs_16mib, MIB, written, steps=20)
    assert len(written) == 16
