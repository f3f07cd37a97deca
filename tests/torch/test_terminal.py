"""Terminal IPython (no kernel, no widgets): %%memwatch prints the text report. This is `make demo`."""

import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "examples" / "leak_demo.py"


def test_demo_prints_the_text_report_in_terminal_ipython() -> None:
    result = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"memwatch: ok · 200 steps · 0 epochs", out)
    heap = re.search(r"heap in use .*?\+([\d.]+) (KiB|MiB)/step", out)
    assert heap, out
    per_step_kib = float(heap.group(1)) * (1024 if heap.group(2) == "MiB" else 1)
    assert per_step_kib > 500  # each kept output holds ~1 MiB of saved activations
    assert "Out[2]: 200" in out  # the cell's last expression is displayed as usual
    assert "VBox" not in out and "Traceback" not in result.stderr
