"""JupyterLab + headless Chromium, each test run in fresh temporary config, runtime and workspace dirs."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
# the screenshots the README and the docs show; `make screenshots` (TORCHMEM_UPDATE_SCREENSHOTS=1) rewrites them
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
UPDATE_SCREENSHOTS = os.environ.get("TORCHMEM_UPDATE_SCREENSHOTS") == "1"


# what the page shows: the first live curve's points, the cells' prompts, whether the kernel is idle
POINTS_JS = """() => {
  const path = document.querySelector('.jp-Notebook .bqplot.figure svg path.line');
  return path ? (path.getAttribute('d') || '').split('L').length : 0;
}"""
PROMPTS_JS = "() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')).map(e => e.textContent.trim())"
KERNEL_IDLE_JS = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.connectionStatus === 'connected' && k.status === 'idle';
}"""


def wait_for(page: Any, js: str, timeout_s: float = 90.0) -> Any:
    """The first truthy value the page gives for `js`, polled every 0.2 s (TimeoutError after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = page.evaluate(js)
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(js)


def screenshot_path(name: str, docs_image: str | None = None) -> Path:
    """Where a screenshot goes: tests/browser/artifacts/NAME, or docs/images/DOCS_IMAGE for a picture the docs
    show when TORCHMEM_UPDATE_SCREENSHOTS=1."""
    if docs_image and UPDATE_SCREENSHOTS:
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        return DOCS_IMAGES / docs_image
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


def require_browser() -> None:
    missing = []
    if not os.path.exists(CHROMIUM):
        missing.append("chromium (apt-get install chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install playwright)")
    if missing:
        message = "browser test needs " + ", ".join(missing)
        if os.environ.get("CI") or UPDATE_SCREENSHOTS:
            pytest.fail(message)  # CI installs them: a skip there would hide a broken setup (or stale screenshots)
        pytest.skip(message)


@dataclass
class Lab:
    url: str
    token: str
    root: Path


@contextmanager
def running_lab(base: Path, app: str = "jupyterlab") -> Iterator[Lab]:
    """Start JupyterLab (or `app="notebook"`: the classic Notebook 7, the same server with another front end)
    with fresh config/runtime/workspace dirs under `base`; always stop it."""
    dirs = {name: base / name for name in ("config", "runtime", "ipython", "workspaces", "settings", "notebooks")}
    for d in dirs.values():
        d.mkdir()
    settings = dirs["settings"]
    (settings / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"})
    )
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        IPYTHONDIR=str(dirs["ipython"]),
        JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
    )
    port, token = free_port(), secrets.token_hex(16)
    log = (base / "lab.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable, "-m", app, "--no-browser", f"--port={port}", f"--ServerApp.token={token}",
            "--ServerApp.ip=127.0.0.1", f"--notebook-dir={dirs['notebooks']}", "--allow-root",
            *(
                ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                 "--LabApp.expose_app_in_browser=True"]
                if app == "jupyterlab" else ["--JupyterNotebookApp.expose_app_in_browser=True"]
            ),
        ],
        env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"{app} did not start:\n" + (base / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield Lab(url, token, dirs["notebooks"])
    finally:
        try:
            req = urllib.request.Request(f"{url}/api/shutdown?token={token}", method="POST")
            urllib.request.urlopen(req, timeout=5)
            server.wait(timeout=15)
        except Exception:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def free_port() -> int:
    """A TCP port nobody listens on now (fixed ports collide when test runs overlap on one machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
