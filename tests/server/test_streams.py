"""Live events over SSE against a running server: fan-out to 200 subscribers, resuming
with Last-Event-ID (also across a server restart), and the tenant stream's cursor."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx

from statekeeper.runtime.events import EventBus
from statekeeper.stores import Store

from .conftest import (
    Live,
    SseReader,
    free_port,
    make_keys,
    serve_subprocess,
    wait_ready,
)


async def publish(store: Store, run_id: str, first: int, last: int, tenant: str = "acme") -> None:
    """Events ``first..last`` (payload ``n``) on the run's log, as an agent process would."""
    bus = EventBus(store, tenant)
    for n in range(first, last + 1):
        await bus.publish(run_id, "progress", "tick", {"n": n})


async def read(
    client: httpx.AsyncClient,
    count: int,
    params: dict[str, Any],
    headers: dict[str, str],
    *,
    until: str | None = None,
) -> list[dict[str, Any]]:
    """The first ``count`` messages of a stream (or up to the first ``until`` event),
    then disconnect."""
    got: list[dict[str, Any]] = []
    async with client.stream("GET", "/api/v1/stream", params=params, headers=headers) as answer:
        assert answer.status_code == 200, await answer.aread()
        reader = SseReader(answer)
        while len(got) < count or (until is not None and got[-1]["event"] != until):
            got.append(await reader.next())
    return got


async def test_200_subscribers_of_one_run_get_every_event_in_order(
    live: Live, db: tuple[str, Store]
) -> None:
    store, total, clients = db[1], 40, 200
    await publish(store, "run-fan", 1, 1)  # the run exists once its log does
    limits = httpx.Limits(max_connections=clients + 10)
    async with live.client("read", timeout=120, limits=limits) as client:
        readers = [
            asyncio.create_task(read(client, total, {"run_id": "run-fan"}, {}))
            for _ in range(clients)
        ]
        await publish(store, "run-fan", 2, total)
        results = await asyncio.gather(*readers)
    for got in results:
        assert [m["data"]["seq"] for m in got] == list(range(1, total + 1))
        assert [m["data"]["data"]["n"] for m in got] == list(range(1, total + 1))
        assert [m["id"] for m in got] == [str(n) for n in range(1, total + 1)]
        assert {m["event"] for m in got} == {"progress/tick"}


async def test_reconnecting_with_last_event_id_misses_and_repeats_nothing(
    live: Live, db: tuple[str, Store]
) -> None:
    store = db[1]
    await publish(store, "run-re", 1, 5)
    async with live.client("read", timeout=30) as client:
        first = await read(client, 3, {"run_id": "run-re"}, {})
        await publish(store, "run-re", 6, 8)
        header = {"Last-Event-ID": first[-1]["id"]}
        second = await read(client, 5, {"run_id": "run-re"}, header)
        by_query = await read(client, 2, {"run_id": "run-re", "last_event_id": "6"}, {})
        bad = await client.get("/api/v1/stream", params={"run_id": "run-re", "last_event_id": "x"})
        ahead = await client.get("/api/v1/stream", params={"run_id": "run-re", "after": 99})
    assert [m["data"]["seq"] for m in first + second] == list(range(1, 9))
    assert [m["data"]["seq"] for m in by_query] == [7, 8]
    assert bad.status_code == 422
    assert ahead.status_code == 422
    assert "does not exist" in ahead.json()["error"]["message"]


async def test_a_stream_survives_a_server_restart(db: tuple[str, Store], tmp_path: Path) -> None:
    url, store = db
    log = tmp_path / "server.log"
    keys, _, _ = await make_keys(store)
    headers = {"Authorization": f"Bearer {keys['read']}"}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    await publish(store, "run-restart", 1, 4)
    server = serve_subprocess(url, port, log)
    try:
        await asyncio.to_thread(wait_ready, base, server, log)
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            before = await read(client, 4, {"run_id": "run-restart"}, headers)
            server.send_signal(signal.SIGKILL)  # a crash, mid-stream
            await asyncio.to_thread(server.wait)
            await publish(store, "run-restart", 5, 9)  # while the server is down
            server = serve_subprocess(url, port, log)
            await asyncio.to_thread(wait_ready, base, server, log)
            resume = {**headers, "Last-Event-ID": before[-1]["id"]}
            after = await read(client, 5, {"run_id": "run-restart"}, resume)
    finally:
        server.kill()
        server.wait()
    assert [m["data"]["seq"] for m in before + after] == list(range(1, 10))


async def test_the_tenant_stream_follows_every_run_and_resumes_from_its_cursor(
    live: Live, db: tuple[str, Store]
) -> None:
    store = db[1]
    await publish(store, "run-old", 1, 2)  # before the stream: not sent
    from statekeeper.demo_app import make_runner

    runner = make_runner(store, "acme")
    started = await runner.start("support", "Where is order 1042?")
    async with live.client("read", timeout=30) as client:
        task = asyncio.create_task(read(client, 2, {}, {}))
        await asyncio.sleep(0)
        first = await _after_listening(task, store, runner, started.run_id)
        await runner.cancel(started.run_id, "stop")  # logs an abort after the cursor
        cursor = {"Last-Event-ID": first[-1]["id"]}
        resumed = await read(client, 1, {}, cursor, until="lifecycle/abort")
    other = [m for m in first + resumed if m["data"]["run_id"] == "run-old"]
    assert other == []
    mine = [m["data"] for m in first + resumed]
    assert {e["run_id"] for e in mine} == {started.run_id}
    seqs = [e["seq"] for e in mine]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # no gap, no repeat
    assert mine[-1]["type"] == "lifecycle/abort"
    session_id = (await runner.load(started.run_id)).session_id
    assert {e["session_id"] for e in mine} == {session_id}


async def _after_listening(
    task: asyncio.Task[list[dict[str, Any]]], store: Store, runner: Any, run_id: str
) -> list[dict[str, Any]]:
    """Publish two events on the run once the tenant stream is open, and read them."""
    bus = EventBus(store, "acme")
    while not task.done():
        await bus.publish(run_id, "progress", "tick", {})
        done, _ = await asyncio.wait({task}, timeout=0.2)
        if done:
            break
    return task.result()


async def test_the_stream_of_an_unknown_run_is_not_found(live: Live) -> None:
    async with live.client("read") as client:
        answer = await client.get("/api/v1/stream", params={"run_id": "run-none"})
    assert answer.status_code == 404
    assert answer.json()["error"]["type"] == "NotFoundError"


async def test_stream_key_in_the_query_for_event_source(live: Live, db: tuple[str, Store]) -> None:
    await publish(db[1], "run-q", 1, 1)
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as client:
        got = await read(client, 1, {"run_id": "run-q", "key": live.keys["read"]}, {})
        elsewhere = await client.get("/api/v1/runs", params={"key": live.keys["read"]})
    assert got[0]["data"]["seq"] == 1
    assert elsewhere.status_code == 401  # only the stream takes a key in its URL
