"""Three ``statekeeper serve`` processes on one store (PostgreSQL with LISTEN/NOTIFY, and
Redis): a run started on one is approved on a second and streamed, every event once and
in order, on the third; a server stopped (SIGTERM) or killed (SIGKILL) while it drives a
run leaves it to another, which runs the interrupted tool call once, recorded.

Real processes (``python -m statekeeper.cli serve``) with ``--app server.many_app``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from statekeeper.demo_app import make_runner
from statekeeper.runs import Runner
from statekeeper.server import ApiKeys
from statekeeper.stores import open_store

from .conftest import Live, SseReader, free_port

TESTS = Path(__file__).parents[1]
SRC = TESTS.parent / "src"
APP = "server.many_app:make_runner"
TENANT = "acme"
BOUND = 40.0  # seconds any one wait of these tests may take
ONE_NODE = pytest.mark.parametrize("feed_store_url", ["postgres", "redis"], indirect=True)
"""Server behaviour the store does not change: not again on Redis Cluster (time)."""


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class Cluster:
    """Servers on one store, and an operate key of tenant ``acme``."""

    store_url: str
    key: str
    folder: Path
    servers: list[Server] = field(default_factory=list)

    def start(
        self, name: str, *, grace: float = 10.0, args: tuple[str, ...] = (), **env: str
    ) -> Server:
        port = free_port()
        log = self.folder / f"{name}.log"
        path = os.pathsep.join([str(SRC), str(TESTS), os.environ.get("PYTHONPATH", "")])
        command = [sys.executable, "-m", "statekeeper.cli", "--store", self.store_url, "serve"]
        command += ["--app", APP, "--port", str(port), "--poll-interval", "0.05"]
        command += ["--shutdown-grace", str(grace), *args]
        env = {"SK_TEST_MARK": str(self.folder / "hold.marks"), **env}
        with log.open("ab") as err:
            process = subprocess.Popen(
                command, env={**os.environ, "PYTHONPATH": path, **env}, stderr=err
            )
        server = Server(name, f"http://127.0.0.1:{port}", process, log)
        self.servers.append(server)
        return server

    def client(self, server: Server) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.key}"}
        return httpx.AsyncClient(base_url=server.url, headers=headers, timeout=BOUND)

    def stop(self) -> None:
        for server in self.servers:
            if server.process.poll() is None:
                server.process.terminate()
        for server in self.servers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.process.wait(20)
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait(10)


async def ready(server: Server) -> None:
    """Wait (bounded) until the server answers ``/readyz`` with 200."""
    deadline = time.monotonic() + BOUND
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        while True:
            if server.process.poll() is not None:
                raise AssertionError(f"server {server.name} exited: {server.log.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/api/v1/readyz")).status_code == 200:
                    return
            assert time.monotonic() < deadline, f"server {server.name} never got ready"
            await asyncio.sleep(0.05)  # polling the server's state, not timing anything


@pytest.fixture
async def cluster(feed_store_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    store_url = feed_store_url
    async with await open_store(store_url) as store:
        _, key = await ApiKeys(store).create(TENANT, "operate")
    made = Cluster(store_url, key, tmp_path)
    try:
        yield made
    finally:
        await asyncio.to_thread(made.stop)


async def until(
    client: httpx.AsyncClient, run_id: str, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The run's detail once ``check`` holds (polling its state, bounded)."""
    deadline = time.monotonic() + BOUND
    while True:
        run: dict[str, Any] = (await client.get(f"/api/v1/runs/{run_id}")).json()
        if check(run):
            return run
        assert time.monotonic() < deadline, f"run {run_id} never got there: {run}"
        await asyncio.sleep(0.05)


async def log_of(store_url: str, run_id: str) -> list[tuple[int, str]]:
    """The run's event log, read through the library: (seq, stream/kind) pairs."""
    async with await open_store(store_url) as store:
        events = await store.read_events(TENANT, run_id, after_seq=0, limit=10_000)
    return [(e.seq, f"{e.stream}/{e.kind}") for e in events]


async def tool_results(store_url: str, session_id: str, call_id: str) -> list[str]:
    """The results of tool call ``call_id`` in the session, read through the library."""
    async with await open_store(store_url) as store:
        session = await Runner(store, TENANT, []).sessions.get(session_id)
        messages = await session.messages()
    return [r.content for m in messages for r in m.tool_results if r.tool_call_id == call_id]


def _status(*wanted: str) -> Callable[[dict[str, Any]], bool]:
    return lambda run: run["status"] in wanted


async def test_started_on_one_approved_on_another_streamed_on_a_third(cluster: Cluster) -> None:
    a, b, c = (cluster.start(name) for name in "abc")
    await asyncio.gather(ready(a), ready(b), ready(c))
    async with (
        cluster.client(a) as on_a,
        cluster.client(b) as on_b,
        cluster.client(c) as on_c,
        on_c.stream("GET", "/api/v1/stream") as tenant_answer,  # every run, from now on
    ):
        assert tenant_answer.status_code == 200
        tenant = SseReader(tenant_answer)
        started = await on_a.post(
            "/api/v1/runs", json={"agent": "support", "input": "Where is order 1042?"}
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        async with on_c.stream("GET", "/api/v1/stream", params={"run_id": run_id}) as answer:
            assert answer.status_code == 200
            reader = SseReader(answer)
            waiting = await until(on_b, run_id, _status("waiting_for_approval"))
            assert [p["call_id"] for p in waiting["pending"]] == ["c-refund"]
            approved = await on_b.post(
                f"/api/v1/runs/{run_id}/approve", json={"call_id": "c-refund", "resume": True}
            )
            assert approved.status_code in (200, 202), approved.text
            done = await until(on_c, run_id, _status("completed", "error", "cancelled"))
            assert done["status"] == "completed", done
            log = await log_of(cluster.store_url, run_id)
            seen = await _read_until(reader, run_id, log[-1][0])
        seen_by_tenant = await _read_until(tenant, run_id, log[-1][0])
    # Every event of the run, once, in order, on a third server, on both kinds of stream.
    assert seen == log
    assert seen_by_tenant == log
    refunds = await tool_results(cluster.store_url, done["session_id"], "c-refund")
    assert len(refunds) == 1


async def _read_until(reader: SseReader, run_id: str, last: int) -> list[tuple[int, str]]:
    """The (seq, type) of the run's messages off ``reader`` up to seq ``last``."""
    reader.QUIET = BOUND  # a quiet stream fails the test within the bound
    seen: list[tuple[int, str]] = []
    while not seen or seen[-1][0] < last:
        data = (await reader.next())["data"]
        if data["run_id"] == run_id:
            seen.append((data["seq"], data["type"]))
    return seen


async def _holding(cluster: Cluster, server: Server) -> tuple[str, str]:
    """A ``holder`` run started on ``server`` (whose hold tool never returns), once the
    tool runs there: its id and its session's."""
    async with cluster.client(server) as client:
        started = await client.post("/api/v1/runs", json={"agent": "holder", "input": "hold"})
    assert started.status_code == 202, started.text
    deadline = time.monotonic() + BOUND
    while not marks(cluster):  # the tool writes its mark as it begins
        assert server.process.poll() is None, server.log.read_text()
        assert time.monotonic() < deadline, f"the hold tool never ran: {started.json()}"
        await asyncio.sleep(0.05)
    return started.json()["run_id"], started.json()["session_id"]


def marks(cluster: Cluster) -> list[str]:
    """The servers the hold tool ran on, in order (`many_app`)."""
    mark = cluster.folder / "hold.marks"
    return mark.read_text().split() if mark.exists() else []


@ONE_NODE  # on a cluster: the take-over test below
async def test_a_stopped_server_releases_its_run_for_another_at_once(cluster: Cluster) -> None:
    a = cluster.start("a", grace=0.5, SK_TEST_HOLD="1", SK_TEST_OWNER="node-a")
    b = cluster.start("b", SK_TEST_OWNER="node-b")
    await asyncio.gather(ready(a), ready(b))
    run_id, session_id = await _holding(cluster, a)
    a.process.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(a.process.wait, BOUND)
    assert code in (0, -signal.SIGTERM), a.log.read_text()  # uvicorn re-raises SIGTERM
    assert f"stopping run(s) {run_id}; their leases are released" in a.log.read_text()
    async with await open_store(cluster.store_url) as store:
        index, _ = await Runner(store, TENANT, []).runs.index(run_id)
    assert index.owner is None  # released: no lease to wait out
    async with cluster.client(b) as on_b:
        resumed = await on_b.post(f"/api/v1/runs/{run_id}/resume", json={})
        assert resumed.status_code == 202, resumed.text  # at once, without take_over
        done = await until(on_b, run_id, _status("completed", "error", "cancelled"))
        assert done["status"] == "completed", done
    results = await tool_results(cluster.store_url, session_id, "c-hold")
    assert marks(cluster) == ["node-a", "node-b"]  # a was stopped in it; b ran it again
    assert len(results) == 1  # and its one result, b's, is recorded once
    assert "node-b" in results[0]


@ONE_NODE  # on a cluster: the take-over test below
async def test_a_killed_servers_run_is_taken_over_after_its_lease(cluster: Cluster) -> None:
    a = cluster.start("a", SK_TEST_HOLD="1", SK_TEST_OWNER="node-a", SK_TEST_LEASE="3")
    b = cluster.start("b", SK_TEST_OWNER="node-b", SK_TEST_LEASE="3")
    await asyncio.gather(ready(a), ready(b))
    run_id, session_id = await _holding(cluster, a)
    a.process.kill()
    await asyncio.to_thread(a.process.wait, BOUND)
    async with await open_store(cluster.store_url) as store:
        index, _ = await Runner(store, TENANT, []).runs.index(run_id)
    assert index.owner is not None
    assert index.owner.startswith("node-a:")
    assert index.lease_until is not None
    async with cluster.client(b) as on_b:
        deadline = time.monotonic() + BOUND
        while True:  # refused (409) while a's lease lasts; b takes the run over after
            resumed = await on_b.post(f"/api/v1/runs/{run_id}/resume", json={})
            if resumed.status_code != 409:
                break
            assert "node-a" in resumed.json()["error"]["message"], resumed.text
            assert time.monotonic() < deadline, resumed.text
            await asyncio.sleep(0.1)  # polling the run's lease, not timing anything
        taken = datetime.now(UTC)
        assert resumed.status_code == 202, resumed.text
        assert taken >= index.lease_until
        done = await until(on_b, run_id, _status("completed", "error", "cancelled"))
        assert done["status"] == "completed", done
    results = await tool_results(cluster.store_url, session_id, "c-hold")
    assert marks(cluster) == ["node-a", "node-b"]  # a died in it; b ran it again
    assert len(results) == 1  # and its one result, b's, is recorded once
    assert "node-b" in results[0]


async def test_with_take_over_a_killed_servers_run_goes_on_by_itself(cluster: Cluster) -> None:
    a = cluster.start("a", SK_TEST_HOLD="1", SK_TEST_OWNER="node-a", SK_TEST_LEASE="2")
    b = cluster.start("b", args=("--take-over", "0.2"), SK_TEST_OWNER="node-b", SK_TEST_LEASE="2")
    await asyncio.gather(ready(a), ready(b))
    run_id, session_id = await _holding(cluster, a)
    assert marks(cluster) == ["node-a"]  # b leaves a run whose driver lives alone
    a.process.kill()
    await asyncio.to_thread(a.process.wait, BOUND)
    async with await open_store(cluster.store_url) as store:
        index, _ = await Runner(store, TENANT, []).runs.index(run_id)
    assert index.lease_until is not None
    async with cluster.client(b) as on_b:  # nobody asks: b finds the run and resumes it
        done = await until(on_b, run_id, _status("completed", "error", "cancelled"))
    assert done["status"] == "completed", done
    assert f"taking over run {run_id} of tenant {TENANT}" in b.log.read_text()
    results = await tool_results(cluster.store_url, session_id, "c-hold")
    assert marks(cluster) == ["node-a", "node-b"]  # a died in its tool call; b ran it again
    assert len(results) == 1
    assert "node-b" in results[0]


async def test_resuming_a_run_another_server_holds_is_409_at_once(live: Live) -> None:
    async with await open_store(live.store_url) as store:
        runner = make_runner(store, TENANT)
        result = await runner.start("support", "Where is order 1042?")
        run_id = result.state.run_id
        await runner.runs.claim(run_id, "elsewhere:1:server", ttl=300)  # another host's lease
    async with live.client() as client:
        held = await client.post(f"/api/v1/runs/{run_id}/resume", json={})
        taken = await client.post(f"/api/v1/runs/{run_id}/resume", json={"take_over": True})
    assert held.status_code == 409, held.text  # not a 202 whose resume then fails
    assert "elsewhere:1:server" in held.json()["error"]["message"]
    assert taken.status_code == 202, taken.text
