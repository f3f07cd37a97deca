"""The sdist and the wheel: every module of the source tree in the wheel and nothing else, the same
wheel whether built from the sdist or the tree, metadata that an index accepts."""

from __future__ import annotations

import ast
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from distributions import Built, run
from kernel_client import pinned_floors

pytestmark = pytest.mark.install


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _metadata(wheel: Path) -> tuple[str, dict[str, list[str]]]:
    """The wheel's dist-info directory and its METADATA fields (repeated fields as lists)."""
    (info,) = {name.split("/")[0] for name in _members(wheel) if ".dist-info/" in name}
    message = Parser().parsestr(_members(wheel)[f"{info}/METADATA"].decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return info, fields


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(built: Built) -> None:
    package = built.source / "torchmem_magic"
    expected = {path.relative_to(built.source).as_posix() for path in package.rglob("*") if path.is_file()}
    assert "torchmem_magic/agent/bootstrap/sitecustomize.py" in expected and "torchmem_magic/py.typed" in expected
    assert any(name.startswith("torchmem_magic/flight/") for name in expected)
    members = _members(built.wheel)
    info, _ = _metadata(built.wheel)
    assert {name for name in members if not name.startswith(info + "/")} == expected
    assert {name.removeprefix(info + "/") for name in members if name.startswith(info + "/")} == {
        "METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt", "licenses/LICENSE",
    }
    for name in expected:  # the installed files are the source files, byte for byte
        assert members[name] == (built.source / name).read_bytes(), name


def test_the_sdist_builds_the_same_wheel_as_the_tree(built: Built) -> None:
    assert built.wheel.name == built.tree_wheel.name
    assert _members(built.wheel) == _members(built.tree_wheel)
    with tarfile.open(built.sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "torchmem_magic/agent/bootstrap/sitecustomize.py"} <= names


def test_the_metadata_passes_the_index_checks(built: Built) -> None:
    done = run([sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)], cwd=built.source)
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_version_lives_in_one_place_and_the_metadata_is_complete(built: Built) -> None:
    source = (built.source / "torchmem_magic" / "__init__.py").read_text()
    (version,) = [node.value.value for node in ast.parse(source).body
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__version__"]
    with open(built.source / "pyproject.toml", "rb") as file:
        project = tomllib.load(file)["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    info, fields = _metadata(built.wheel)
    assert info == f"torchmem_magic-{version}.dist-info" and fields["Version"] == [version]
    assert fields["License-Expression"] == ["BSD-3-Clause"] and fields["License-File"] == ["LICENSE"]
    assert {"Source", "Documentation", "Issues", "Changelog"} <= {url.split(",")[0] for url in fields["Project-URL"]}
    assert fields["Requires-Python"] == [">=3.10"]
    tested = {f"Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12, 13)}
    assert tested <= set(fields["Classifier"])
    requirements = fields["Requires-Dist"]
    assert not [r for r in requirements if r.startswith("torch")]  # the user's own torch build is never replaced
    assert set(fields["Provides-Extra"]) == {"lab", "nvml", "prometheus", "tensorboard", "lightning", "transformers"}  # not the contributors' tools
    assert fields["Description-Content-Type"] == ["text/markdown"]


def test_every_declared_floor_is_the_one_the_floors_environment_tests(built: Built) -> None:
    """Each run-time requirement's lower bound, as published, is pinned in constraints/minimum.txt,
    which `make test` builds its oldest-versions environment from."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    pinned = {name: Version(version) for name, version in pinned_floors().items()}
    _, fields = _metadata(built.wheel)
    runtime = [Requirement(r) for r in fields["Requires-Dist"] if "extra ==" not in r]
    floors = {}
    for requirement in runtime:
        (lower,) = [s for s in requirement.specifier if s.operator == ">="]
        assert len(requirement.specifier) == 1, requirement  # no upper bound that nothing tests
        floors[requirement.name.lower()] = Version(lower.version)
    assert set(floors) == {"ipython", "ipywidgets", "bqplot", "psutil"}
    assert {name: pinned.get(name) for name in floors} == floors
