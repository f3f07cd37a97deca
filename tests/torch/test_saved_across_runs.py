"""A report saved by one process and loaded by another: equal to the original, `show` prints it,
and terminal IPython prints the text report with its sparklines (no widgets, no HTML)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from torchmem_magic.render.static import embedded_figure

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}

SAVE = """\
import sys, torch, torchmem_magic
from torchmem_magic import load_report
torch.set_num_threads(1)
model = torch.nn.Linear(32, 32); kept = []
with torchmem_magic.memwatch(20, quiet=True) as w:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(40):
        loss = model(torch.randn(4, 32)).sum(); opt.zero_grad(); loss.backward(); opt.step(); kept.append(model(torch.randn(4, 32)))
w.report.save(sys.argv[1]); w.report.save(sys.argv[2])
assert load_report(sys.argv[1]) == w.report
print(repr(w.report))
"""

LOAD = """\
import json, sys
from torchmem_magic import Report, load_report
from torchmem_magic.report.saved import report_from_dict
loaded = load_report(sys.argv[1])
assert isinstance(loaded, Report)
assert loaded == report_from_dict(json.load(open(sys.argv[1]))) and loaded.to_dict() == json.load(open(sys.argv[1]))
print(repr(loaded))
print(loaded)
"""


def _run(*args: str) -> str:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_report_saved_in_one_run_loads_equal_in_another(tmp_path: Path) -> None:
    saved, page = tmp_path / "run.json", tmp_path / "run.html"
    original_repr = _run("-c", SAVE, str(saved), str(page))
    loaded = _run("-c", LOAD, str(saved))
    assert loaded.splitlines()[0] == original_repr.strip() and original_repr.startswith("<Report: ")
    text = loaded.split("\n", 1)[1]
    assert text.startswith("memwatch: ok · 40 steps")
    shown = _run("-m", "torchmem_magic", "show", str(saved))
    assert shown == text
    assert "<polyline" in embedded_figure(page.read_text(encoding="utf-8"))


TERMINAL = """\
%load_ext torchmem_magic
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(64, 64); kept = []
"""
CELL = """\
%%memwatch --interval 20
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(60):
    loss = model(torch.randn(8, 64)).sum(); opt.zero_grad(); loss.backward(); opt.step(); kept.append(model(torch.randn(256, 64)))
len(kept)
"""


def test_terminal_ipython_prints_the_text_report_with_sparklines(tmp_path: Path) -> None:
    """A real terminal IPython reading cells from stdin (two blank lines end a cell magic)."""
    cells = TERMINAL + CELL + "\n\n" + "r = %memcheck -o kept\nprint(repr(r))\n"
    env = {**ENV, "IPYTHONDIR": str(tmp_path / "ipython")}
    ipython = [sys.executable, "-m", "IPython", "--no-banner", "--simple-prompt", "--colors=nocolor"]
    result = subprocess.run(ipython, input=cells, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    out = result.stdout
    assert "memwatch: ok · 60 steps" in out, out + result.stderr
    heap = next(line for line in out.splitlines() if line.strip().startswith("heap ") and "→" in line)
    assert any(bar in heap for bar in "▂▃▄▅▆▇█"), heap
    assert re.search(r"Out\[\d+\]: 60\n", out)  # the cell's own value, displayed as usual
    assert "<svg" not in out and "torchmem-figure" not in out and "VBox" not in out and "Traceback" not in out + result.stderr
    assert "<MemcheckResult: kept · 60 tensors · " in out
