"""The HTTP server against a bare FastAPI route and the library calls it makes, and its
SSE fan-out latency.

Our routes against a bare route (both in this process, each app on its own store over
the same SQLite file, both called through ``httpx.ASGITransport`` by one client each,
interleaved in batches): the bare app is a plain FastAPI app whose routes make the same
library calls (``SessionManager.get``, then ``Session.entries`` or ``Session.append``)
without a key and answer the entries as plain JSON; ours checks an API key (read from the
store) and answers the API's shapes.

- last 20 entries of a 1,000- and of a 10,000-entry session (``GET .../entries``), our
  route against the bare one, and ours on 10,000 against ours on 1,000 (a read of the
  newest entries should not cost more in a longer session);
- append: one message per request, ours against the bare route;
- the last 20 of 1,000 served keyless (``--dev-anonymous``) against the bare route: what
  the key check, a read of the key's record per request, adds.

Each of these rows also gives the same batches' ratios in CPU time of this process
(which does both sides' work): steadier than wall-clock time on a loaded machine.

Against the library, the server is ``statekeeper serve`` in its own process (uvicorn,
one worker) over a SQLite file (and, for the feed row, a Redis store), with the demo
app; this process is the client (httpx, one keep-alive connection per client) and the
library side, on the same store:

- append: one message per request, ``POST /sessions/{id}/messages``, against
  ``Session.append`` of the same message in this process; sides interleaved in batches;
- approve and resume: a demo run waiting on its refund call, ``POST .../approve`` then
  ``POST .../resume {"wait": true}`` (two requests, until the run completes), against
  ``Runner.approve`` and ``Runner.resume``;
- SSE fan-out: 1 and 100 clients stream one run; this process publishes an event and
  times until each client has it. Without a feed the server reads the log every
  ``--poll-interval`` (0.05 s here), so latency is about half of that; with the Redis
  store's feed it is pushed.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from pydantic import BaseModel, JsonValue

from bench.common import Op, Ratios, Verdicts, as_message, interleave, message_dict, spread
from statekeeper.core.messages import Message
from statekeeper.demo_app import make_runner
from statekeeper.runtime.events import EventBus
from statekeeper.server import ApiKeys, ServerConfig, create_app
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import Entry

BATCHES, BATCH = 6, 50
ROUTE_BATCHES, ROUTE_BATCH = 20, 25  # short batches: a noisy moment spoils fewer of them
READ_SIZES = (1_000, 10_000)
PAGE = 20
RUNS_PER_SIDE = 30
FANOUT = (1, 100)
EVENTS = 20
POLL = 0.05
REDIS = os.environ.get("STATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SRC = Path(__file__).parents[1] / "src"


class Served:
    """``statekeeper serve`` in a subprocess, and an admin key for it."""

    def __init__(self, store_url: str, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        command = [sys.executable, "-m", "statekeeper.cli", "--store", store_url, "serve"]
        command += ["--port", str(port), "--poll-interval", str(POLL)]
        command += ["--app", "statekeeper.demo_app:make_runner"]
        self.process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)

    async def ready(self) -> None:
        async with httpx.AsyncClient() as client:
            for _ in range(600):
                try:
                    await client.get(f"{self.url}/api/v1/openapi.json")
                    return
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        raise RuntimeError("the server did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _append(store: Store, client: httpx.AsyncClient) -> tuple[Any, float, float]:
    manager = SessionManager(store, "bench", max_messages=None, auto_continue=False)
    await manager.create(session_id="http")
    session = await manager.create(session_id="lib")

    async def ours(n: int) -> None:
        answer = await client.post(
            "/api/v1/sessions/http/messages",
            json={"messages": [{"role": "user", "content": f"message {n} " + "x" * 300}]},
        )
        answer.raise_for_status()

    async def raw(n: int) -> None:
        await session.append(Message.user(f"message {n} " + "x" * 300), strict=False)

    ratios = await interleave(ours, raw, BATCHES, BATCH)
    return ratios, 1e6 / ratios.ours_us, 1e6 / ratios.raw_us


class _Messages(BaseModel):
    messages: list[dict[str, JsonValue]]


def _plain(entry: Entry) -> dict[str, Any]:
    return entry._asdict() | {"created_at": entry.created_at.isoformat()}


def bare_app(store: Store, tenant: str) -> FastAPI:
    """The baseline: FastAPI routes making the library calls ours make, without a key,
    answering the entries as they are stored."""
    app = FastAPI()
    manager = SessionManager(store, tenant, max_messages=None, auto_continue=False)

    @app.get("/sessions/{session_id}/entries")
    async def entries(session_id: str, after_seq: int = 0, limit: int = 200) -> Any:
        session = await manager.get(session_id)
        page = await session.entries(after_seq=after_seq, limit=limit)
        return {"items": [_plain(e) for e in page]}

    @app.post("/sessions/{session_id}/messages", status_code=201)
    async def append(session_id: str, body: _Messages) -> Any:
        session = await manager.get(session_id)
        messages = [Message.from_dict(m) for m in body.messages]
        outcome = await session.append(*messages, strict=False)
        return {"entries": [_plain(e) for e in outcome.entries]}

    return app


async def _filled(manager: SessionManager, session_id: str, size: int) -> None:
    session = await manager.create(session_id=session_id)
    for start in range(0, size, 100):
        batch = [as_message(message_dict(n)) for n in range(start, min(size, start + 100))]
        await session.append(*batch, strict=False)


async def _compare(ours: Op, bare: Op) -> tuple[Ratios, list[float]]:
    """`interleave`'s ratios of wall-clock time, and the same batches' ratios of this
    process's CPU time: it does all the work of both sides (the store's reads run on its
    loop), and CPU time is steadier than wall-clock time while other processes load the
    machine. An append's fsync is wall-clock time only."""
    spent: dict[tuple[str, int], float] = {}

    def timed(op: Op, side: str) -> Op:
        async def call(n: int) -> None:
            started = time.process_time()
            await op(n)
            key = (side, n // ROUTE_BATCH)
            spent[key] = spent.get(key, 0.0) + time.process_time() - started

        return call

    ratios = await interleave(timed(ours, "ours"), timed(bare, "bare"), ROUTE_BATCHES, ROUTE_BATCH)
    batches = range(1, ROUTE_BATCHES + 1)  # batch 0 is interleave's warm-up
    return ratios, [spent["ours", b] / spent["bare", b] for b in batches]


async def _routes(url: str, rows: dict[str, Any]) -> None:
    """Our routes against the bare ones, in this process (see the module docstring)."""
    tenant = "bench"
    ours_app = create_app(ServerConfig(url))
    keyless_app = create_app(ServerConfig(url, dev_anonymous=True))  # tenant "default"
    bare_store = await open_store(url)
    try:
        manager = SessionManager(bare_store, tenant, max_messages=None, auto_continue=False)
        for size in READ_SIZES:
            await _filled(manager, f"read-{size}", size)
        keyless = SessionManager(bare_store, "default", max_messages=None, auto_continue=False)
        await _filled(keyless, f"read-{READ_SIZES[0]}", READ_SIZES[0])
        await manager.create(session_id="append-ours")
        await manager.create(session_id="append-bare")
        _, key = await ApiKeys(bare_store).create(tenant, "operate")
        async with (
            ours_app.router.lifespan_context(ours_app),
            keyless_app.router.lifespan_context(keyless_app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(keyless_app), base_url="http://keyless/api/v1"
            ) as ours_keyless,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(ours_app),
                base_url="http://ours/api/v1",
                headers={"Authorization": f"Bearer {key}"},
            ) as ours,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(bare_app(bare_store, tenant)),
                base_url="http://bare",
            ) as bare,
        ):

            def reader(client: httpx.AsyncClient, size: int) -> Any:
                params = {"after_seq": size - PAGE, "limit": PAGE}

                async def read(n: int) -> None:
                    answer = await client.get(f"/sessions/read-{size}/entries", params=params)
                    assert len(answer.json()["items"]) == PAGE, answer.text

                return read

            for size in READ_SIZES:
                rows[f"read {size}"] = await _compare(reader(ours, size), reader(bare, size))
            small, large = READ_SIZES
            rows["read growth"] = await _compare(reader(ours, large), reader(ours, small))
            rows["read keyless"] = await _compare(reader(ours_keyless, small), reader(bare, small))

            def appender(client: httpx.AsyncClient, session_id: str) -> Any:
                async def append(n: int) -> None:
                    body = {"messages": [message_dict(n)]}
                    answer = await client.post(f"/sessions/{session_id}/messages", json=body)
                    assert answer.status_code == 201, answer.text

                return append

            rows["append routes"] = await _compare(
                appender(ours, "append-ours"), appender(bare, "append-bare")
            )
    finally:
        await bare_store.close()


async def _approve_resume(store: Store, client: httpx.AsyncClient) -> tuple[float, float]:
    runner = make_runner(store, "bench")
    http_runs = [(await runner.start("support", "refund?")).run_id for _ in range(RUNS_PER_SIDE)]
    lib_runs = [(await runner.start("support", "refund?")).run_id for _ in range(RUNS_PER_SIDE)]
    took = {"http": 0.0, "lib": 0.0}
    for n, (over_http, in_process) in enumerate(zip(http_runs, lib_runs, strict=True)):
        sides = [("http", over_http), ("lib", in_process)]
        for side, run_id in sides if n % 2 == 0 else sides[::-1]:  # interleaved
            started = time.perf_counter()
            if side == "http":
                await client.post(f"/api/v1/runs/{run_id}/approve", json={"call_id": "c-refund"})
                done = await client.post(f"/api/v1/runs/{run_id}/resume", json={"wait": True})
                assert done.json()["status"] == "completed", done.text
            else:
                await runner.approve(run_id, "c-refund")
                assert (await runner.resume(run_id)).status == "completed"
            took[side] += time.perf_counter() - started
    return RUNS_PER_SIDE / took["http"], RUNS_PER_SIDE / took["lib"]


async def _fanout(store: Store, served: Served, key: str, clients: int) -> list[float]:
    """Seconds from publish to receipt, per event per client."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    bus = EventBus(store, "bench")
    await bus.publish(run_id, "bench", "tick", {"t": time.time()})
    lags: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=clients + 5)
    async with httpx.AsyncClient(base_url=served.url, timeout=60, limits=limits) as client:

        async def one() -> None:
            params = {"run_id": run_id}
            async with client.stream("GET", "/api/v1/stream", params=params, headers=headers) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:") and '"seq":' in line:
                        seq = int(line.split('"seq":')[1].split(",")[0])
                        if seq > 1:
                            lags.append(time.perf_counter() - sent[seq])
                        if seq == EVENTS + 1:
                            return

        sent: dict[int, float] = {}
        tasks = [asyncio.create_task(one()) for _ in range(clients)]
        await asyncio.sleep(1.0)  # every client connected and caught up
        for n in range(2, EVENTS + 2):
            sent[n] = time.perf_counter()
            await bus.publish(run_id, "bench", "tick", {})
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
    return lags


async def _sse(store_url: str, rows: dict[str, Any], label: str) -> None:
    store = await open_store(store_url)
    served = Served(store_url, _port())
    try:
        _, key = await ApiKeys(store).create("bench", "read")
        await served.ready()
        for clients in FANOUT:
            lags = await _fanout(store, served, key, clients)
            rows[f"sse {label} {clients}"] = lags
    finally:
        served.stop()
        await store.close()


async def run() -> dict[str, Any]:
    """Every figure of the suite."""
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        await _routes(f"sqlite:///{tmp}/routes.db", rows)
        url = f"sqlite:///{tmp}/bench.db"
        store = await open_store(url)
        served = Served(url, _port())
        try:
            _, key = await ApiKeys(store).create("bench", "admin")
            await served.ready()
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as c:
                rows["append"] = await _append(store, c)
                rows["approve"] = await _approve_resume(store, c)
        finally:
            served.stop()
            await store.close()
        await _sse(url, rows, "sqlite (poll)")
    prefix = f"bench-server-{uuid.uuid4().hex[:6]}"
    try:
        await _sse(f"{REDIS}?prefix={prefix}", rows, "redis (feed)")
    except Exception as exc:  # no Redis here: the row is left out
        print(f"(redis row skipped: {exc})")
    finally:
        await _drop_keys(prefix)
    return rows


async def _drop_keys(prefix: str) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(REDIS)
    try:
        async for key in client.scan_iter(match=f"{prefix}*", count=1000):
            await client.delete(key)
    except Exception as exc:
        print(f"(could not clean up Redis keys {prefix}*: {exc})")
    finally:
        await client.aclose()


def _route_rows(rows: dict[str, Any], verdicts: Verdicts) -> None:
    """Our routes against the bare ones: wall-clock verdicts, CPU time beside them."""
    small, large = READ_SIZES
    named: list[tuple[str, str, float | None]] = [
        *((f"last {PAGE} of {size:,}", f"read {size}", 1.3) for size in READ_SIZES),
        ("append", "append routes", 1.2),
        (f"last {PAGE}: ours {large:,} / ours {small:,}", "read growth", 1.2),
        # Served keyless (--dev-anonymous): what the key check (a store read) adds.
        (f"last {PAGE} of {small:,}: keyless / bare", "read keyless", None),
    ]
    for name, row, limit in named:
        ratios, cpu = rows[row]
        if "/" not in name:
            label = f"{name}: us per request, ours / bare"
            print(f"{label:<{Verdicts.WIDTH}} {ratios.ours_us:>9.0f} / {ratios.raw_us:.0f}")
            name += ": ours / bare route"
        if limit is None:
            verdicts.info(name, list(ratios))
        else:
            verdicts.at_most(name, list(ratios), limit)
        print(f"{'  the same in CPU time':<{Verdicts.WIDTH}} {spread(cpu):>20}")


def report(rows: dict[str, Any]) -> list[str]:
    """Print the figures; return the missed targets."""
    verdicts = Verdicts()
    _route_rows(rows, verdicts)
    ratios, http_rps, lib_rps = rows["append"]
    verdicts.info("append: HTTP requests/s", http_rps)
    verdicts.info("append: library calls/s", lib_rps)
    verdicts.at_most("append: HTTP / library time per call", list(ratios), 15.0)
    http, lib = rows["approve"]
    verdicts.info("approve+resume: HTTP runs/s (2 requests)", http)
    verdicts.info("approve+resume: library runs/s", lib)
    verdicts.at_most("approve+resume: HTTP / library time", lib / http, 3.0)
    for name, lags in rows.items():
        if name.startswith("sse "):
            ms = [lag * 1000 for lag in lags]
            p95 = sorted(ms)[int(len(ms) * 0.95) - 1]
            print(f"{name + ' clients: latency ms':<44} {spread(ms):>20}  p95 {p95:.1f}")
            limit = POLL * 1000 * 2 if "poll" in name else 50.0
            verdicts.at_most(f"{name}: median latency ms", statistics.median(ms), limit)
    return verdicts.missed


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
