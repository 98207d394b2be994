"""A server over a store with an event feed (Redis, on one server or a cluster, and
PostgreSQL with ``notify_channel``) uses it: events another process writes reach the stream."""

from __future__ import annotations

import httpx

from statekeeper.server import ApiKeys, ServerConfig
from statekeeper.stores import open_store

from .conftest import SseReader, ThreadServer
from .test_streams import publish


async def test_the_feed_pushes_other_processes_events_to_the_stream(feed_store_url: str) -> None:
    store = await open_store(feed_store_url)
    try:
        _, key = await ApiKeys(store).create("acme", "read")
        await publish(store, "run-feed", 1, 1)
        server = ThreadServer(ServerConfig(feed_store_url, poll_interval=60)).start()
        try:
            assert server.server.config.app.state.context.hub.has_feed
            headers = {"Authorization": f"Bearer {key}"}
            async with (
                httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client,
                client.stream("GET", "/api/v1/stream", params={"run_id": "run-feed"}) as answer,
            ):
                reader = SseReader(answer)
                got = [await reader.next()]
                await publish(store, "run-feed", 2, 6)
                got += [await reader.next() for _ in range(5)]
        finally:
            server.stop()
    finally:
        await store.close()
    assert [m["data"]["seq"] for m in got] == [1, 2, 3, 4, 5, 6]


async def test_the_tenant_stream_reads_the_runs_the_feed_names(feed_store_url: str) -> None:
    store = await open_store(feed_store_url)
    try:
        _, key = await ApiKeys(store).create("acme", "read")
        server = ThreadServer(ServerConfig(feed_store_url, poll_interval=60)).start()
        try:
            headers = {"Authorization": f"Bearer {key}"}
            async with (
                httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client,
                client.stream("GET", "/api/v1/stream") as answer,
            ):
                reader = SseReader(answer)
                await publish(store, "run-a", 1, 2)
                await publish(store, "run-b", 1, 2)
                got = [(await reader.next())["data"] for _ in range(4)]
        finally:
            server.stop()
    finally:
        await store.close()
    assert sorted((e["run_id"], e["seq"]) for e in got) == [
        ("run-a", 1),
        ("run-a", 2),
        ("run-b", 1),
        ("run-b", 2),
    ]
    assert {e["session_id"] for e in got} == {None}  # logs without a run in the index
