"""A web package's page (`tinyt package --format web`) in headless Chromium, for the real
models' tests: served on a free loopback port (always stopped), driven by its URL parameters,
its answer read as the JSON it leaves in <pre id="result">. Skips, naming the reason, without
the system chromium or playwright (bash scripts/setup-web.sh; extra 'web')."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import urlencode

import pytest


def page_result(web_dir: Path, params: dict, *, timeout_s: float = 300) -> dict:
    """The page's JSON answer to `params` (a list value repeats the parameter). Fails on an
    uncaught page error or an answer that is an error."""
    from tinyt.export.web.serve import start

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no system chromium: bash scripts/setup-web.sh")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the 'web' extra")
    server, _ = start(web_dir, 0)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html?"
                          + urlencode(params, doseq=True))
                page.wait_for_function(
                    "document.getElementById('result').textContent.length > 0",
                    timeout=timeout_s * 1000)
                got = json.loads(page.inner_text("#result"))
            finally:
                browser.close()
    finally:
        server.shutdown()
    assert not errors and "error" not in got, (errors, got.get("error"))
    return got
