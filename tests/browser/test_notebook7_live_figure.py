"""Smoke test in the classic Notebook 7 front end (Jupyter Server + the notebook app, same widgets as Lab):
the live curves grow while the cell is busy, then the report renders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from lab_server import (
    ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, KERNEL_IDLE_JS, POINTS_JS, PROMPTS_JS, Lab, require_browser, running_lab, wait_for,
)
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.browser

PACKAGE = Path(__file__).resolve().parents[2] / "torchmem_magic"

SETUP = "%load_ext torchmem_magic\nimport torch, time, torchmem_magic\ntorch.set_num_threads(1)\nprint(torchmem_magic.__file__)"
TRAIN = """\
%%memwatch --interval 50
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(64, 32)), batch_size=8)
model = torch.nn.Linear(32, 32); opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for epoch in range(5):
    for (x,) in loader:
        opt.zero_grad(); model(x).sum().backward(); opt.step()
        kept.append(torch.ones(1 << 19))   # 2 MiB a step: the leak to watch
        time.sleep(0.15)
len(kept)"""



@pytest.fixture(scope="module")
def notebook7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_browser()
    try:
        import notebook
    except ImportError:
        pytest.fail("the classic Notebook 7 (`notebook`, in the test dependency group) is not installed")
    assert int(notebook.__version__.split(".")[0]) >= 7, notebook.__version__
    with running_lab(tmp_path_factory.mktemp("notebook7"), app="notebook") as server:
        yield server


@pytest.fixture()
def page(notebook7: Lab) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.route(lambda u: not u.startswith(notebook7.url), lambda route: route.abort())  # offline: no CDN
        yield context.new_page()
        browser.close()


def test_notebook7_curves_grow_while_busy_then_the_report_renders(notebook7: Lab, page: Any) -> None:
    nb = new_notebook(cells=[new_code_cell(SETUP), new_code_cell(TRAIN)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, notebook7.root / "live.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)

    page.goto(f"{notebook7.url}/notebooks/live.ipynb?token={notebook7.token}")  # the classic UI's URL, not /lab
    wait_for(page, KERNEL_IDLE_JS)
    assert page.evaluate("() => window.jupyterapp.name") == "Jupyter Notebook"
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    wait_for(page, f"() => {{ const p = ({PROMPTS_JS})(); return p[1] === '[*]:' && p[0] !== '[*]:' && ({POINTS_JS})() > 2; }}")
    first = page.evaluate(POINTS_JS)
    # keyed to what the page shows, not to a wait: the rate needs steps, and torch's own setup before the
    # first step takes seconds on a busy machine
    wait_for(page, f"""() => {{
      const status = document.querySelector('.jp-Notebook .widget-html');
      const prompt = ({PROMPTS_JS})()[1];
      return prompt !== '[*]:' || (({POINTS_JS})() > {first} && !!status && status.innerText.includes('steps/s'));
    }}""", 60)
    second = page.evaluate(POINTS_JS)
    prompts = page.evaluate(PROMPTS_JS)
    page.screenshot(path=str(ARTIFACTS / "notebook7_running.png"), full_page=True)
    assert prompts[1] == "[*]:", f"cell finished too early to observe: {prompts}"
    assert second > first, f"curve did not grow while busy: {first} -> {second}"
    status = page.inner_text(".jp-Notebook .widget-html").replace("\xa0", " ")
    assert "steps/s" in status and "heap" in status
    # this checkout's package is the one the kernel runs
    assert str(PACKAGE / "__init__.py") in page.inner_text(".jp-Notebook .jp-OutputArea-output")

    # Notebook 7 shares JupyterLab 4.6's widget manager, which sends a click to a kernel subshell
    page.click(".jp-Notebook button:has-text('gc + empty_cache')")
    wait_for(page, "() => document.querySelector('.jp-Notebook').innerText.includes('gc + empty_cache: RSS')", 20)
    assert page.evaluate(PROMPTS_JS)[1] == "[*]:", "the click should act while the cell still runs"

    wait_for(page, f"() => ({PROMPTS_JS})()[1].startsWith('[') && ({PROMPTS_JS})()[1] !== '[*]:'")
    page.wait_for_selector(".torchmem-report")
    report = page.inner_text(".torchmem-report")
    assert "memwatch: ok · 40 steps · 5 epochs" in report and "heap in use" in report
    suspects = page.inner_text(".torchmem-suspects")
    assert "kept" in suspects and "tensor-cache" in suspects
    captions = " | ".join(page.locator(".jp-Notebook .bqplot.figure").all_inner_texts())  # one strip per resource
    assert "RAM (process tree)" in captions and "heap in use" in captions
    assert "40" in page.inner_text(".jp-Notebook .jp-OutputArea-executeResult")
    page.screenshot(path=str(ARTIFACTS / "notebook7_done.png"), full_page=True)
