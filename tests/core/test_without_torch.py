"""The package does not install torch; where torch is missing, its entry points say so in one line.

In the core venvs (no torch at all) these run for real; where torch is installed, its absence is simulated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchmem_magic
from torchmem_magic.core import needs

REAL = not needs.torch_installed()  # the core venvs
MESSAGE = "torchmem_magic needs PyTorch: install your build first"


@pytest.fixture()
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    if not REAL:
        monkeypatch.setattr(needs, "torch_installed", lambda: False)
        for name in torchmem_magic._NEEDS_TORCH:  # loaded by earlier tests: looked up afresh
            monkeypatch.delitem(vars(torchmem_magic), name, raising=False)


@pytest.mark.parametrize("name", ["memwatch", "assert_no_leak"])
def test_each_entry_point_raises_one_line(no_torch: None, name: str) -> None:
    entry = getattr(torchmem_magic, name)
    with pytest.raises(needs.TorchMissingError) as raised:
        entry()
    text = str(raised.value)
    assert text.startswith(MESSAGE) and "\n" not in text and text.endswith("then run this again")
    assert isinstance(raised.value, ImportError)
    assert name not in vars(torchmem_magic)  # not cached: a torch installed later is found


class _Shell:
    def __init__(self) -> None:
        self.registered: list[Any] = []

    def register_magics(self, magics: Any) -> None:
        self.registered.append(magics)


def test_the_extension_says_so_in_one_line_and_registers_nothing(
    no_torch: None, capsys: pytest.CaptureFixture[str]
) -> None:
    shell = _Shell()
    torchmem_magic.load_ipython_extension(shell)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(MESSAGE) and "%reload_ext torchmem_magic" in captured.err
    assert shell.registered == []


@pytest.mark.skipif(not REAL, reason="torch is installed here")
def test_a_script_without_torch_ends_with_the_one_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", "import torchmem_magic\nwith torchmem_magic.memwatch():\n    pass\n"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"torchmem_magic.core.needs.TorchMissingError: {MESSAGE}"), run.stderr
    assert "ModuleNotFoundError" not in run.stderr and "psutil" not in run.stderr


@pytest.mark.skipif(not os.environ.get("TORCHMEM_CORE_INSTALLED"), reason="run from the checkout")
def test_the_core_runs_against_the_installed_package() -> None:
    checkout = Path(__file__).resolve().parents[2]
    module = Path(torchmem_magic.__file__).resolve()
    assert not module.is_relative_to(checkout / "torchmem_magic") and "site-packages" in module.parts, module
