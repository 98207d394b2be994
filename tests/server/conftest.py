"""A real server for the API tests: uvicorn on a free port, in a thread of this process
(or, for restarts, a subprocess), over a SQLite file that the tests also open directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from statekeeper.server import ApiKeys, ServerConfig, create_app
from statekeeper.stores import Store, open_store
from statekeeper.testing.schemes import (
    POSTGRES_URL,
    REDIS_CLUSTER_URL,
    REDIS_URL,
    _require_redis_cluster,
    delete_cluster_prefix,
    delete_prefix,
    drop_schema,
    postgres_reachable,
)
from statekeeper.testing.services import require_service

SRC = Path(__file__).parents[2] / "src"
DEMO_APP = "statekeeper.demo_app:make_runner"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThreadServer:
    """uvicorn serving ``create_app(config)`` in a thread; `stop` ends it."""

    def __init__(self, config: ServerConfig, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_app(config),
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                timeout_graceful_shutdown=1,
                limit_concurrency=1000,
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:  # readiness, not timing: nothing is asserted on it
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def serve_subprocess(store_url: str, port: int, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``statekeeper serve`` as its own process (started; call `wait_ready`), its
    stderr appended to ``log``."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "statekeeper.cli", "--store", store_url, "serve"]
    command += ["--port", str(port), "--poll-interval", "0.05", *extra]
    with log.open("ab") as err:
        return subprocess.Popen(command, env=env, stderr=err)


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text()}")
        try:
            httpx.get(f"{url}/api/v1/openapi.json", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("the server did not start")


@dataclass
class Live:
    """A running server, its store URL and a key of each scope (tenant ``acme``)."""

    url: str
    store_url: str
    keys: dict[str, str]
    key_ids: dict[str, str]
    other_key: str
    """An operate key of tenant ``other``."""

    def headers(self, scope: str = "operate") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[scope]}"}

    def client(self, scope: str = "operate", **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers(scope), **options)


async def make_keys(store: Store) -> tuple[dict[str, str], dict[str, str], str]:
    keys, ids = {}, {}
    for scope in ("read", "operate", "admin"):
        record, key = await ApiKeys(store).create("acme", scope, label=f"test {scope}")
        keys[scope], ids[scope] = key, record.key_id
    _, other = await ApiKeys(store).create("other", "operate")
    return keys, ids, other


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[tuple[str, Store]]:
    url = f"sqlite:///{tmp_path}/state.db"
    store = await open_store(url)
    try:
        yield url, store
    finally:
        await store.close()


@asynccontextmanager
async def live_server(db: tuple[str, Store], app: str) -> AsyncIterator[Live]:
    """A server in a thread on ``db``'s store, its ``--app`` ``app``, with keys of each scope."""
    url, store = db
    keys, ids, other = await make_keys(store)
    from statekeeper.runs.operations import load_factory

    config = ServerConfig(url, app=app, factory=load_factory(app), poll_interval=0.05)
    server = ThreadServer(config).start()
    try:
        yield Live(server.url, url, keys, ids, other)
    finally:
        server.stop()


@pytest.fixture
async def live(db: tuple[str, Store]) -> AsyncIterator[Live]:
    async with live_server(db, DEMO_APP) as server:
        yield server


class SseReader:
    """Reads SSE messages off an httpx streaming response, one at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()
        self.current: dict[str, str] = {}

    QUIET = 60.0

    async def next(self) -> dict[str, Any]:
        """The next message; a stream quiet for `QUIET` seconds fails the test (its
        keep-alive comments would reset httpx's read timeout forever)."""
        async with asyncio.timeout(self.QUIET):
            return await self._next()

    async def _next(self) -> dict[str, Any]:
        async for line in self.lines:
            if not line:
                message, self.current = self.current, {}
                if "data" in message:
                    return {**message, "data": json.loads(message["data"])}
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            self.current[name] = value[1:] if value.startswith(" ") else value
        raise EOFError("the stream ended")


@pytest.fixture(params=["postgres", "redis", "redis-cluster"])
async def feed_store_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A store several servers can share, with its event feed: a fresh PostgreSQL schema
    and LISTEN/NOTIFY channel, or a fresh Redis key prefix on one server or on the
    suite's cluster (removed afterwards)."""
    unique = f"feed{uuid.uuid4().hex[:10]}"
    if request.param == "redis-cluster":
        await _require_redis_cluster(REDIS_CLUSTER_URL)
        yield f"{REDIS_CLUSTER_URL}?prefix={unique}"
        await delete_cluster_prefix(REDIS_CLUSTER_URL, unique)
    elif request.param == "redis":
        url = f"{REDIS_URL}?prefix={unique}"
        try:
            async with await open_store(url):
                pass
        except Exception as exc:
            require_service("redis", str(exc))
        yield url
        await delete_prefix(REDIS_URL, unique)
    else:
        if not await postgres_reachable():
            require_service("postgres", "no PostgreSQL server at 127.0.0.1:5432")
        yield f"{POSTGRES_URL}?schema={unique}&notify_channel={unique}"
        await drop_schema(unique)
