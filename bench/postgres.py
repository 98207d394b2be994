"""Sessions on PostgreSQL against the plainest raw psycopg code doing the same job.

Our side goes through the public API only: ``Session.append(message)`` (one message per
call) and ``Session.messages()`` of a `SessionManager` (``max_messages=None``) on
``open_store("postgresql://...", schema=...)``. The baseline is what a developer writes
without us: one async psycopg connection in autocommit mode, a plain table
``messages(id bigserial PRIMARY KEY, session_id text, data text)`` and one ``INSERT`` of
``json.dumps(message_dict)`` per message, each its own transaction; loading is a
``SELECT`` of the session's rows in id order plus ``json.loads`` of each. ``data`` is
``text``, not ``jsonb``: it is what the plainest code stores (the string it has), and the
fastest raw baseline (``jsonb`` makes the server parse every message and re-encode it,
losing key order and the exact number text, which our store keeps).

Messages are the realistic mix of `bench.common` (two ~400 B chat turns, then a ~2 KB
tool output). Each measured append adds one message to a session that already holds
``HISTORY`` messages (filled in batches first). The two sides take turns in batches;
each batch gives one ratio (ours time / raw time), reported as median [min-max].
O(1): our append at ``HISTORY`` against our append to sessions holding ``SMALL``
messages (a fresh one per batch), and our append to a session whose head holds
``HEAD_STATE`` bytes of state (``session.state``) against one to a session without,
interleaved the same way. Bytes on disk
(``pg_total_relation_size``: heap, TOAST and indexes, after ``VACUUM`` of both sides)
of our tables holding the session (``sessions`` and ``entries``, with only the measured
session stored) and of the raw table are compared with the payload, the JSON of the
messages. Extra information: 8 writers on 8 sessions against 8 raw writers on 8
connections, one round of ``PER_WRITER`` appends each per ratio.

The server comes from ``STATEKEEPER_BENCH_POSTGRES_URL`` (else
``STATEKEEPER_TEST_POSTGRES_URL``, else ``postgresql://postgres@127.0.0.1:5432/test``);
everything is written to a throw-away schema that is dropped at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

from bench.common import (
    Ratios,
    Verdicts,
    as_message,
    interleave,
    message_dict,
    payload_bytes,
    spread,
)
from bench.common import reachable as common_reachable
from statekeeper.sessions import Session, SessionManager
from statekeeper.stores import open_store

URL = os.environ.get(
    "STATEKEEPER_BENCH_POSTGRES_URL",
    os.environ.get("STATEKEEPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
)
HISTORY = 10_000
SMALL = 10  # history of the sessions the O(1) check compares with
HEAD_STATE = 50_000  # bytes of session state (incompressible) for the head-size check
FILL = 500  # messages per append while filling the history
BATCHES, BATCH = 20, 25  # measured appends: BATCHES * BATCH per side (+ 1 warm-up batch)
LOADS = 7
WRITERS, PER_WRITER, ROUNDS = 8, 25, 5
TARGETS = {"append": 1.3, "flat": 1.5, "head_size": 1.5}  # append: issue 21
"""Upper limits: ours / raw at ``HISTORY`` messages (issue 9); our append at ``HISTORY``
/ at ``SMALL`` (O(1) in the history's length); our append to a session holding
``HEAD_STATE`` bytes of state / to one without (O(1) in the head's size)."""


async def reachable() -> str | None:
    """None if the server answers, else why not."""
    return await common_reachable(URL, 5432, "PostgreSQL")


class Raw:
    """The baseline: a plain table, one autocommit INSERT (one transaction) per message."""

    def __init__(self, conn: Any, schema: str) -> None:
        self.conn = conn
        self.table = f'"{schema}".messages'
        self.insert = f"INSERT INTO {self.table} (session_id, data) VALUES (%s, %s)".encode()
        self.select = f"SELECT data FROM {self.table} WHERE session_id = %s ORDER BY id".encode()

    async def create(self) -> None:
        await self.conn.execute(
            f"CREATE TABLE {self.table} "
            "(id bigserial PRIMARY KEY, session_id text NOT NULL, data text NOT NULL)".encode()
        )

    async def fill(self, session_id: str, dicts: list[dict[str, str]]) -> None:
        async with self.conn.transaction(), self.conn.cursor() as cursor:
            await cursor.executemany(self.insert, [(session_id, json.dumps(d)) for d in dicts])

    async def append(self, session_id: str, data: dict[str, str]) -> None:
        await self.conn.execute(self.insert, (session_id, json.dumps(data)))

    async def load(self, session_id: str) -> list[Any]:
        cursor = await self.conn.execute(self.select, (session_id,))
        return [json.loads(text) for (text,) in await cursor.fetchall()]


async def measure(schema: str) -> dict[str, Any]:
    """Append, load and table bytes at ``HISTORY`` messages, then the concurrent writers."""
    import psycopg

    filler = [message_dict(n) for n in range(HISTORY)]
    appended = (BATCHES + 1) * BATCH
    fresh = [message_dict(HISTORY + n) for n in range(appended)]
    async with (
        open_store(URL, schema=schema) as store,
        await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn,
    ):
        raw = Raw(conn, schema)
        await raw.create()
        manager = SessionManager(store, "bench", max_messages=None)
        session = await manager.create()
        smalls = [await manager.create() for _ in range(BATCHES + 1)]
        for small in smalls:
            await small.append(*(as_message(d) for d in filler[:SMALL]))
        for start in range(0, HISTORY, FILL):
            await session.append(*(as_message(d) for d in filler[start : start + FILL]))
        await raw.fill("s1", filler)
        await conn.execute(b"CHECKPOINT")  # both histories on disk before the clock starts

        async def ours(n: int) -> None:  # our side builds its message from the dict
            await session.append(as_message(fresh[n]))

        async def raw_append(n: int) -> None:
            await raw.append("s1", fresh[n])

        append = await interleave(ours, raw_append, BATCHES, BATCH)

        later = [message_dict(HISTORY + appended + n) for n in range(appended)]

        async def ours_large(n: int) -> None:
            await session.append(as_message(later[n]))

        async def ours_small(n: int) -> None:  # a session of SMALL messages per batch
            await smalls[n // BATCH].append(as_message(later[n]))

        flat = await interleave(ours_large, ours_small, BATCHES, BATCH)

        heavy, light = await manager.create(), await manager.create()
        for short in (heavy, light):
            await short.append(*(as_message(d) for d in filler[:SMALL]))
        await heavy.state.update({"notes": os.urandom(HEAD_STATE // 2).hex()})

        async def ours_heavy(n: int) -> None:
            await heavy.append(as_message(later[n]))

        async def ours_light(n: int) -> None:
            await light.append(as_message(later[n]))

        head_size = await interleave(ours_heavy, ours_light, BATCHES // 2, BATCH)
        for small in [*smalls, heavy, light]:  # only the measured session stays for bytes
            await small.delete()
        await raw.fill("s1", later)  # the raw table holds the same messages

        loaded: list[Any] = []

        async def ours_load(n: int) -> None:
            loaded[:] = await session.messages()

        async def raw_load(n: int) -> None:
            loaded[:] = await raw.load("s1")

        load = await interleave(ours_load, raw_load, LOADS, 1)
        assert len(loaded) == HISTORY + 2 * appended
        assert len(await session.messages()) == HISTORY + 2 * appended

        payload = payload_bytes(filler + fresh + later)
        sizes = await table_sizes(conn, schema)
        bytes_raw = sizes["messages"] / payload
        bytes_ours = (sizes["sessions"] + sizes["entries"]) / payload

        concurrent = await writers(manager, raw, schema)
    return {
        "append": append,
        "flat": flat,
        "head_size": head_size,
        "load": load,
        "concurrent": concurrent,
        "bytes": {"ours": bytes_ours, "raw": bytes_raw},
    }


async def table_sizes(conn: Any, schema: str) -> dict[str, int]:
    """Bytes of each table of the schema (heap, TOAST and indexes), after a VACUUM."""
    await conn.execute(
        f'VACUUM "{schema}".sessions, "{schema}".entries, "{schema}".messages'.encode()
    )
    cursor = await conn.execute(
        b"SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c"
        b" JOIN pg_namespace n ON n.oid = c.relnamespace"
        b" WHERE n.nspname = %s AND c.relkind = 'r'",
        (schema,),
    )
    return {name: size for name, size in await cursor.fetchall()}


async def writers(manager: SessionManager, raw: Raw, schema: str) -> Ratios:
    """``WRITERS`` tasks on as many sessions against as many raw writers, each its connection."""
    import psycopg

    sessions: list[Session] = [await manager.create() for _ in range(WRITERS)]
    dicts = [message_dict(n) for n in range(PER_WRITER)]
    conns = [await psycopg.AsyncConnection.connect(URL, autocommit=True) for _ in range(WRITERS)]
    raws = [Raw(conn, schema) for conn in conns]

    async def ours_writer(session: Session) -> None:
        for data in dicts:
            await session.append(as_message(data))

    async def raw_writer(w: int) -> None:
        for data in dicts:
            await raws[w].append(f"w{w}", data)

    async def ours(n: int) -> None:
        await asyncio.gather(*(ours_writer(s) for s in sessions))

    async def raw_round(n: int) -> None:
        await asyncio.gather(*(raw_writer(w) for w in range(WRITERS)))

    try:
        return await interleave(ours, raw_round, ROUNDS, 1)
    finally:
        for conn in conns:
            await conn.close()


async def run() -> dict[str, Any] | None:
    """Every measurement (None, after printing why, if there is no server)."""
    reason = await reachable()
    if reason is not None:
        print(f"postgres benchmark skipped: {reason}")
        return None
    import psycopg

    schema = f"skbench_{uuid.uuid4().hex[:12]}"
    try:
        return await measure(schema)
    finally:
        async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


def report(results: dict[str, Any] | None) -> list[str]:
    """Print the table and the verdicts; return the missed targets."""
    if results is None:
        print("postgres benchmark: no results (skipped)")
        return []
    rows = [
        (f"append at {HISTORY:,}", results["append"]),
        (f"append {HISTORY:,} vs ours at {SMALL}", results["flat"]),
        (f"append, {HEAD_STATE // 1000} KB state vs none", results["head_size"]),
        (f"load {HISTORY + 2 * (BATCHES + 1) * BATCH:,} messages", results["load"]),
        (f"{WRITERS} writers x {PER_WRITER} appends", results["concurrent"]),
    ]
    print(f"{'operation':<28} {'ours ms':>9} {'raw ms':>9} {'ours/raw':>20}")
    for name, r in rows:
        print(f"{name:<28} {r.ours_us / 1e3:>9.3f} {r.raw_us / 1e3:>9.3f} {spread(r):>20}")
    print()
    verdicts = Verdicts()
    verdicts.at_most(
        f"append at {HISTORY:,} vs raw INSERT per txn", results["append"], TARGETS["append"]
    )
    verdicts.at_most(f"append at {HISTORY:,} / at {SMALL} (O(1))", results["flat"], TARGETS["flat"])
    verdicts.at_most(
        f"append, {HEAD_STATE // 1000} KB state / none (O(1))",
        results["head_size"],
        TARGETS["head_size"],
    )
    verdicts.info("load vs SELECT + json.loads", results["load"])
    verdicts.info(f"{WRITERS} writers on {WRITERS} sessions vs raw", results["concurrent"])
    verdicts.info("bytes / payload, ours (sessions + entries)", results["bytes"]["ours"])
    verdicts.info("bytes / payload, raw (messages)", results["bytes"]["raw"])
    return verdicts.missed


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
