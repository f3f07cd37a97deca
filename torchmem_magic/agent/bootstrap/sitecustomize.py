"""Start-up hook of every Python process a watched command runs (`python -m torchmem_magic watch`).

Python imports the first `sitecustomize` on sys.path at start-up; the watcher puts this directory
first on the command's PYTHONPATH. It arms the process (a finder waiting for `import torch`; see
`torchmem_magic.agent.boot`), guarded so it can never break the user's program, then runs the
`sitecustomize` this one hides, if any, as if it had been found first.
"""

from __future__ import annotations

import os
import sys


def _arm() -> None:
    if not os.environ.get("TORCHMEM_MAGIC_SINK"):
        return
    try:
        from torchmem_magic.agent.boot import arm_from_environment

        arm_from_environment()
    except Exception:
        pass  # another Python without torchmem_magic, or a broken install: the program runs unwatched


def _chain() -> None:
    """Run the next `sitecustomize` on sys.path (a distribution's, a virtualenv's, coverage's)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    others = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors are reported by `site`, as they would be without us


if __name__ == "sitecustomize":  # imported by `site`, not as torchmem_magic.agent.bootstrap.sitecustomize
    _arm()
    _chain()
