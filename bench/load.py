"""Many concurrent chat-agent sessions through `statekeeper serve` processes, against the
library called directly, and PostgreSQL against raw psycopg (issue 24).

python -m bench load                              # 1,000 sessions, 30 s per side
python -m bench load --sessions 200 --seconds 15  # smaller

Each session does what a chat agent does, turn after turn, until the side's time is up:
append a user message (~400 B), read the last 20 entries, append an assistant message
(~400 B). Every 10th turn of a session (sessions start at different points of that
cycle; ``RUN_EVERY`` in `bench.load_sides`) also starts a run of the demo app's
``support`` agent, which stops for a human's approval of its refund call, then approves
it and resumes it to completion.

Sides, each ``--seconds`` long, taken in two halves in the order A B B A (so neither side
always runs on a warmer or a cooler machine):

- HTTP: ``statekeeper serve --app statekeeper.demo_app:make_runner`` in real subprocesses
  (2 of them; 1 on SQLite, which is one host), started and stopped here, keys made with
  ``statekeeper keys create``; sessions are spread over the servers, one httpx client
  (one keep-alive connection) per session, as separate agents have. A run is
  ``POST /runs``, ``GET /runs/{id}`` every 0.25 s until it waits for approval,
  ``POST .../approve``, ``POST .../resume {"wait": true}``.
- library: the same workload as asyncio tasks in this process on one store
  (``SessionManager``, ``Session.append`` / ``entries``, ``Runner.start`` / ``approve`` /
  ``resume``): what the HTTP layer costs.

Stores (``--stores sqlite,postgresql,redis,redis-cluster``, all by default): SQLite (a
temporary file), PostgreSQL (127.0.0.1:5432 db ``test``, a throw-away schema dropped at
the end), Redis (single node 127.0.0.1:6379, ``STATEKEEPER_BENCH_REDIS_URL``) and Redis
Cluster (``redis+cluster://127.0.0.1:7101``, ``STATEKEEPER_BENCH_REDIS_CLUSTER_URL``;
``bash scripts/redis-cluster.sh start 7100`` starts the local one), each on a fresh key
prefix whose keys are deleted at the end (on a cluster, on every master).

PostgreSQL against raw psycopg at ``RAW_SESSIONS`` concurrent sessions: the same turns
without runs, ours through the library against the plainest raw code, a
``psycopg_pool.AsyncConnectionPool`` (the same pool size as our store's) and a table
``(session_id, seq, payload jsonb)`` with one ``INSERT`` per append and one ``SELECT ...
ORDER BY seq DESC LIMIT 20`` per read. Target: ours >= 0.7x raw in appends per second.

Each side has a tenant of its own (``load-http``, ``load-lib``): a run's detail
(``GET /runs/{id}``) reads the tenant's whole run index, so a side sharing the library's
tenant would pay for its runs too. Everything is loopback, bounded in sessions and time,
and stops by itself; requests time out after 60 s, and a session still busy 70 s after
its side's time is up is an error naming the call it was in. The client (one Python
process driving every session) and the servers share the machine's cores: the table
gives each side's CPU use (``cpu %``: this process, which on the library side does all
the work; ``srv cpu %``: the servers, summed), so a saturated client or server shows.
Ours / raw is also given per half (one ratio each).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.common import Verdicts, spread
from bench.common import reachable as common_reachable
from bench.load_sides import Tally, abba, http_side, lib_side, raw_side
from bench.postgres import URL as POSTGRES
from bench.postgres import reachable
from statekeeper.stores import open_store
from statekeeper.testing.schemes import delete_cluster_prefix

REDIS = os.environ.get("STATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
REDIS_CLUSTER = os.environ.get(
    "STATEKEEPER_BENCH_REDIS_CLUSTER_URL", "redis+cluster://127.0.0.1:7101"
)
RAW_SESSIONS = 200
POOL = 10  # PostgreSQL pool size: each server's, the library's and raw psycopg's
TARGET_RAW = 0.7
STORES = ("sqlite", "postgresql", "redis", "redis-cluster")
OPTIONS: dict[str, Any] = {"sessions": 1_000, "seconds": 30.0, "stores": STORES}


def configure(argv: list[str]) -> None:
    """Read ``--sessions N --seconds S`` (``python -m bench load --sessions 200``)."""
    parser = argparse.ArgumentParser(prog="python -m bench load")
    parser.add_argument("--sessions", type=int, default=OPTIONS["sessions"])
    parser.add_argument("--seconds", type=float, default=OPTIONS["seconds"])
    parser.add_argument("--stores", default=",".join(STORES), help="a comma-separated subset")
    args = parser.parse_args(argv)
    stores = tuple(args.stores.split(","))
    if not 1 <= args.sessions <= 10_000 or not 1 <= args.seconds <= 600:
        parser.error("--sessions must be 1..10000 and --seconds 1..600")
    if not stores or not set(stores) <= set(STORES):
        parser.error(f"--stores takes a comma-separated subset of {','.join(STORES)}")
    OPTIONS.update(sessions=args.sessions, seconds=args.seconds, stores=stores)


# --- one store: HTTP against the library ---------------------------------------------


async def _store_rows(label: str, url: str, servers: int, tmp: Path) -> dict[str, Tally]:
    sessions, seconds = int(OPTIONS["sessions"]), OPTIONS["seconds"]
    store = await open_store(url)
    try:
        http = await http_side(url, servers, sessions, tmp)
        try:
            lib = await lib_side(store, sessions, "lib")
            tallies = await abba({"http": http, "library": lib}, seconds)
        finally:
            await http.close()  # type: ignore[attr-defined]
    finally:
        await store.close()
    return {f"{label} {side}": tally for side, tally in tallies.items()}


async def _postgres(rows: dict[str, Any], tmp: Path) -> None:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    schema = f"skload_{uuid.uuid4().hex[:10]}"
    url = f"{POSTGRES}?schema={schema}&min_size={POOL}&max_size={POOL}"
    try:
        rows.update(await _store_rows("postgresql (2 servers)", url, 2, tmp))
        pool = AsyncConnectionPool(
            POSTGRES, min_size=POOL, max_size=POOL, open=False, kwargs={"autocommit": True}
        )
        await pool.open()
        store = await open_store(url)
        try:
            ours = await lib_side(store, RAW_SESSIONS, "vs-raw", runs=False)
            raw = await raw_side(pool, schema, RAW_SESSIONS)
            pair = await abba({"ours": ours, "raw": raw}, OPTIONS["seconds"])
        finally:
            await store.close()
            await pool.close()
        rows[f"postgresql {RAW_SESSIONS} sessions: library"] = pair["ours"]
        rows[f"postgresql {RAW_SESSIONS} sessions: raw psycopg"] = pair["raw"]
    finally:
        async with await psycopg.AsyncConnection.connect(POSTGRES, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


async def _drop_keys(prefix: str) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(REDIS)
    try:
        async for key in client.scan_iter(match=f"{prefix}*", count=1000):
            await client.delete(key)
    finally:
        await client.aclose()


async def _drop_cluster_keys(prefix: str) -> None:
    await delete_cluster_prefix(REDIS_CLUSTER.split("?", 1)[0], prefix)


async def _redis(rows: dict[str, Any], tmp: Path) -> None:
    """The Redis rows: one node, then the cluster (each on a prefix of its own)."""
    for store, what, base, port, drop in (
        ("redis", "Redis", REDIS, 6379, _drop_keys),
        ("redis-cluster", "Redis Cluster", REDIS_CLUSTER, 7101, _drop_cluster_keys),
    ):
        if store not in OPTIONS["stores"]:
            continue
        why = await common_reachable(base, port, what)
        if why is not None:
            print(f"({store} rows skipped: {why})")
            continue
        prefix = f"skload{uuid.uuid4().hex[:8]}"
        try:
            url = f"{base}{'&' if '?' in base else '?'}prefix={prefix}"
            rows.update(await _store_rows(f"{store} (2 servers)", url, 2, tmp))
        finally:
            await drop(prefix)


async def run() -> dict[str, Any]:
    """Every figure of the suite (a store that is not there is left out, with why)."""
    rows: dict[str, Any] = {}
    print(f"{OPTIONS['sessions']:,} sessions, {OPTIONS['seconds']:g} s per side", flush=True)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if "sqlite" in OPTIONS["stores"]:
            sqlite = f"sqlite:///{tmp}/load.db"
            rows.update(await _store_rows("sqlite (1 server)", sqlite, 1, tmp))
        why = await reachable()
        if why is not None:
            print(f"(postgresql rows skipped: {why})")
        elif "postgresql" in OPTIONS["stores"]:
            await _postgres(rows, tmp)
        await _redis(rows, tmp)
    return rows


def _ms(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] * 1000


def report(rows: dict[str, Any]) -> list[str]:
    """Print the figures; return the missed targets."""
    verdicts = Verdicts()
    head = f"{'side':<40} {'appends/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'read p50':>8}"
    print(
        head + f" {'runs':>5} {'run p50':>8} {'run p99':>8} {'errors':>6} {'cpu %':>6}"
        f" {'srv cpu %':>9}"
    )
    errors = 0
    for name, t in rows.items():
        print(
            f"{name:<40} {t.rate:>9.0f} {_ms(t.appends, 0.5):>8.1f} {_ms(t.appends, 0.99):>8.1f}"
            f" {_ms(t.reads, 0.5):>8.1f} {len(t.runs):>5} {_ms(t.runs, 0.5):>8.1f}"
            f" {_ms(t.runs, 0.99):>8.1f} {t.errors:>6}"
            f" {100 * t.cpu / t.elapsed:>6.0f} {100 * t.server_cpu / t.elapsed:>9.0f}"
        )
        for sample in t.samples:
            print(f"    {sample}")
        errors += t.errors
    for store in (
        "sqlite (1 server)",
        "postgresql (2 servers)",
        "redis (2 servers)",
        "redis-cluster (2 servers)",
    ):
        http, lib = rows.get(f"{store} http"), rows.get(f"{store} library")
        if http and lib and http.rate:
            name = store.split()[0]
            verdicts.info(f"{name}: library / HTTP appends per s", lib.rate / http.rate)
    ours = rows.get(f"postgresql {RAW_SESSIONS} sessions: library")
    raw = rows.get(f"postgresql {RAW_SESSIONS} sessions: raw psycopg")
    if ours and raw and raw.rate:
        # one ratio per half (A B B A: the first and the second time each side ran)
        halves = [o / r for o, r in zip(ours.halves, raw.halves, strict=True) if r]
        print(f"{'postgresql: ours / raw, each half':<{Verdicts.WIDTH}} {spread(halves):>20}")
        verdicts.at_least(
            f"postgresql {RAW_SESSIONS} sessions: ours / raw", ours.rate / raw.rate, TARGET_RAW
        )
        http = rows.get("postgresql (2 servers) http")
        if http:
            verdicts.info(
                f"postgresql: HTTP ({OPTIONS['sessions']:,}) / raw ({RAW_SESSIONS})",
                http.rate / raw.rate,
            )
    verdicts.at_most("errors (all sides)", float(errors), 0)
    if not rows:
        verdicts.missed.append("no store was reachable")
    return verdicts.missed


def main(argv: list[str]) -> int:
    """``python -m bench.load --sessions 200 --seconds 15``."""
    configure(argv)
    return 1 if report(asyncio.run(run())) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
