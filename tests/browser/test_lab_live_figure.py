"""The live figure in a real JupyterLab: the curves grow while the cell is still busy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest
from lab_server import ARTIFACTS, KERNEL_IDLE_JS, POINTS_JS, PROMPTS_JS, Lab, screenshot_path, wait_for
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.browser

SETUP = "%load_ext torchmem_magic\nimport torch, time\ntorch.set_num_threads(1)"
TRAIN = """\
%%memwatch --interval 50
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(64, 32)), batch_size=8)
model = torch.nn.Linear(32, 32); opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for epoch in range(6):
    for (x,) in loader:
        opt.zero_grad(); model(x).sum().backward(); opt.step()
        kept.append(torch.ones(1 << 19))   # 2 MiB a step: the leak to watch
        time.sleep(0.15)
len(kept)"""

# each strip's drawn curve: the vertical extent of its path's points and the plot area's height, in px
STRIP_FILL_JS = """(caption) => {
  const figure = Array.from(document.querySelectorAll('.jp-Notebook .bqplot.figure'))
    .find(f => ((f.querySelector('text.mainheading') || {}).textContent || '').startsWith(caption));
  const path = figure && figure.querySelector('svg path.line');
  const plot = figure && figure.querySelector('svg rect.plotarea_background');
  if (!path || !plot) return null;
  const ys = (path.getAttribute('d') || '').split(/[ML]/).filter(p => p.includes(','))
    .map(p => parseFloat(p.split(',')[1])).filter(Number.isFinite);
  return {points: ys.length, extent_px: Math.max(...ys) - Math.min(...ys), height_px: parseFloat(plot.getAttribute('height'))};
}"""
FIGURES_TEXT_JS = "() => Array.from(document.querySelectorAll('.jp-Notebook .bqplot.figure')).map(f => f.textContent).join(' | ')"


def drawn_fill(page: Any, caption: str) -> dict[str, float]:
    """The drawn curve of the strip captioned `caption`: waited for, as a strip that appears mid-run
    (another resource's first reading) re-lays out the others for a moment."""
    try:
        fill: dict[str, float] = wait_for(page, f"() => {{ const f = ({STRIP_FILL_JS})({caption!r}); return f && f.points > 2 ? f : null; }}", 20)
    except TimeoutError:
        raise AssertionError(f"no curve drawn in the strip {caption!r}: {page.evaluate(FIGURES_TEXT_JS)}") from None
    return fill


def write_notebook(lab: Lab, name: str, cells: list[Any]) -> None:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / name)


def open_and_run_all(lab: Lab, page: Any, name: str) -> None:
    """Open notebook `name` and run all its cells once its own kernel is idle (the page may still
    show the notebook an earlier test opened: run-all must reach this one)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}")
    this_notebook = f"!!w && !!w.context && w.context.path.endsWith('{name}')"
    wait_for(page, KERNEL_IDLE_JS.replace("return !!k", f"return {this_notebook} && !!k"))
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


def test_curves_grow_while_the_cell_is_busy_then_the_report_renders(lab: Lab, page: Any) -> None:
    write_notebook(lab, "live.ipynb", [new_code_cell(SETUP), new_code_cell(TRAIN)])
    open_and_run_all(lab, page, "live.ipynb")

    # while cell 2 is busy ([*]) and cell 1 is done, the line must gain points between two looks
    wait_for(page, f"() => {{ const p = ({PROMPTS_JS})(); return p[1] === '[*]:' && p[0] !== '[*]:' && ({POINTS_JS})() > 2; }}")
    first = page.evaluate(POINTS_JS)
    # keyed to what the page shows, not to a wait: torch's own setup before the first step takes seconds
    # on a busy machine. While the cell is still busy, the holder is named and the curve has grown.
    wait_for(page, f"""() => {{
      const status = document.querySelector('.jp-Notebook .widget-html');
      return ({PROMPTS_JS})()[1] === '[*]:' && ({POINTS_JS})() > {first} && !!status
        && status.innerText.replace(/\\u00a0/g, ' ').includes('growing: kept +2.0 MiB/step, tensors');
    }}""", 60)
    second = page.evaluate(POINTS_JS)
    prompts = page.evaluate(PROMPTS_JS)
    page.screenshot(path=str(ARTIFACTS / "live_running.png"), full_page=True)
    assert prompts[1] == "[*]:", f"cell finished too early to observe: {prompts}"
    assert second > first, f"curve did not grow while busy: {first} -> {second}"
    status = page.inner_text(".jp-Notebook .widget-html")
    assert "steps/s" in status and "heap" in status
    assert "growing: kept +2.0 MiB/step, tensors" in status.replace("\xa0", " ")  # the holder, named while it runs
    # the docs' picture of the live figure: this cell, a few seconds in, its curves climbing and `kept` named
    training_cell = page.locator(".jp-Notebook .jp-CodeCell").nth(1)
    training_cell.scroll_into_view_if_needed()
    training_cell.screenshot(path=str(screenshot_path("live_cell.png", "live_figure.png")))
    # a leak is a slope that fills its strip, each curve on its own y axis: drawn from zero, 2 MiB a step on a
    # heap of ~100 MiB under RAM of ~300 MiB was a line climbing a fifth of the plot
    for caption in ("RAM (process tree)", "heap in use"):
        fill = drawn_fill(page, caption)
        assert fill["extent_px"] > 0.5 * fill["height_px"], (caption, fill)

    # a click while the cell is busy acts at the next optimizer step (JupyterLab routes it to a subshell)
    page.click(".jp-Notebook button:has-text('gc + empty_cache')")
    wait_for(page, "() => document.querySelector('.jp-Notebook').innerText.includes('gc + empty_cache: RSS')", 20)
    assert page.evaluate(PROMPTS_JS)[1] == "[*]:", "the click should act while the cell still runs"
    page.screenshot(path=str(ARTIFACTS / "clicked_mid_run.png"), full_page=True)

    wait_for(page, f"() => ({PROMPTS_JS})()[1].startsWith('[') && ({PROMPTS_JS})()[1] !== '[*]:'")
    page.wait_for_selector(".torchmem-report")
    report = page.inner_text(".torchmem-report")
    assert "memwatch: ok · 48 steps · 6 epochs" in report and "heap in use" in report
    suspects = page.inner_text(".torchmem-suspects")
    assert "What keeps memory alive" in suspects and "kept" in suspects and "tensor-cache" in suspects
    assert "collections.deque(maxlen=100)" in suspects
    captions = page.evaluate(FIGURES_TEXT_JS)
    assert "RAM (process tree)" in captions and "heap in use" in captions
    for caption in ("RAM (process tree)", "heap in use"):  # the whole run: 96 MiB kept, still filling the strip
        fill = drawn_fill(page, caption)
        assert fill["extent_px"] > 0.5 * fill["height_px"], (caption, fill)
    assert "48" in page.inner_text(".jp-Notebook .jp-OutputArea-executeResult")
    page.screenshot(path=str(ARTIFACTS / "live_done.png"), full_page=True)
    page.locator(".torchmem-report").scroll_into_view_if_needed()
    page.locator(".torchmem-report").screenshot(path=str(screenshot_path("report.png", "report.png")))


QUICKSTART = Path(__file__).resolve().parents[2] / "notebooks" / "01_memwatch_quickstart.ipynb"
# JupyterLab renders only the cells near the viewport: keep the running one in view while waiting
BUSY_WITH_HOLDER_NAMED_JS = """() => {
  const busy = Array.from(document.querySelectorAll('.jp-CodeCell'))
    .filter(c => c.querySelector('.jp-InputPrompt').textContent.trim() === '[*]:');
  busy.forEach(c => c.scrollIntoView({block: 'end'}));
  return busy.some(c => c.innerText.replace(/\\u00a0/g, ' ').includes('growing: val_outputs'));
}"""


def test_the_quickstart_names_the_leaking_holder_while_its_cell_runs(lab: Lab, page: Any) -> None:
    (lab.root / QUICKSTART.name).write_bytes(QUICKSTART.read_bytes())
    open_and_run_all(lab, page, QUICKSTART.name)
    try:
        wait_for(page, BUSY_WITH_HOLDER_NAMED_JS, timeout_s=240)
    except TimeoutError:
        page.screenshot(path=str(ARTIFACTS / "quickstart_timeout.png"), full_page=True)
        raise
    cell = page.locator(".jp-CodeCell", has_text="growing: val_outputs").first
    cell.scroll_into_view_if_needed()
    cell.screenshot(path=str(ARTIFACTS / "quickstart_holder_named_live.png"))
    status = cell.locator(".widget-html").first.inner_text().replace("\xa0", " ")
    assert "growing: val_outputs +" in status and "autograd graphs" in status


GUARD_SETUP = """\
%load_ext torchmem_magic
import os, psutil, torch, time
torch.set_num_threads(1)
# a RAM limit whose 90% lies 240 MiB above what the kernel uses now
os.environ["TORCHMEM_MAGIC_RAM_LIMIT"] = str(int((psutil.Process().memory_info().rss + (240 << 20)) / 0.9))"""
GUARD_TRAIN = """\
%%memwatch --guard 90% --interval 50
model = torch.nn.Linear(32, 32); opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for step in range(1000):
    opt.zero_grad(); model(torch.randn(8, 32)).sum().backward(); opt.step()
    kept.append(torch.ones(1 << 19))   # 2 MiB a step: the guard stops it after some 100 steps
    time.sleep(0.1)"""
# earlier tests' notebooks stay open in hidden tabs: every query looks only at the notebook shown
ACTIVE = ".jp-NotebookPanel:not(.lm-mod-hidden)"
GUARD_PROMPTS_JS = PROMPTS_JS.replace("document.querySelectorAll('", f"document.querySelectorAll('{ACTIVE} ")
GUARD_RUNNING_JS = f"""() => {{
  const panel = document.querySelector('{ACTIVE}');
  if (!panel) return false;
  const figure = Array.from(panel.querySelectorAll('.bqplot.figure')).some(f => f.textContent.includes('guard: 90% of RAM limit'));
  const warned = Array.from(panel.querySelectorAll('.widget-html'))
    .some(e => /90% (in ~|within a second)/.test(e.innerText.replace(/\\u00a0/g, ' ')));
  return figure && warned && ({GUARD_PROMPTS_JS})()[1] === '[*]:';
}}"""


def test_the_guard_draws_its_threshold_warns_before_it_and_stops_the_loop(lab: Lab, page: Any) -> None:
    stopped = new_code_cell(GUARD_TRAIN, metadata={"tags": ["raises-exception"]})  # run-all goes on past its error
    write_notebook(lab, "guard.ipynb", [new_code_cell(GUARD_SETUP), stopped, new_code_cell("len(kept)")])
    open_and_run_all(lab, page, "guard.ipynb")

    # while it runs: the threshold line (drawn once RAM is half way to it) and the status line's warning
    panel = page.locator(ACTIVE)
    try:
        wait_for(page, GUARD_RUNNING_JS)
    except TimeoutError:
        page.screenshot(path=str(ARTIFACTS / "guard_timeout.png"), full_page=True)
        raise
    status = panel.locator(".widget-html").first.inner_text().replace("\xa0", " ")
    page.screenshot(path=str(ARTIFACTS / "guard_running.png"), full_page=True)
    assert page.evaluate(GUARD_PROMPTS_JS)[1] == "[*]:", "the cell should still be running"
    assert "guard: RAM" in status and "/s" in status, status

    # stopped by the guard: the error, the report, and the kernel and `kept` still there for the next cell
    wait_for(page, f"() => ({GUARD_PROMPTS_JS})()[2].startsWith('[') && ({GUARD_PROMPTS_JS})()[2] !== '[*]:'", timeout_s=120)
    text = panel.inner_text()
    assert "MemoryGuardError" in text and "memwatch guard: RAM at " in text
    assert "the memory guard stopped the run after" in panel.locator(".torchmem-report").inner_text()
    kept = int(panel.locator(".jp-OutputArea-executeResult").last.inner_text().split()[-1])  # after its "[3]:"
    assert 20 < kept < 1000
    page.screenshot(path=str(ARTIFACTS / "guard_stopped.png"), full_page=True)
