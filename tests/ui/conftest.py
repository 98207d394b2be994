"""Fixtures for the control UI's browser tests: a real server over a real SQLite store,
an API key made with the CLI, and Debian's chromium driven by Playwright.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium`` (or the
``chromium`` on PATH; ``make browser`` installs it). Without it the browser tests skip
with the reason, and fail under ``CI=true`` or ``STATEKEEPER_REQUIRE_SERVICES=1``.

``STATEKEEPER_UI_SCREENSHOTS=docs/ui`` makes the tests save a screenshot of each page
there (relative to the repository root), for the documentation.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from statekeeper.testing.services import services_required

ROOT = Path(__file__).parents[2]
TENANT = "alice"
APP = "statekeeper.demo_app:make_runner"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1366, "height": 768}  # the laptop screen the UI is made for


def chromium_path() -> str:
    """Debian's chromium, or stop the test: skip locally, fail when services are required."""
    found = next(
        (p for p in ("/usr/bin/chromium", shutil.which("chromium")) if p and os.access(p, os.X_OK)),
        None,
    )
    if found is not None:
        return found
    reason = "Debian's chromium is not installed (run `make browser`)"
    if services_required():
        pytest.fail(f"{reason}; required because CI=true or STATEKEEPER_REQUIRE_SERVICES=1", False)
    pytest.skip(f"{reason} (set STATEKEEPER_REQUIRE_SERVICES=1 to make this an error)")


def screenshot_dir() -> Path | None:
    """Where to save page screenshots (``STATEKEEPER_UI_SCREENSHOTS``), or None."""
    folder = os.environ.get("STATEKEEPER_UI_SCREENSHOTS", "").strip()
    if not folder:
        return None
    path = Path(folder) if Path(folder).is_absolute() else ROOT / folder
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class UIServer:
    """A running ``statekeeper serve`` and what a test needs to reach it."""

    base: str
    store_url: str
    key: str
    tenant: str = TENANT


def _cli(store_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "statekeeper.cli", "--store", store_url, *args]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_ready(proc: asyncio.subprocess.Process, base: str, key: str) -> None:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as client:
        for _ in range(300):
            if proc.returncode is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}")
            try:
                if (await client.get(f"{base}/api/v1/whoami")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)  # polling for readiness, not timing anything
    raise RuntimeError("the server did not answer within 15 s")


async def create_key(store_url: str, tenant: str, scope: str) -> str:
    """``statekeeper keys create``: the key it prints once."""
    proc = await asyncio.create_subprocess_exec(
        *_cli(store_url, "keys", "create", "--tenant", tenant, "--scope", scope),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    found = re.search(r"sk_[A-Za-z0-9_\-]+", out.decode())
    assert found, out.decode()
    return found.group(0)


@asynccontextmanager
async def serving(tmp_path: Path, app: str) -> AsyncIterator[UIServer]:
    """``statekeeper serve --app APP`` on a fresh SQLite file, with an operate key of
    tenant ``alice`` (``tests/`` on the path, for apps of the test suite)."""
    store_url = f"sqlite:///{tmp_path / 'state.db'}"
    key = await create_key(store_url, TENANT, "operate")
    port = _free_port()
    paths = [str(ROOT / "tests"), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    command = _cli(store_url, "serve", "--app", app, "--host", "127.0.0.1", "--port", str(port))
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *command,
            "--poll-interval",
            "0.05",
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            await _wait_ready(proc, base, key)
            yield UIServer(base=base, store_url=store_url, key=key)
        finally:
            if proc.returncode is None:
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    if proc.returncode not in (0, -15):
        print(log_path.read_text(errors="replace"))


@pytest.fixture
async def ui_server(tmp_path: Path) -> AsyncIterator[UIServer]:
    """`serving` the demo app."""
    async with serving(tmp_path, APP) as server:
        yield server


@pytest.fixture
def chromium() -> str:
    return chromium_path()


class WatchedBrowser:
    """Chromium whose pages report script errors, refused loads (a CSP violation, a
    missing file) and requests to any other origin into ``problems``; the fixture fails
    the test if any were seen. A 401 is expected (the pages ask before the key is
    given) and not a problem."""

    def __init__(self, browser: Any, origin: str) -> None:
        self.browser = browser
        self.origin = origin
        self.problems: list[str] = []

    async def new_page(self, **options: Any) -> Any:
        page = await self.browser.new_page(**options)
        page.on("pageerror", lambda error: self.problems.append(f"script error: {error}"))
        page.on("console", self._console)
        page.on("request", self._request)
        return page

    def _request(self, request: Any) -> None:
        # Offline by construction: nothing is fetched from anywhere but the server.
        if not request.url.startswith(self.origin + "/"):
            self.problems.append(f"request to another origin: {request.url}")

    def _console(self, message: Any) -> None:
        if message.type == "error" and "status of 401" not in message.text:
            self.problems.append(f"console error: {message.text}")


@pytest.fixture
async def browser(chromium: str, ui_server: UIServer) -> AsyncIterator[WatchedBrowser]:
    """Chromium on the UI server's pages. It closes before the server stops, so no page
    sees its live stream cut at the end of a test."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        watched = WatchedBrowser(launched, ui_server.base)
        try:
            yield watched
        finally:
            await launched.close()
        assert watched.problems == [], "the pages reported errors"


@pytest.fixture
def shots() -> Path | None:
    return screenshot_dir()
