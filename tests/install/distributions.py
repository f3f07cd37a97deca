"""The package as users get it: built into an sdist and a wheel from a pristine copy of this checkout,
the wheel installed into a fresh environment that already holds torch, JupyterLab and ipywidgets, and
everything run from a directory that cannot see this checkout (no PYTHONPATH). The helpers here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(CHECKOUT / "tests" / "kernel"))  # the real-kernel driver the kernel tests use
from kernel_client import Kernel  # noqa: E402


#: the torch of this test run, installed into the user's environment from the same wheel
TORCH_SPEC = "torch==" + metadata.version("torch").split("+")[0]
#: what a user has before installing torchmem_magic
PREINSTALLED = (TORCH_SPEC, "jupyterlab", "ipywidgets")


#: what in this process's environment could point a child at the checkout or this test run's venv
POINTERS = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")


def run(command: list[str], cwd: Path, timeout_s: float = 600, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run `command` in `cwd` with an environment that names no checkout and no virtualenv."""
    env = {k: v for k, v in os.environ.items() if k not in POINTERS}
    env.update(kwargs.pop("env", {}))
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


@dataclass(frozen=True)
class Built:
    source: Path  # the pristine copy the distributions were built from
    sdist: Path
    wheel: Path  # built from the sdist, as `python -m build` does by default
    tree_wheel: Path  # built straight from the source tree


def pristine_copy(dest: Path) -> Path:
    """The files git would commit (tracked, plus new ones not ignored): no build/, egg-info or caches
    whose stale modules a build from the working tree could pick up."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=CHECKOUT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = CHECKOUT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@dataclass(frozen=True)
class UserEnvironment:
    python: Path
    prefix: Path
    work: Path  # where the user's notebooks and scripts live: no checkout in sight
    before: dict[str, list[str]]  # distribution name -> its versions (twice: two copies installed)
    after: dict[str, list[str]]


def installed(python: Path, cwd: Path) -> dict[str, list[str]]:
    """Every distribution the interpreter sees, by normalised name, with the versions found."""
    script = ("import json, re; from importlib import metadata; found = {}\n"
              "for d in metadata.distributions():\n"
              "    found.setdefault(re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(), []).append(d.version)\n"
              "print(json.dumps(found))")
    found: dict[str, list[str]] = json.loads(run([str(python), "-c", script], cwd=cwd).stdout)
    return found


def start_user_kernel(user: UserEnvironment) -> Kernel:
    """A kernel of the user's environment in their work directory (it inherits this environment, less POINTERS)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in POINTERS:
            patch.delenv(name, raising=False)
        return Kernel(python=str(user.python), cwd=str(user.work))
