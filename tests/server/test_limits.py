"""Request bodies are bounded: an oversized one is a 413 before it is read or authenticated,
and nothing is written."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from statekeeper.server import ServerConfig
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

from .conftest import ThreadServer, make_keys

LIMIT = 4096


@pytest.fixture
async def small(db: tuple[str, Store]) -> AsyncIterator[tuple[str, str]]:
    url, store = db
    keys, _, _ = await make_keys(store)
    server = ThreadServer(ServerConfig(url, max_body_bytes=LIMIT)).start()
    try:
        yield server.url, keys["operate"]
    finally:
        server.stop()


def _too_big() -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "x" * (LIMIT + 1)}]}


async def test_an_oversized_body_is_refused_before_the_key_is_checked(
    small: tuple[str, str], db: tuple[str, Store]
) -> None:
    url, _ = small
    async with httpx.AsyncClient(base_url=url) as client:
        answer = await client.post("/api/v1/sessions", json={"title": "x" * (LIMIT + 1)})
    assert answer.status_code == 413
    error = answer.json()["error"]
    assert error["type"] == "PayloadTooLargeError"
    assert "--max-body-bytes" in error["message"]
    assert (await SessionManager(db[1], tenant="acme").list()).items == []


async def test_a_chunked_body_is_counted_and_a_small_one_goes_through(
    small: tuple[str, str], db: tuple[str, Store]
) -> None:
    url, key = small
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        created = await client.post("/api/v1/sessions", json={"session_id": "s1"})
        assert created.status_code == 201

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: sent chunked
            body = httpx.Request("POST", "/", json=_too_big()).read()
            for start in range(0, len(body), 1000):
                yield body[start : start + 1000]

        answer = await client.post("/api/v1/sessions/s1/messages", content=chunks())
        assert answer.status_code == 413
        assert answer.json()["error"]["type"] == "PayloadTooLargeError"
        fits = {"messages": [{"role": "user", "content": "hello"}]}
        assert (await client.post("/api/v1/sessions/s1/messages", json=fits)).status_code == 201
    session = await SessionManager(db[1], tenant="acme").get("s1")
    assert [m.text for m in await session.messages()] == ["hello"]


async def test_a_body_that_is_not_json_without_a_good_key_is_a_401(
    small: tuple[str, str],
) -> None:
    url, key = small
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        anonymous = await client.post("/api/v1/sessions", content=b"{bad")
        wrong = await client.post(
            "/api/v1/sessions", content=b"{bad", headers={"Authorization": "Bearer sk_kx_y"}
        )
        keyed = await client.post(
            "/api/v1/sessions", content=b"{bad", headers={"Authorization": f"Bearer {key}"}
        )
    assert [anonymous.status_code, wrong.status_code, keyed.status_code] == [401, 401, 422]
    assert anonymous.json()["error"]["type"] == "AuthenticationError"
