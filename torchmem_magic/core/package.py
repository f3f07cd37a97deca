"""Where this package lies: its own frames and files are never the user's."""

from __future__ import annotations

import os

#: the package's folder, with a trailing separator (a prefix of each of its files' paths)
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
