"""`mount_ui` serves the shipped pages, and only them; the pages need nothing online."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from statekeeper.server.ui import STATIC_FILES, mount_ui

STATIC = Path(__file__).parents[2] / "src" / "statekeeper" / "server" / "ui" / "static"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    mount_ui(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ui.test") as c:
        yield c


async def test_ui_redirects_to_the_page_and_serves_it_with_a_strict_policy(
    client: httpx.AsyncClient,
) -> None:
    moved = await client.get("/ui")
    assert moved.status_code == 307
    assert moved.headers["location"] == "/ui/"
    page = await client.get("/ui/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="app.js">' in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"


async def test_every_shipped_file_is_served_with_its_type(client: httpx.AsyncClient) -> None:
    assert {"index.html", "app.js", "app.css", "api.js"} <= STATIC_FILES
    for name in sorted(STATIC_FILES):
        answer = await client.get(f"/ui/{name}")
        assert answer.status_code == 200, name
        assert answer.content == (STATIC / name).read_bytes()
    script = await client.get("/ui/app.js")
    assert script.headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize(
    "path",
    [
        "/ui/nothere.js",
        "/ui/../__init__.py",
        "/ui/%2e%2e/__init__.py",
        "/ui/static/app.js",
        "/ui/..%2f..%2fpyproject.toml",
        "/ui/__init__.py",
    ],
)
async def test_nothing_outside_the_shipped_files_is_served(
    client: httpx.AsyncClient, path: str
) -> None:
    answer = await client.get(path)
    assert answer.status_code in (404, 307)
    assert "mount_ui" not in answer.text
    if answer.status_code == 307:  # a client normalised the path back to /ui
        assert answer.headers["location"] == "/ui/"


def test_the_pages_load_nothing_from_other_origins() -> None:
    texts = {p.name: p.read_text(encoding="utf-8") for p in STATIC.iterdir() if p.is_file()}
    # The only absolute URL allowed is the SVG namespace (a name, never fetched).
    found = {
        name: urls
        for name, text in texts.items()
        if (
            urls := [
                u
                for u in re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"'`)]*", text)
                if "www.w3.org/2000/svg" not in u
            ]
        )
    }
    assert found == {}
    assert not any("@import" in t or "fonts.googleapis" in t for t in texts.values())


def test_scripts_never_write_html_from_strings() -> None:
    # Stored data (messages, tool arguments) reaches the page as text nodes only.
    for path in STATIC.glob("*.js"):
        text = path.read_text(encoding="utf-8")
        unsafe = r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write"
        assert not re.search(unsafe, text), path


def test_without_chromium_the_browser_tests_skip_locally_and_fail_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from .conftest import chromium_path

    monkeypatch.setattr("os.access", lambda path, mode: False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("STATEKEEPER_REQUIRE_SERVICES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="make browser"):
        chromium_path()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required because CI=true"):
        chromium_path()
