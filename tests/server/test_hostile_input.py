"""Hostile input gets a typed error and changes nothing, in the library and through the
server (issue 22)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import httpx
import pytest

from statekeeper.core.messages import Message
from statekeeper.core.tokens import DEFAULT_COUNTER
from statekeeper.errors import InvalidInputError, InvalidPayloadError
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store

from .conftest import Live


def test_the_token_estimate_refuses_a_lone_surrogate_with_a_typed_error() -> None:
    with pytest.raises(InvalidPayloadError, match="lone surrogate"):
        DEFAULT_COUNTER.count_text("caf\u00e9 \ud800")


@pytest.mark.parametrize("url", ["memory://", "sqlite:///{tmp}/s.db"])
async def test_appending_a_lone_surrogate_raises_and_stores_nothing(
    url: str, tmp_path: Path
) -> None:
    async with open_store(url.format(tmp=tmp_path)) as store:
        session = await SessionManager(store, "t").create()
        await session.append(Message.user("before"))
        with pytest.raises(InvalidPayloadError, match="lone surrogate"):
            await session.append(Message.user("a\ud800b"))
        assert [m.content for m in await session.messages()] == ["before"]


async def test_the_server_answers_422_for_a_lone_surrogate(live: Live) -> None:
    async with live.client("operate") as client:
        await client.post("/api/v1/sessions", json={"session_id": "ses-s"})
        answer = await client.post(
            "/api/v1/sessions/ses-s/messages",
            content=b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
            headers={"content-type": "application/json"},
        )
        assert answer.status_code == 422, answer.text
        assert "lone surrogate" in answer.text
        entries = (await client.get("/api/v1/sessions/ses-s/entries")).json()
        assert entries["items"] == [], entries


async def test_only_a_get_of_an_event_stream_takes_the_key_in_its_url(live: Live) -> None:
    from statekeeper.server.app import API_PREFIX
    from statekeeper.server.auth import EVENT_STREAMS

    assert {f"{API_PREFIX}/stream"} == EVENT_STREAMS
    key = {"key": live.keys["admin"]}
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as client:
        # A session named "stream": its path ends in /stream, but it is no event stream.
        for method in ("GET", "DELETE"):
            answer = await client.request(method, "/api/v1/sessions/stream", params=key)
            assert answer.status_code == 401, (method, answer.text)
        async with live.client("admin") as admin:  # nothing was deleted meanwhile
            await admin.post("/api/v1/sessions", json={"session_id": "stream"})
        deleted = await client.delete("/api/v1/sessions/stream", params=key)
        assert deleted.status_code == 401, deleted.text


def _cursor(data: object) -> str:
    import base64
    import json

    raw = json.dumps(data).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    ("params", "headers"),
    [
        ({"run_id": "run-big", "after": str(10**20)}, {}),
        ({"run_id": "run-big"}, {"Last-Event-ID": str(10**20)}),
        ({"run_id": "run-big", "last_event_id": str(2**63)}, {}),
        ({}, {"Last-Event-ID": _cursor({"s": "2026-11-28T10:00:00+00:00", "p": {"r": 1e400}})}),
        ({}, {"Last-Event-ID": _cursor({"s": "2026-11-28T10:00:00+00:00", "p": {"r": -1}})}),
        ({}, {"Last-Event-ID": _cursor({"s": "2026-11-28T10:00:00", "p": {}})}),
        ({}, {"Last-Event-ID": _cursor({"s": "2026-11-28T10:00:00+00:00", "p": {"../x": 1}})}),
    ],
)
async def test_a_stream_position_out_of_range_is_a_422_before_the_stream_starts(
    live: Live, db: tuple[str, Store], params: dict[str, str], headers: dict[str, str]
) -> None:
    from statekeeper.runtime.events import EventBus

    await EventBus(db[1], "acme").publish("run-big", "progress", "tick", {"n": 1})
    async with live.client("read") as client:
        answer = await client.get("/api/v1/stream", params=params, headers=headers)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["type"] in {"InvalidInputError", "InvalidIdError"}


async def test_a_filter_nested_too_deep_is_bad_input_in_the_library_and_the_server(
    live: Live,
) -> None:
    from statekeeper.longterm import LongTermStore

    deep: object = 1
    for _ in range(3000):
        deep = {"a": deep}
    async with open_store("memory://") as store:
        with pytest.raises(InvalidInputError, match="levels deep"):
            await LongTermStore(store, tenant="t").search(("ns",), filter=deep)  # type: ignore[arg-type]
    text = '{"a":' * 3000 + "1" + "}" * 3000
    async with live.client("read") as client:
        answer = await client.get("/api/v1/memories", params={"filter": text})
        assert answer.status_code == 422, answer.text[:300]
        shallow = '{"a":' * 150 + "1" + "}" * 150  # parses, but deeper than any value
        answer = await client.get("/api/v1/memories", params={"filter": shallow})
        assert answer.status_code == 422, answer.text[:300]


@pytest.mark.parametrize("url", ["memory://", "sqlite:///{tmp}/s.db"])
async def test_token_counts_past_what_a_store_holds_raise_and_store_nothing(
    url: str, tmp_path: Path
) -> None:
    # Found by the OpenAPI fuzz: a message claiming 10**20 tokens overflowed SQLite's
    # INTEGER (OverflowError, a 500); two appends of 2**62 each overflow the total too.
    async with open_store(url.format(tmp=tmp_path)) as store:
        session = await SessionManager(store, "t").create()
        await session.append(Message.user("before", tokens=2**62))
        for tokens in (10**20, 2**62):
            with pytest.raises(InvalidPayloadError, match="total_tokens"):
                await session.append(Message.user("huge", tokens=tokens))
        again = await SessionManager(store, "t").get(session.id)
        assert [m.content for m in await again.messages()] == ["before"]
        assert again.record.total_tokens == 2**62


async def test_the_server_answers_422_for_a_token_count_past_2_63(live: Live) -> None:
    async with live.client("operate") as client:
        await client.post("/api/v1/sessions", json={"session_id": "ses-t"})
        huge = {"role": "user", "content": "x", "tokens": 10**20}
        answer = await client.post("/api/v1/sessions/ses-t/messages", json={"messages": [huge]})
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["type"] == "InvalidPayloadError"
        entries = await client.get("/api/v1/sessions/ses-t/entries")
        assert entries.json()["items"] == []


@pytest.mark.parametrize("url", ["memory://", "sqlite:///{tmp}/s.db"])
async def test_a_message_time_without_a_zone_raises_typed_and_stores_nothing(
    url: str, tmp_path: Path
) -> None:
    # Found by probing after the OpenAPI fuzz: EntryDraft refused it with pydantic's own
    # ValidationError, which the server answered with a 500.
    async with open_store(url.format(tmp=tmp_path)) as store:
        session = await SessionManager(store, "t").create()
        await session.append(Message.user("before"))
        naive = Message.user("no zone", created_at=datetime(2026, 1, 2, 3, 4, 5))
        with pytest.raises(InvalidPayloadError, match="timezone"):
            await session.append(Message.user("fine"), naive)
        assert [m.content for m in await session.messages()] == ["before"]


async def test_the_server_answers_422_for_a_message_time_without_a_zone(live: Live) -> None:
    async with live.client("operate") as client:
        await client.post("/api/v1/sessions", json={"session_id": "ses-z"})
        naive = {"role": "user", "content": "x", "created_at": "0001-01-01T00:00:00"}
        answer = await client.post("/api/v1/sessions/ses-z/messages", json={"messages": [naive]})
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["type"] == "InvalidPayloadError"
        entries = await client.get("/api/v1/sessions/ses-z/entries")
        assert entries.json()["items"] == []
