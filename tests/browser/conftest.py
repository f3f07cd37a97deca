from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lab_server import CHROMIUM, CHROMIUM_ARGS, Lab, require_browser, running_lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_browser()
    with running_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture()
def page(lab: Lab) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.route(lambda u: not u.startswith(lab.url), lambda route: route.abort())  # offline: no CDN
        yield context.new_page()
        browser.close()
