"""`memwatch(log_to=SummaryWriter(...))` as users read it: the event files of a leaking loop opened in a real
TensorBoard server, in headless Chromium. Every curve is a card under `memwatch/`, at the run's steps; the
picture the docs show is this page (`make screenshots` rewrites it)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from lab_server import CHROMIUM, CHROMIUM_ARGS, require_browser, screenshot_path

pytest.importorskip("tensorboard")

#: a loop keeping 1 KiB a step until the sampler wrote the scalars a dozen times (once a second)
LEAKING_LOOP = """\
import sys, torch, torchmem_magic
from torch.utils.tensorboard import SummaryWriter
torch.set_num_threads(1)
writer = SummaryWriter(sys.argv[1])
model = torch.nn.Linear(64, 64); opt = torch.optim.SGD(model.parameters(), lr=0.01); kept = []
with torchmem_magic.memwatch(log_to=writer, quiet=True) as session:
    while session.listener.writes < 6 * 12:
        loss = model(torch.randn(32, 64)).square().mean()
        opt.zero_grad(); loss.backward(); opt.step()
        kept.append(torch.randn(256))
writer.close()
"""
CARDS = ("growth_bytes_per_step", "heap_bytes", "ram_bytes", "rss_bytes", "shm_used_bytes", "workers_bytes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serving(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60  # a guard against a hang, not a timing assumption
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"TensorBoard did not answer at {url}")


def test_the_memwatch_scalars_are_cards_in_tensorboard(tmp_path: Path) -> None:
    require_browser()
    from playwright.sync_api import sync_playwright

    subprocess.run([sys.executable, "-c", LEAKING_LOOP, str(tmp_path / "leaky_loop")], check=True, timeout=300)
    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).with_name("tensorboard")), "--logdir", str(tmp_path),
                               "--port", str(port), "--host", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        _serving(url, server)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            page.goto(url + "?darkMode=false#timeseries&tagFilter=memwatch")
            for card in CARDS:
                page.wait_for_selector(f"text=memwatch/{card}", timeout=60_000)
            # each card's table under its chart: the run (named by its folder) at its last step, once data came
            page.wait_for_function("() => (document.body.innerText.match(/leaky_loop/g) || []).length >= 5",
                                   timeout=60_000)
            page.screenshot(path=str(screenshot_path("tensorboard.png", "tensorboard_memwatch.png")))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
