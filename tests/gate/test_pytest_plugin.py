"""The pytest plugin, as users run it: pytest in a subprocess on a small test file, where the leaking
test must fail with its holder and fix in the message and the clean one must pass."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CHECKOUT = HERE.parents[1]
PLUGIN = "torchmem_magic.pytest_plugin"

TRAINING_TESTS = '''
import pytest
import torch
from gate_loops import STEPS, make_model, metric, train_step

torch.set_num_threads(1)


@pytest.mark.no_leak
def test_leaky():
    model, optimizer = make_model()
    val_losses = []
    for _ in range(STEPS):
        train_step(model, optimizer)
        val_losses.append(metric(model))


@pytest.mark.no_leak(interval_ms=20)
def test_clean():
    model, optimizer = make_model()
    val_losses = []
    for _ in range(STEPS):
        train_step(model, optimizer)
        val_losses.append(metric(model).item())


def test_leaky_but_not_marked():
    model, optimizer = make_model()
    val_losses = []
    for _ in range(STEPS):
        train_step(model, optimizer)
        val_losses.append(metric(model))


@pytest.mark.no_leak
def test_its_own_failure_wins():
    model, optimizer = make_model()
    val_losses = []
    for _ in range(STEPS):
        train_step(model, optimizer)
        val_losses.append(metric(model))
    raise ValueError("the test's own failure")


@pytest.mark.no_leak(intervall_ms=20)
def test_misspelt_option():
    pass


@pytest.mark.no_leak(20)
def test_positional_option():
    pass
'''

PLAIN_TESTS = '''
import sys


def test_the_plugin_loaded_but_unused_imports_nothing_else():
    assert sorted(m for m in sys.modules if m.startswith("torchmem_magic")) == ["torchmem_magic", "%s"]
    assert "torch" not in sys.modules and "psutil" not in sys.modules
''' % PLUGIN


def _pytest(folder: Path, *args: str, site: Path | None = None) -> dict[str, str | None]:
    """Run pytest on `folder`; each test's outcome: None when it passed, else its failure message."""
    (folder / "pytest.ini").write_text("[pytest]\n")  # not this project's settings
    paths = [str(p) for p in (site, CHECKOUT, HERE) if p is not None]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    junit = folder / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers",
               f"--junitxml={junit}", *args, str(folder)]
    run = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert junit.exists(), run.stdout + run.stderr
    outcomes: dict[str, str | None] = {}
    for case in ET.parse(junit).iter("testcase"):
        failure = case.find("failure")
        assert case.find("error") is None and case.find("skipped") is None, run.stdout
        outcomes[case.attrib["name"]] = None if failure is None else failure.attrib.get("message", "")
    return outcomes


def test_a_marked_leaking_test_fails_with_its_holder_and_a_clean_one_passes(tmp_path: Path) -> None:
    (tmp_path / "test_training.py").write_text(TRAINING_TESTS)
    outcomes = _pytest(tmp_path, "-p", PLUGIN)
    assert set(outcomes) == {"test_leaky", "test_clean", "test_leaky_but_not_marked", "test_its_own_failure_wins",
                             "test_misspelt_option", "test_positional_option"}
    message = outcomes["test_leaky"]
    assert message is not None and "LeakError: memwatch verdict: leak over 200 steps — " in message, message
    assert "top holder: val_losses " in message
    assert "fix: wrap the code that fills val_losses in `with torch.no_grad():`" in message
    assert "val_losses.append(metric(model))" in message  # the test's own line
    assert outcomes["test_clean"] is None
    assert outcomes["test_leaky_but_not_marked"] is None  # the marker, not the plugin, turns the gate on
    assert outcomes["test_its_own_failure_wins"] == "ValueError: the test's own failure"
    assert "TypeError: unknown option intervall_ms" in (outcomes["test_misspelt_option"] or "")
    assert "no_leak takes keyword options only" in (outcomes["test_positional_option"] or "")


def test_the_plugin_loaded_but_unused_costs_nothing(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(PLAIN_TESTS)
    assert _pytest(tmp_path, "-p", PLUGIN) == {"test_the_plugin_loaded_but_unused_imports_nothing_else": None}


def _entry_points() -> dict[str, str]:
    with open(CHECKOUT / "pyproject.toml", "rb") as file:
        return dict(tomllib.load(file)["project"]["entry-points"]["pytest11"])


def test_the_plugin_is_declared_as_a_pytest11_entry_point() -> None:
    assert _entry_points() == {PLUGIN: PLUGIN}


@pytest.mark.parametrize("also_named", [False, True], ids=["entry point", "entry point and -p"])
def test_installed_the_entry_point_loads_the_plugin(tmp_path: Path, also_named: bool) -> None:
    # an installed distribution declaring the project's pytest11 entry points (this checkout's
    # package itself is installed elsewhere, so the declaration is tried on its own)
    site = tmp_path / "site"
    info = site / "torchmem_magic_entry_points-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchmem-magic-entry-points\nVersion: 0\n")
    lines = [f"{name} = {target}" for name, target in _entry_points().items()]
    (info / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(lines) + "\n")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_training.py").write_text(TRAINING_TESTS)
    outcomes = _pytest(tests, *(["-p", PLUGIN] if also_named else []), "-k", "test_leaky and not marked", site=site)
    assert list(outcomes) == ["test_leaky"]
    assert "top holder: val_losses " in (outcomes["test_leaky"] or "")
