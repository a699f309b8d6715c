"""A real `execbox serve` in its own process on loopback, over the real sandbox, with its
records in the suite's throwaway database; keys made beside it; Debian's Chromium driven by
Playwright. Screenshots go to $EXECBOX_CONSOLE_SCREENSHOTS, else a directory under pytest's
temporary root (kept with the run's other artifacts)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import execbox
from execbox.records import RunStore
from execbox.server.auth import ADMIN, TENANT, KeyStore

CHROMIUM = "/usr/bin/chromium"


@dataclass
class Console:
    url: str
    keys: KeyStore

    def key(self, prefix: str = "tenant", role: str = TENANT) -> tuple[str, str]:
        """A fresh key: (its name, the key)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        return name, self.keys.create(name, rpm=100_000, max_concurrent=8, role=role)

    def admin(self) -> tuple[str, str]:
        return self.key("admin", ADMIN)

    def api(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def run(self, key: str, code: str, **body: Any) -> dict[str, Any]:
        """A run through the API, as a tenant's program would send it."""
        with self.api(key) as client:
            response = client.post("/v1/runs", json={"code": code, **body})
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def console(executor: execbox.Executor) -> Iterator[Console]:
    """`execbox serve` on a port of its own, for one module (its zygotes and slots are gone
    before the rest of the suite runs); `executor` only for its check that this host can run
    the real sandbox (the server starts its own)."""
    where = Path(tempfile.mkdtemp(prefix="execbox-console-"))
    port = _free_port()
    log = where / "serve.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "execbox.cli",
                "serve",
                "--port",
                str(port),
                "--no-socket",
                "--max-concurrency",
                "2",
                "--pool-size",
                "1",
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not get ready"
            time.sleep(0.2)
        store = RunStore()
        try:
            yield Console(url, KeyStore(store.engine))
        finally:
            store.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
        shutil.rmtree(where)


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("EXECBOX_CONSOLE_SCREENSHOTS")
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("console-screenshots")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, under Playwright (never Playwright's own download). Per
    module: while Playwright's sync API is up, the main thread has a running event loop, and a
    later test's `asyncio.run` would fail."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (make test installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_page(chromium: Any) -> Iterator[Any]:
    """A fresh browser context (no cookies) and page; any dialog it opens is recorded in
    `page.dialogs` and dismissed, so a test can assert none fired."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.dialogs = []

    def on_dialog(dialog: Any) -> None:
        page.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        context.close()


def log_in(page: Any, console: Console, key: str) -> None:
    page.goto(f"{console.url}/console/runs")
    assert "/console/login" in page.url  # no key yet: the login form
    page.fill("input[name=key]", key)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/runs")
