"""Appends per second on PostgreSQL against raw psycopg inserts, in one process.

Three patterns, each run through the store and through raw psycopg in the same run:
- 1 writer: one task appending to one session;
- 8 writers, 8 sessions: eight tasks, each appending to a session of its own;
- 8 writers, 1 session: eight tasks appending to the same session
  (``expected_version=None``: the database orders them).

Each pattern runs ``ROUNDS`` times, ours and raw alternating, and the best round of each
counts, so a burst of load from another process on the host does not decide the ratio.

Ours: ``store.append_entries`` of one ~500-byte message with the counters patch a
``Session.append`` sends (one transaction each: the entry and the session head). Raw: the
same JSON payload inserted into a table shaped like ours, one autocommit ``INSERT`` per
message, with seq and parent computed in the client (no head, no ordering, nothing
checked). Both use 8 pooled connections at most. Target: within 2x of raw.

The server comes from ``STATEKEEPER_BENCH_POSTGRES_URL`` (else
``STATEKEEPER_TEST_POSTGRES_URL``, else ``postgresql://postgres@127.0.0.1:5432/test``);
everything is written to a throw-away schema that is dropped at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from statekeeper.core.messages import Message
from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionPatch, SessionRecord, Store

URL = os.environ.get(
    "STATEKEEPER_BENCH_POSTGRES_URL",
    os.environ.get("STATEKEEPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
)
APPENDS = 1_600  # per measurement, split between the writers
ROUNDS = 3  # ours and raw alternate; the best round of each counts (the host is shared)
TARGET = 2.0
PATTERNS = (("1 writer", 1, 1), ("8 writers, 8 sessions", 8, 8), ("8 writers, 1 session", 8, 1))
"""(name, writers, sessions)"""
TEXT = (
    "The customer asked about order {n}: it left the depot on Tuesday, the carrier "
    "expects delivery on Thursday, and a replacement can be sent once the carrier "
    "confirms the parcel is lost. They also asked whether the confirmation e-mail goes "
    "to the address on the order, which it does. "
)


def message(n: int) -> Message:
    """A realistic chat message of about 500 bytes of JSON."""
    return Message(role="user" if n % 2 == 0 else "assistant", content=TEXT.format(n=n))


async def reachable() -> str | None:
    """None if the server answers, else why not."""
    parts = urlsplit(URL)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
    except (OSError, TimeoutError) as exc:
        return f"no PostgreSQL server at {host}:{port} ({exc.__class__.__name__})"
    writer.close()
    await writer.wait_closed()
    return None


async def timed(writers: int, work: Callable[[int], Awaitable[None]]) -> float:
    """Appends per second of ``writers`` tasks each running ``work(writer)``."""
    start = time.perf_counter()
    await asyncio.gather(*(work(w) for w in range(writers)))
    return APPENDS / (time.perf_counter() - start)


async def ours(store: Store, writers: int, sessions: int, tag: str) -> float:
    """Appends per second through the store."""
    ids = [f"{tag}-{s}" for s in range(sessions)]
    for session_id in ids:
        await store.create_session(SessionRecord(id=session_id, tenant="bench"))
    per_writer = APPENDS // writers
    # Built before the clock starts, as raw's JSON texts are.
    patch = SessionPatch(add={"total_tokens": 120, "fresh_tokens": 120, "message_count": 1})
    drafts = [
        [
            EntryDraft(id=m.id, payload=m.to_dict(), created_at=m.created_at)
            for m in (message(w * per_writer + i) for i in range(per_writer))
        ]
        for w in range(writers)
    ]

    async def work(w: int) -> None:
        for draft in drafts[w]:
            await store.append_entries("bench", ids[w % sessions], [draft], patch=patch)

    return await timed(writers, work)


async def raw(pool: Any, schema: str, writers: int, sessions: int, base: int) -> float:
    """Appends per second of plain inserts of the same payloads."""
    per_writer = APPENDS // writers
    texts = [
        [json.dumps(message(w * per_writer + i).to_dict()) for i in range(per_writer)]
        for w in range(writers)
    ]
    sql = (
        f'INSERT INTO "{schema}".raw (session_sk, seq, id, parent_seq, kind, created_at, payload)'
        " VALUES (%s, %s, %s, %s, 'message', now(), %s)"
    ).encode()

    async def work(w: int) -> None:
        session = base + w % sessions
        writers_here = writers // sessions
        async with pool.connection() as conn:
            for i, text in enumerate(texts[w]):
                # Seqs interleave between the writers of a session, as ours would.
                seq = i * writers_here + w // sessions + 1
                await conn.execute(sql, (session, seq, uuid.uuid4().hex, seq - 1 or None, text))

    return await timed(writers, work)


async def run() -> list[tuple[str, dict[str, float]]]:
    """Every measurement (an empty list, after printing why, if there is no server)."""
    reason = await reachable()
    if reason is not None:
        print(f"postgres benchmark skipped: {reason}")
        return []
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    schema = f"skbench_{uuid.uuid4().hex[:12]}"
    store = await open_store(URL, schema=schema, min_size=8, max_size=8)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        URL, min_size=8, max_size=8, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    results = []
    try:
        async with pool.connection() as conn:
            await conn.execute(
                f'CREATE TABLE "{schema}".raw (LIKE "{schema}".entries INCLUDING ALL)'.encode()
            )
        await ours(store, 1, 1, "warm-up")
        await raw(pool, schema, 1, 1, 1)
        for n, (name, writers, sessions) in enumerate(PATTERNS):
            best = {"ours": 0.0, "raw": 0.0}
            for r in range(ROUNDS):
                tag = f"p{n}r{r}"
                best["ours"] = max(best["ours"], await ours(store, writers, sessions, tag))
                base = 1000 * (n + 1) + 10 * r
                best["raw"] = max(best["raw"], await raw(pool, schema, writers, sessions, base))
            results.append((name, best))
    finally:
        await store.close()
        await pool.close()
        async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())
    return results


def report(results: list[tuple[str, dict[str, float]]]) -> list[str]:
    """Print the table and the verdicts; return the failed targets."""
    if not results:
        print("postgres benchmark: no results (skipped)")
        return []
    print(f"{'pattern':<24} {'ours/s':>9} {'raw/s':>9} {'raw/ours':>9}")
    failed = []
    for name, row in results:
        ratio = row["raw"] / row["ours"]
        verdict = "ok" if ratio <= TARGET else "MISSED"
        print(
            f"{name:<24} {row['ours']:>9.0f} {row['raw']:>9.0f} {ratio:>9.2f}"
            f"  (target <= {TARGET})  {verdict}"
        )
        if ratio > TARGET:
            failed.append(f"postgres {name}: appends vs raw")
    return failed


def main() -> None:
    """Run and report."""
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
