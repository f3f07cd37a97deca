"""The unit tests build on the core tests' synthetic reports (`from test_report import ...`)."""

from __future__ import annotations

import sys
from pathlib import Path

CORE = str(Path(__file__).resolve().parents[1] / "core")
if CORE not in sys.path:
    sys.path.insert(0, CORE)
