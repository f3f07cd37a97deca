"""For every test: flight records go to a directory of this test run's own, never the user's cache
(kernels killed on purpose would leave records there, and the next kernel's `%load_ext` would show
them in another test's output)."""

from __future__ import annotations

import os
import tempfile

os.environ["TORCHMEM_MAGIC_RECORD_DIR"] = tempfile.mkdtemp(prefix="torchmem-flight-records-")
