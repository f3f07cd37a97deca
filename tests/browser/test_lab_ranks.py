"""Ranks in a real JupyterLab: a cell forks two DDP ranks; their curves and the worst rank show while it runs."""

from __future__ import annotations

from typing import Any

import pytest
from lab_server import ARTIFACTS, PROMPTS_JS, Lab, free_port, wait_for
from nbformat.v4 import new_code_cell
from test_lab_live_figure import open_and_run_all, write_notebook

pytestmark = pytest.mark.browser

SETUP = '''\
%load_ext torchmem_magic
import os, time, torch, torch.distributed as dist, torch.multiprocessing as mp
torch.set_num_threads(1)

def train(rank, world, port, leak_rank, steps=400):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    outputs = []  # on the leaking rank: every output and its graph
    for step in range(steps):
        out = model(torch.randn(64, 256))
        opt.zero_grad(); out.pow(2).mean().backward(); opt.step()
        if rank == leak_rank:
            outputs.append(out)
        time.sleep(0.01)
    dist.barrier()
    dist.destroy_process_group()'''
def run_cell() -> str:
    return f"%%memwatch --interval 50\nmp.start_processes(train, args=(2, {free_port()}, 1), nprocs=2, start_method='fork')"

RANKS_FIGURE_JS = """() => {
  const figures = Array.from(document.querySelectorAll('.jp-Notebook .bqplot.figure'));
  const ranks = figures.find(f => (f.textContent || '').includes('ranks: '));
  return ranks ? ranks.textContent : '';
}"""
STATUS_JS = """() => {
  const s = document.querySelector('.jp-Notebook .widget-html');
  return s ? s.innerText.replace(/\\u00a0/g, ' ') : '';
}"""


def test_two_ranks_have_their_curves_and_the_worst_rank_is_named_while_the_cell_runs(lab: Lab, page: Any) -> None:
    write_notebook(lab, "ranks.ipynb", [new_code_cell(SETUP), new_code_cell(run_cell())])
    open_and_run_all(lab, page, "ranks.ipynb")

    try:
        # until the worst rank's holder is named, or the cell ended first (the asserts below say which)
        wait_for(page, f"() => ({PROMPTS_JS})()[1] !== '[*]:' && ({PROMPTS_JS})()[1].startsWith('[')"
                       f" || ({STATUS_JS})().includes('KiB/step in heap (outputs)')", 120)
        wait_for(page, RANKS_FIGURE_JS, 20)
    finally:
        page.screenshot(path=str(ARTIFACTS / "ranks_running.png"), full_page=True)
    running = page.evaluate(PROMPTS_JS)
    legend = page.evaluate(RANKS_FIGURE_JS)
    status = page.evaluate(STATUS_JS)
    assert running[1] == "[*]:", f"the cell ended before it could be seen running: {running}"
    assert "rank 0" in legend and "rank 1" in legend and "ranks: heap in use" in legend, legend
    assert "2 ranks at step" in status and "KiB/step in heap (outputs)" in status, status
    page.locator(".jp-CodeCell").nth(1).screenshot(path=str(ARTIFACTS / "ranks_running_cell.png"))

    wait_for(page, f"() => ({PROMPTS_JS})()[1] !== '[*]:' && ({PROMPTS_JS})()[1].startsWith('[')", 180)
    wait_for(page, "() => ((document.querySelector('.torchmem-report') || {}).innerText || '').includes('rank 1: leak')", 20)
    report = page.inner_text(".torchmem-report")
    assert "rank 1: leak" in report, report[:2000]
    status = page.evaluate(STATUS_JS)
    assert status.startswith("ok · ") and "worst rank 1: leak +" in status, status
    page.screenshot(path=str(ARTIFACTS / "ranks_done.png"), full_page=True)
    cell = page.locator(".jp-CodeCell").nth(1)
    cell.locator(".bqplot.figure").nth(1).scroll_into_view_if_needed()
    cell.screenshot(path=str(ARTIFACTS / "ranks_done_cell.png"))

    # on the steps axis: each rank against its own steps, the tree's RAM against the worst rank's
    cell.locator("button:has-text('steps')").click()
    wait_for(page, "() => document.querySelector('.jp-Notebook').innerText.includes(\"optimizer step (each rank's)\")", 20)
    assert "optimizer step (worst rank)" in cell.inner_text()
    cell.screenshot(path=str(ARTIFACTS / "ranks_done_steps_cell.png"))
