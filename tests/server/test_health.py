"""``/healthz`` and ``/readyz`` (no key, no data), and graceful shutdown: a stopping server
lets the runs it drives finish within its grace, and releases the others' leases."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.messages import Message
from statekeeper.errors import StoreUnavailableError
from statekeeper.runs import Finish, Runner, StepInput
from statekeeper.server import ServerConfig
from statekeeper.server.context import ServerContext
from statekeeper.server.streams import EventHub
from statekeeper.stores import Store, open_store

from .conftest import Live, ThreadServer

TENANT = "acme"


async def test_healthz_and_readyz_answer_without_a_key(live: Live) -> None:
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as client:
        health = await client.get("/api/v1/healthz")
        ready = await client.get("/api/v1/readyz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"store": "ok", "feed": "none (the server polls the store)"}


async def test_readyz_is_503_with_the_reason_when_the_store_fails(
    db: tuple[str, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = db
    server = ThreadServer(ServerConfig(url, poll_interval=0.05)).start()
    try:
        app: Any = server.server.config.app
        context: ServerContext = app.state.context

        async def down(*args: Any) -> None:
            raise StoreUnavailableError(f"cannot reach {url}")

        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            monkeypatch.setattr(context.store, "get_session", down)
            failing = await client.get("/api/v1/readyz")
            monkeypatch.undo()
            context.closing = True
            closing = await client.get("/api/v1/readyz")
            context.closing = False
            health = await client.get("/api/v1/healthz")
    finally:
        server.stop()
    assert failing.status_code == 503
    assert failing.json()["checks"]["store"].startswith("store: StoreUnavailableError")
    assert url not in failing.text  # the store's location is not told
    assert closing.status_code == 503
    assert closing.json()["reason"] == "the server is shutting down"
    assert health.status_code == 200  # the process is still up


async def test_readyz_checks_the_feed(feed_store_url: str) -> None:
    server = ThreadServer(ServerConfig(feed_store_url, poll_interval=60)).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            answer = await client.get("/api/v1/readyz")
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    assert answer.json()["checks"] == {"store": "ok", "feed": "ok"}


class Blocker:
    """An agent whose first step waits for `go` (after saying it began); then it finishes."""

    name = "blocker"

    def __init__(self) -> None:
        self.began = asyncio.Event()
        self.go = asyncio.Event()

    async def step(self, run: StepInput) -> Finish:
        self.began.set()
        await self.go.wait()
        return Finish("done", Message.assistant("done"))


async def _context(url: str, agent: Blocker) -> ServerContext:
    store = await open_store(url)

    def factory(store: Store, tenant: str) -> Runner:
        return Runner(store, tenant, [agent])

    return ServerContext(store, EventHub(store), factory, "tests:blocker")


async def _started(context: ServerContext, agent: Blocker) -> str:
    runner = await context.runner(TENANT, agents=True)
    run_id = f"run_{uuid.uuid4().hex}"
    context.background(runner.start("blocker", "hi", run_id=run_id), tenant=TENANT, run_id=run_id)
    async with asyncio.timeout(30):
        await agent.began.wait()
    return run_id


async def test_shutdown_lets_a_running_run_finish_within_the_grace(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    agent = Blocker()
    context = await _context(url, agent)
    run_id = await _started(context, agent)
    assert context.in_flight == 1
    closing = asyncio.create_task(context.aclose(grace=30))
    for _ in range(1000):  # the shutdown begins at the task's first step
        if context.closing:
            break
        await asyncio.sleep(0)
    assert context.closing
    assert not closing.done()  # it waits for the run, which still runs
    agent.go.set()
    async with asyncio.timeout(30):
        await closing
    async with await open_store(url) as store:
        state = await Runner(store, TENANT, []).load(run_id)
    assert state.status == AgentStatus.COMPLETED


async def test_shutdown_releases_the_lease_of_a_run_still_running(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    agent = Blocker()
    context = await _context(url, agent)
    run_id = await _started(context, agent)
    async with await open_store(url) as store:
        other = Runner(store, TENANT, [agent])
        held, _ = await other.runs.index(run_id)
        assert held.owner is not None
        assert held.owner != other.owner
        async with asyncio.timeout(30):
            await context.aclose(grace=0)
        released, _ = await other.runs.index(run_id)
        assert released.owner is None
        assert released.lease_until is None
        # Another server resumes it at once: no take_over, no waiting for the lease.
        agent.go.set()
        async with asyncio.timeout(30):
            result = await other.resume(run_id)
    assert result.state.status == AgentStatus.COMPLETED
