"""What reaches the disk or the server: with a keyring, none of a tenant's text is in the
raw rows of any backend (read directly: the SQLite file and its WAL, the files, the
PostgreSQL tables, the Redis keys); without one, the same text is there (so the check
can fail)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from statekeeper.core.messages import Message
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunStore
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import EventDraft
from statekeeper.stores.sealed import Keyring
from statekeeper.testing.schemes import (
    POSTGRES_URL,
    REDIS_URL,
    delete_prefix,
    drop_schema,
    skip_unless_reachable,
)

SECRET = "zebra-7741-quartz"
"""Text that appears in every kind of row written, and nowhere else."""
CLEAR = "clear-customer-42"
"""A metadata value under a key declared clear: listings filter on it."""


async def write_everything(store: Store) -> None:
    """A session (title, metadata, state, delivery), messages, a run checkpoint, a record,
    events: each carries SECRET."""
    sessions = SessionManager(store, "tenant-a")
    session = await sessions.create(
        title=f"about {SECRET}", metadata={"customer": CLEAR, "note": SECRET}
    )
    await session.append(Message.user(f"my code is {SECRET}"), Message.assistant(f"noted {SECRET}"))
    await store.update_session(
        "tenant-a", session.id, _patch(state={"memo": SECRET}, delivery={"sender": SECRET})
    )
    runs = RunStore(store, "tenant-a")
    state = RunState(tenant="tenant-a", session_id=session.id, agent="a", context={"s": SECRET})
    version = await runs.create(state)
    await runs.save(state, index_version=version)
    await store.put_record("tenant-a", "profiles", "alice", {"card": SECRET})
    await store.append_events(
        "tenant-a", "log-1", [EventDraft(stream="tool", kind="result", payload={"o": SECRET})]
    )


def _patch(**fields: object) -> object:
    from statekeeper.stores.base import SessionPatch

    return SessionPatch(set=fields)


# -- raw readers -------------------------------------------------------------------------


def raw_files(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


async def raw_postgres(schema: str) -> bytes:
    import psycopg
    from psycopg import sql

    out = []
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        tables = await conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        )
        for (table,) in await tables.fetchall():
            query = sql.SQL("SELECT t::text FROM {}.{} t").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            out += [row[0] for row in await (await conn.execute(query)).fetchall()]
    return "\n".join(out).encode()


async def raw_redis(prefix: str) -> bytes:
    from redis.asyncio import Redis

    client = Redis.from_url(REDIS_URL)
    out: list[bytes] = []
    try:
        async for key in client.scan_iter(match=f"{prefix}/*"):
            out.append(key)
            out.append(repr(await read_redis_key(client, key)).encode())
    finally:
        await client.aclose()
    return b"\n".join(out)


async def read_redis_key(client: Any, key: bytes) -> Any:
    """The value of a key, read by its type (DUMP may compress it)."""
    kind = (await client.type(key)).decode()
    readers = {
        "string": lambda: client.get(key),
        "hash": lambda: client.hgetall(key),
        "list": lambda: client.lrange(key, 0, -1),
        "set": lambda: client.smembers(key),
        "zset": lambda: client.zrange(key, 0, -1),
        "stream": lambda: client.xrange(key),
    }
    return await readers[kind]()


BACKENDS = ["sqlite", "files", "postgres", "redis"]


async def raw_after_writing(backend: str, tmp_path: Path, **options: object) -> bytes:
    unique = f"sk{uuid.uuid4().hex[:16]}"
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/state.db"
    elif backend == "files":
        url = f"files:///{tmp_path}/root"
    elif backend == "postgres":
        await skip_unless_reachable()
        url = f"{POSTGRES_URL}?schema={unique}"
    else:
        url = f"{REDIS_URL}?prefix={unique}"
    try:
        async with open_store(url, **options) as store:
            await write_everything(store)
        if backend in ("sqlite", "files"):
            return raw_files(tmp_path)
        if backend == "postgres":
            return await raw_postgres(unique)
        return await raw_redis(unique)
    finally:
        if backend == "postgres":
            await drop_schema(unique)
        elif backend == "redis":
            await delete_prefix(REDIS_URL, unique)


@pytest.fixture
def keyring() -> Keyring:
    return Keyring({"k1": Keyring.new_key()})


@pytest.mark.parametrize("backend", BACKENDS)
async def test_no_plaintext_at_rest_with_a_keyring(
    backend: str, tmp_path: Path, keyring: Keyring
) -> None:
    raw = await raw_after_writing(backend, tmp_path, keyring=keyring, clear_metadata=["customer"])
    assert SECRET.encode() not in raw
    assert CLEAR.encode() in raw  # declared clear: stays filterable


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_same_rows_hold_plaintext_without_one(backend: str, tmp_path: Path) -> None:
    raw = await raw_after_writing(backend, tmp_path)
    assert SECRET.encode() in raw


async def test_everything_reads_back(tmp_path: Path, keyring: Keyring) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    async with open_store(url, keyring=keyring, clear_metadata=["customer"]) as store:
        await write_everything(store)
        [record] = (
            await SessionManager(store, "tenant-a").list(metadata={"customer": CLEAR})
        ).items
        assert record.title == f"about {SECRET}"
        assert record.metadata == {"customer": CLEAR, "note": SECRET}
        assert record.state == {"memo": SECRET}
        assert record.delivery is not None
        assert record.delivery.sender == SECRET
        session = await SessionManager(store, "tenant-a").get(record.id)
        texts = [m.text for m in await session.messages()]
        assert texts == [f"my code is {SECRET}", f"noted {SECRET}"]
        loaded, _, _ = await RunStore(store, "tenant-a").load(
            (await RunStore(store, "tenant-a").list())[0].run_id
        )
        assert loaded.context == {"s": SECRET}
        assert (await store.get_record("tenant-a", "profiles", "alice")).value == {"card": SECRET}
        [event] = await store.read_events("tenant-a", "log-1")
        assert event.payload == {"o": SECRET}
