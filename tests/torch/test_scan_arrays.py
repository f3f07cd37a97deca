"""Tensors in containers the garbage collector does not see into: numpy object arrays and pandas object
columns. Scanned with a path a user can type, and named as the holder of a real run's leak."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from torchmem_magic import memcheck, memwatch
from torchmem_magic.finder.scan.results import Root
from torchmem_magic.finder.scan.scanner import scan_roots

pd = pytest.importorskip("pandas")
MIB = 1 << 20


def _scanned(name: str, obj: Any) -> tuple[int, str | None]:
    stats = scan_roots([Root(name, "user", name, obj)]).roots[0]
    return stats.retained_bytes, stats.first_tensor_path


def test_an_object_array_and_a_frames_object_column_are_read_into_with_typable_paths() -> None:
    flat = np.empty(20, dtype=object)
    flat[17] = torch.ones(MIB // 4)
    grid = np.empty((3, 6), dtype=object)
    grid[2, 5] = torch.ones(MIB // 4)
    frame = pd.DataFrame({"step": range(4), "conf": [torch.ones(MIB // 4) for _ in range(4)]})
    assert _scanned("flat", flat) == (MIB, "flat[17]")
    assert _scanned("grid", grid) == (MIB, "grid[2, 5]")
    assert _scanned("frame", frame) == (4 * MIB, "frame['conf'].iloc[0]")
    assert _scanned("conf", frame["conf"]) == (4 * MIB, "conf.iloc[0]")
    assert _scanned("numbers", np.zeros((512, 512))) == (0, None)  # numbers hold no object


def test_memcheck_reads_into_an_object_array() -> None:
    kept = np.empty(8, dtype=object)
    for i in range(8):
        kept[i] = torch.ones(MIB // 4, requires_grad=True) * 2
    result = memcheck(kept)
    assert result.retained_bytes >= 8 * MIB and any(f.path.startswith("kept[") or "[7]" in f.path for f in result.findings)


STEPS = 200


def _train(log: Any) -> Any:
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        out = model(torch.randn(64, 256))
        loss = out.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log(step, out)
    return model


def test_losses_kept_in_a_numpy_object_array_are_the_named_holder() -> None:
    outputs = np.empty(STEPS, dtype=object)

    def log(step: int, out: torch.Tensor) -> None:
        outputs[step] = out  # the output with its graph, where `.detach()` was meant

    with memwatch(20, quiet=True) as watched:
        _train(log)
    report = watched.report
    assert report.verdict == "leak", report.advice
    assert report.suspects and report.suspects[0].name == "outputs", report.suspects
    assert report.suspects[0].path.startswith("outputs["), report.suspects[0]


def test_outputs_kept_in_a_dataframe_column_are_the_named_holder() -> None:
    rows: list[dict[str, Any]] = []
    frames: dict[str, Any] = {}

    def log(step: int, out: torch.Tensor) -> None:
        rows.append({"step": step, "out": out})
        if step % 20 == 19:  # a table rebuilt from the rows now and then, the rows let go
            frames["log"] = pd.concat([frames["log"], pd.DataFrame(rows)]) if "log" in frames else pd.DataFrame(rows)
            rows.clear()

    with memwatch(20, quiet=True) as watched:
        _train(log)
    report = watched.report
    assert report.verdict == "leak", report.advice
    named = {s.name: s.path for s in report.suspects}
    assert "frames" in named and named["frames"].startswith("frames['log']['out'].iloc["), report.suspects
