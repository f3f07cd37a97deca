"""What the processes of a watched run inherit, so that each Python process of them that trains
becomes a rank streaming to the watcher: the bootstrap directory first on PYTHONPATH (its
`sitecustomize` arms the process, and does nothing until torch is imported and a step is made), the
watcher's sink address, the sampling interval, whether to scan, and the guard's share.

`python -m torchmem_magic watch` hands it to its command; a session that watches ranks (a notebook
cell, `with memwatch():`) puts it in its own environment while it runs, so that torchrun or a
spawned launcher started inside the block is watched like a forked one, and puts back what was
there when it ends.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from ..core.package import PACKAGE_DIR
from ..core.options import MemwatchOptions
from ..stream.protocol import ENV_SINK

BOOTSTRAP_DIR = os.path.join(PACKAGE_DIR, "agent", "bootstrap")


def watched_environment(base: Mapping[str, str], address: str, options: MemwatchOptions) -> dict[str, str]:
    """`base` plus what makes its Python processes report to the watcher at `address`, with `options` (those a
    rank takes: `MemwatchOptions.environment`); a variable of an option not given is unset, never inherited."""
    env = dict(base)
    path = env.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] != BOOTSTRAP_DIR:
        env["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + path if path else "")
    env[ENV_SINK] = address
    for key, value in options.environment().items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


class ExportedToChildren:
    """The watched environment in this process's own while a session runs; `restore` puts back each
    variable that still holds what was set (one the block changed meanwhile is the block's)."""

    KEYS = ("PYTHONPATH", ENV_SINK, *MemwatchOptions().environment())

    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._before: dict[str, str | None] = {}
        self._set: dict[str, str | None] = {}

    def export(self, address: str, options: MemwatchOptions) -> None:
        self._before = {key: self._environ.get(key) for key in self.KEYS}
        wanted = watched_environment(self._environ, address, options)
        self._set = {key: wanted.get(key) for key in self.KEYS}
        for key, value in self._set.items():
            if value is None:
                self._environ.pop(key, None)
            else:
                self._environ[key] = value

    def restore(self) -> None:
        for key, ours in self._set.items():
            if self._environ.get(key) != ours:
                continue
            before = self._before.get(key)
            if before is None:
                self._environ.pop(key, None)
            else:
                self._environ[key] = before
        self._set = {}
