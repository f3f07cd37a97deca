"""A saved notebook shows the run's curves with no kernel: execute a notebook with nbclient, convert
it with `jupyter nbconvert --to html`, and open the page offline in Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lab_server import CHROMIUM, CHROMIUM_ARGS, require_browser

pytestmark = pytest.mark.browser

SETUP = """\
import torch, torchmem_magic
torch.set_num_threads(1)
%load_ext torchmem_magic
torchmem_magic.__file__"""

TRAIN = """\
%%memwatch --interval 20
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(640, 256)), batch_size=16)  # 40 batches an epoch
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
val_outputs = []
for epoch in range(3):
    for (x,) in loader:
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        val_outputs.append(model(x))  # kept with its graph: the leak"""

FIGURE = re.compile(r"<svg class=[\"']torchmem-figure[\"']")  # nbconvert rewrites the quotes


def _executed_notebook(path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(TRAIN)]
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, str(path))


def test_the_static_figure_survives_saving_and_nbconvert(tmp_path: Path) -> None:
    import json

    require_browser()
    notebook = tmp_path / "saved.ipynb"
    _executed_notebook(notebook)
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    import torchmem_magic

    assert repr(torchmem_magic.__file__) in cells[0]["outputs"][0]["data"]["text/plain"]  # this checkout ran
    saved = [o["data"]["text/html"] for o in cells[1]["outputs"] if "text/html" in o.get("data", {})]
    assert any(FIGURE.search("".join(h)) for h in saved), "the static figure is not in the saved outputs"
    converted = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(notebook)],
        capture_output=True, text=True, timeout=300,
    )
    assert converted.returncode == 0, converted.stderr
    page = tmp_path / "saved.html"
    assert FIGURE.search(page.read_text(encoding="utf-8"))

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1100, "height": 900})
        context.route(lambda url: not url.startswith("file://"), lambda route: route.abort())  # offline
        view = context.new_page()
        view.goto(page.as_uri())
        figure = view.locator("svg.torchmem-figure")
        figure.wait_for(state="visible", timeout=30_000)
        box = figure.bounding_box()
        assert box is not None and box["width"] > 500 and box["height"] > 150
        assert figure.locator("polyline").count() >= 2  # RAM and heap at least
        epochs = figure.locator("line.epoch")
        assert len({epochs.nth(i).get_attribute("x1") for i in range(epochs.count())}) == 3
        assert "verdict: leak" in (figure.locator("text.verdict").text_content() or "")
        figure.scroll_into_view_if_needed()
        shot = tmp_path / "static_figure_nbconvert.png"
        view.screenshot(path=str(shot), full_page=True)
        browser.close()
    keep = os.environ.get("TORCHMEM_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
        shutil.copy(page, Path(keep) / page.name)
