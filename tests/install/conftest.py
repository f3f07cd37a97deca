"""Fixtures of the install tests: the distributions, built once, and the user's environment."""

from __future__ import annotations

import sys
import venv

import pytest
from distributions import PREINSTALLED, Built, UserEnvironment, installed, pristine_copy, run


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("dist")
    source = pristine_copy(root / "source")
    run([sys.executable, "-m", "build", "--outdir", str(root / "from-sdist"), str(source)], cwd=root)
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(root / "from-tree"), str(source)], cwd=root)
    (sdist,) = (root / "from-sdist").glob("*.tar.gz")
    (wheel,) = (root / "from-sdist").glob("*.whl")
    (tree_wheel,) = (root / "from-tree").glob("*.whl")
    return Built(source, sdist, wheel, tree_wheel)


@pytest.fixture(scope="session")
def user_env(built: Built, tmp_path_factory: pytest.TempPathFactory) -> UserEnvironment:
    root = tmp_path_factory.mktemp("user")
    prefix = root / "venv"
    venv.EnvBuilder(with_pip=True).create(prefix)
    python = prefix / "bin" / "python"
    work = root / "work"
    work.mkdir()
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, *PREINSTALLED], cwd=work)
    before = installed(python, work)
    run([*pip, f"{built.wheel}[lab]"], cwd=work)
    return UserEnvironment(python, prefix, work, before, installed(python, work))
