"""PostgreSQL store: racing writers, killed connections, newer schemas, exact JSON,
options and connection sources.

Runs against ``STATEKEEPER_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``); skipped when no server answers, failed
instead under ``CI=true`` (see ``require_service``). Every test works in a schema of
its own, dropped at the end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from statekeeper import retry_on_conflict
from statekeeper.core.messages import Message
from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    MissingExtraError,
    SchemaVersionError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionPatch, SessionQuery, SessionRecord
from statekeeper.stores.postgres import PostgresStore
from statekeeper.stores.postgres.conn import parse_location, retryable, translate
from statekeeper.stores.postgres.schema import MIGRATIONS, SCHEMA_VERSION, Statements
from statekeeper.testing.schemes import POSTGRES_URL, drop_schema, skip_unless_reachable

psycopg = pytest.importorskip("psycopg")

TENANT = "t"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    """A fresh schema name, dropped after the test."""
    await skip_unless_reachable()
    name = f"sktest_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        await drop_schema(name)


@pytest.fixture
async def store(schema: str) -> AsyncIterator[PostgresStore]:
    opened = await PostgresStore.from_url(POSTGRES_URL, schema=schema)
    try:
        yield opened
    finally:
        await opened.close()


async def admin() -> Any:
    """A plain autocommit connection to the test server."""
    return await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)


def draft(entry_id: str, **payload: Any) -> EntryDraft:
    return EntryDraft(id=entry_id, payload={"text": entry_id, **payload})


# -- racing writers ---------------------------------------------------------------------


async def test_two_writers_on_one_head_one_wins_and_the_other_conflicts(
    store: PostgresStore, schema: str
) -> None:
    other = await PostgresStore.from_url(POSTGRES_URL, schema=schema)
    try:
        created = await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        await other.get_session(TENANT, "s1")  # both have the head cached
        for round_number in range(5):
            version = (await store.get_session(TENANT, "s1")).version
            outcomes = await asyncio.gather(
                store.append_entries(
                    TENANT, "s1", [draft(f"a{round_number}")], expected_version=version
                ),
                other.append_entries(
                    TENANT, "s1", [draft(f"b{round_number}")], expected_version=version
                ),
                return_exceptions=True,
            )
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            assert len(errors) == 1, outcomes
            assert isinstance(errors[0], ConflictError)
        entries = await other.read_entries(TENANT, "s1")
        assert [(e.seq, e.parent_seq) for e in entries] == [
            (1, None),
            (2, 1),
            (3, 2),
            (4, 3),
            (5, 4),
        ]
        assert (await store.get_session(TENANT, "s1")).version == created.version + 5
    finally:
        await other.close()


async def test_the_losing_writer_succeeds_with_retry_on_conflict(
    store: PostgresStore, schema: str
) -> None:
    other = await PostgresStore.from_url(POSTGRES_URL, schema=schema)
    try:
        chat_a = await SessionManager(store, TENANT).create(session_id="s1")
        chat_b = await SessionManager(other, TENANT).get("s1")
        outcomes = await asyncio.gather(
            chat_a.append(Message.user("from a")),
            chat_b.append(Message.user("from b")),
            return_exceptions=True,
        )
        losers = [i for i, o in enumerate(outcomes) if isinstance(o, ConflictError)]
        assert len(losers) == 1, outcomes
        loser = (chat_a, chat_b)[losers[0]]
        retried = Message.user("retried")
        await retry_on_conflict(lambda: loser.append(retried), before_retry=loser.refresh)
        texts = [m.text for m in await chat_a.messages()]
        assert len(texts) == 2
        assert texts[-1] == "retried"
    finally:
        await other.close()


# -- killed connections ------------------------------------------------------------------


async def blocked_backend(conn: Any, blocker_pid: int) -> int:
    """The pid of the backend waiting for a lock ``blocker_pid`` holds."""
    for _ in range(200):
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            (blocker_pid,),
        )
        row = await cur.fetchone()
        if row is not None:
            return int(row[0])
        await asyncio.sleep(0.025)
    raise AssertionError("the store's operation never waited for the lock")


async def kill_while_blocked(schema: str, lock_sql: str, params: tuple[Any, ...], call: Any) -> Any:
    """Run ``call`` while a row it needs is locked, kill its backend, then unlock.

    Returns what the call returned, or the exception it raised.
    """
    blocker = await psycopg.AsyncConnection.connect(POSTGRES_URL)
    watcher = await admin()
    try:
        await blocker.execute(lock_sql.replace("{s}", f'"{schema}"'), params)  # opens a tx
        task = asyncio.ensure_future(call())
        pid = await blocked_backend(watcher, blocker.info.backend_pid)
        await watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
        await asyncio.sleep(0.2)  # the store sees its connection die while still blocked
        await blocker.rollback()
        try:
            return await asyncio.wait_for(task, 30)
        except Exception as exc:
            return exc
    finally:
        await blocker.close()
        await watcher.close()


LOCK_SESSION = "SELECT 1 FROM {s}.sessions WHERE tenant = %s AND id = %s FOR UPDATE"


async def test_an_append_whose_connection_is_killed_is_retried_once_and_whole(
    store: PostgresStore, schema: str
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    await store.append_entries(TENANT, "s1", [draft("e0")])
    outcome = await kill_while_blocked(
        schema,
        LOCK_SESSION,
        (TENANT, "s1"),
        lambda: store.append_entries(TENANT, "s1", [draft("e1"), draft("e2"), draft("e3")]),
    )
    entries = await store.read_entries(TENANT, "s1")
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, StoreUnavailableError), outcome
        assert [e.id for e in entries] == ["e0"]
    else:
        assert [e.id for e in entries] == ["e0", "e1", "e2", "e3"]
        assert [e.seq for e in outcome.entries] == [2, 3, 4]
    after = await store.append_entries(TENANT, "s1", [draft("e4")])
    assert after.entries[0].seq == entries[-1].seq + 1


async def test_a_cancelled_append_returns_only_when_its_write_has_ended(
    store: PostgresStore, schema: str
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    await store.append_entries(TENANT, "s1", [draft("e0")])
    blocker = await psycopg.AsyncConnection.connect(POSTGRES_URL)
    watcher = await admin()
    try:
        await blocker.execute(LOCK_SESSION.replace("{s}", f'"{schema}"'), (TENANT, "s1"))
        task = asyncio.ensure_future(store.append_entries(TENANT, "s1", [draft("e1")]))
        await blocked_backend(watcher, blocker.info.backend_pid)
        task.cancel()
        # Its statement waits for the row lock: the cancelled caller waits with it.
        finished, _ = await asyncio.wait([task], timeout=0.2)
        assert not finished
        await blocker.rollback()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await blocker.close()
        await watcher.close()
    # The write was not cut off half-way: it landed whole, and the next append follows it.
    assert [e.id for e in await store.read_entries(TENANT, "s1")] == ["e0", "e1"]
    after = await store.append_entries(TENANT, "s1", [draft("e2")])
    assert after.entries[0].seq == 3
    assert not store._tasks


async def test_a_transaction_killed_after_its_first_write_leaves_nothing_behind(
    store: PostgresStore, schema: str
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2")])
    # delete_session deletes the session row, then waits on the locked entry.
    outcome = await kill_while_blocked(
        schema,
        "SELECT 1 FROM {s}.entries WHERE id = %s FOR UPDATE",
        ("e2",),
        lambda: store.delete_session(TENANT, "s1"),
    )
    conn = await admin()
    try:
        cur = await conn.execute(f'SELECT count(*) FROM "{schema}".sessions')
        sessions = (await cur.fetchone())[0]
        cur = await conn.execute(f'SELECT count(*) FROM "{schema}".entries')
        entries = (await cur.fetchone())[0]
    finally:
        await conn.close()
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, StoreUnavailableError), outcome
        assert (sessions, entries) == (1, 2)
    else:
        assert (sessions, entries) == (0, 0)  # retried as a whole: nothing was committed
    await store.create_session(SessionRecord(id="s2", tenant=TENANT))


async def test_a_write_of_unknown_outcome_is_reported_not_repeated(
    store: PostgresStore, schema: str
) -> None:
    await store.put_record(TENANT, "ns", "k", {"n": 1})
    # A lone statement is its own commit: killed mid-way, it may or may not have
    # committed, so it is reported (not retried, which could apply it twice).
    outcome = await kill_while_blocked(
        schema,
        "SELECT 1 FROM {s}.records WHERE key = %s FOR UPDATE",
        ("k",),
        lambda: store.put_record(TENANT, "ns", "k", {"n": 2}, expected_version=1),
    )
    assert isinstance(outcome, StoreUnavailableError), outcome
    assert "password" not in str(outcome)
    record = await store.get_record(TENANT, "ns", "k")
    assert (record.value, record.version) == ({"n": 1}, 1)
    assert (await store.put_record(TENANT, "ns", "k", {"n": 3}, expected_version=1)).version == 2


async def test_connections_closed_by_the_server_while_idle_are_replaced(
    schema: str,
) -> None:
    store = await PostgresStore.from_url(POSTGRES_URL, schema=schema, min_size=3, max_size=3)
    try:
        await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        await asyncio.gather(*(store.get_session(TENANT, "s1") for _ in range(6)))
        conn = await admin()
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = '' AND pid <> pg_backend_pid() "
                "AND datname = current_database() AND query LIKE %s",
                (f'%"{schema}"%',),
            )
        finally:
            await conn.close()
        await asyncio.sleep(0.2)
        # Not a read (always safe to retry): a write, which must not be sent on a dead one.
        await store.create_session(SessionRecord(id="s2", tenant=TENANT))
        await store.update_session(TENANT, "s1", SessionPatch(set={"title": "after"}))
        assert (await store.get_session(TENANT, "s1")).title == "after"
    finally:
        await store.close()


# -- schema versions ---------------------------------------------------------------------


async def test_a_newer_schema_is_refused_and_left_alone(store: PostgresStore, schema: str) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    await store.close()
    conn = await admin()
    try:
        await conn.execute(
            f'INSERT INTO "{schema}".schema_migrations (version, summary) VALUES (%s, %s)',
            (SCHEMA_VERSION + 1, "from the future"),
        )
        with pytest.raises(SchemaVersionError, match="upgrade statekeeper"):
            await open_store(POSTGRES_URL, schema=schema)
        cur = await conn.execute(f'SELECT max(version) FROM "{schema}".schema_migrations')
        assert (await cur.fetchone())[0] == SCHEMA_VERSION + 1
        cur = await conn.execute(f'SELECT count(*) FROM "{schema}".sessions')
        assert (await cur.fetchone())[0] == 1
    finally:
        await conn.close()


async def test_migrations_are_recorded_and_reopening_keeps_data(
    store: PostgresStore, schema: str
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    again = await open_store(POSTGRES_URL, schema=schema)
    try:
        assert (await again.get_session(TENANT, "s1")).id == "s1"
    finally:
        await again.close()
    conn = await admin()
    try:
        cur = await conn.execute(f'SELECT version, summary FROM "{schema}".schema_migrations')
        rows = await cur.fetchall()
    finally:
        await conn.close()
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    assert all(r[1] for r in rows)


async def test_heads_written_before_the_counter_columns_read_whole_and_append_on(
    schema: str,
) -> None:
    # A schema at version 1, with a head as statekeeper wrote it then: all in the doc.
    q = Statements(schema)
    old = SessionRecord(
        id="s1", tenant=TENANT, title="old", metadata={"user": "u1"}, head_seq=2, last_seq=2,
        message_count=2, total_tokens=7, fresh_tokens=7, version=3,
    )  # fmt: skip
    conn = await admin()
    try:
        for statement in [q.create_schema, q.create_versions, *q.migration(1)]:
            await conn.execute(statement)
        await conn.execute(q.record_migration, (1, MIGRATIONS[0][0]))
        await conn.execute(
            f'INSERT INTO "{schema}".sessions (tenant, id, last_active, created_at, version,'
            " meta, doc) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (TENANT, "s1", old.last_active, old.created_at, 3, ['["user","su1"]'],
             old.model_dump_json()),
        )  # fmt: skip
        for seq, parent in ((1, None), (2, 1)):
            await conn.execute(
                f'INSERT INTO "{schema}".entries VALUES (1, %s, %s, %s, %s, %s, %s)',
                (seq, f"e{seq}", parent, "message", old.created_at, '{"text": "x"}'),
            )
    finally:
        await conn.close()

    store = await PostgresStore.from_url(POSTGRES_URL, schema=schema)  # migrates
    try:
        assert await store.get_session(TENANT, "s1") == old
        page = await store.list_sessions(TENANT, SessionQuery(metadata={"user": "u1"}))
        assert page.items == [old]
        added = await store.append_entries(
            TENANT, "s1", [draft("e3")], patch=SessionPatch(add={"message_count": 1})
        )
        assert [(e.seq, e.parent_seq) for e in added.entries] == [(3, 2)]
    finally:
        await store.close()
    fresh = await PostgresStore.from_url(POSTGRES_URL, schema=schema)  # nothing cached
    try:
        head = await fresh.get_session(TENANT, "s1")
        assert head == added.session
        assert (head.title, head.last_seq, head.message_count, head.version) == ("old", 3, 3, 4)
    finally:
        await fresh.close()


async def test_an_append_sends_the_counters_and_leaves_the_head_doc_alone(
    store: PostgresStore, schema: str
) -> None:
    async def stored_doc() -> str:
        conn = await admin()
        try:
            cur = await conn.execute(f'SELECT doc FROM "{schema}".sessions WHERE id = %s', ("s1",))
            return str((await cur.fetchone())[0])
        finally:
            await conn.close()

    await store.create_session(SessionRecord(id="s1", tenant=TENANT, state={"big": "x" * 5000}))
    doc = await stored_doc()
    counted = SessionPatch(add={"message_count": 1, "total_tokens": 5})
    for n in range(3):
        last = await store.append_entries(TENANT, "s1", [draft(f"e{n}")], patch=counted)
    assert await stored_doc() == doc  # only the columns moved
    titled = await store.append_entries(
        TENANT, "s1", [draft("e3")], patch=SessionPatch(set={"title": "now"})
    )
    assert await stored_doc() != doc  # a field of the doc changed: the doc is written
    # Set to an equal value of another type: written too (1 == True, but not the same).
    await store.update_session(TENANT, "s1", SessionPatch(set={"metadata": {"n": 1}}))
    await store.append_entries(
        TENANT, "s1", [draft("e4")], patch=SessionPatch(set={"metadata": {"n": True}})
    )
    final = await store.append_entries(TENANT, "s1", [draft("e5")], patch=counted)
    fresh = await PostgresStore.from_url(POSTGRES_URL, schema=schema)
    try:
        head = await fresh.get_session(TENANT, "s1")
        assert head == final.session
        assert (head.title, head.state) == ("now", {"big": "x" * 5000})
        assert head.metadata["n"] is True
        assert (head.message_count, head.total_tokens, head.last_seq) == (4, 20, 6)
        assert head.version == last.session.version + 4 == titled.session.version + 3
        assert (await fresh.list_sessions(TENANT, SessionQuery())).items == [head]
    finally:
        await fresh.close()


async def test_concurrent_first_opens_of_one_schema_all_succeed(schema: str) -> None:
    stores = await asyncio.gather(*(open_store(POSTGRES_URL, schema=schema) for _ in range(4)))
    try:
        await stores[0].create_session(SessionRecord(id="s1", tenant=TENANT))
        assert (await stores[3].get_session(TENANT, "s1")).id == "s1"
    finally:
        for opened in stores:
            await opened.close()


# -- exact JSON ----------------------------------------------------------------------------


async def test_json_keeps_key_order_big_ints_and_negative_zero(store: PostgresStore) -> None:
    payload = {"z": 1, "a": [2**80, -0.0, 0.0, 1.0, 1], "m": {"y": None, "b": "\x00"}}
    metadata = {"second": 2, "first": 1}
    await store.create_session(SessionRecord(id="s1", tenant=TENANT, metadata=metadata))
    await store.append_entries(TENANT, "s1", [EntryDraft(id="e1", payload=payload)])
    await store.put_record(TENANT, "ns", "k", payload)
    for got in (
        (await store.read_entries(TENANT, "s1"))[0].payload,
        (await store.get_record(TENANT, "ns", "k")).value,
    ):
        assert isinstance(got, dict)
        assert list(got) == ["z", "a", "m"]
        assert list(got["m"]) == ["y", "b"]
        assert got["a"] == [2**80, -0.0, 0.0, 1.0, 1]
        assert [type(v) for v in got["a"]] == [int, float, float, float, int]
        assert str(got["a"][1]) == "-0.0"
        assert got["m"]["b"] == "\x00"
    assert list((await store.get_session(TENANT, "s1")).metadata) == ["second", "first"]


# -- opening -------------------------------------------------------------------------------


async def test_unknown_or_bad_options_are_refused(schema: str) -> None:
    with pytest.raises(InvalidInputError, match="unknown postgresql store option"):
        await open_store(POSTGRES_URL, schema=schema, colour="blue")
    for bad in ("Upper", "has-dash", "pg_x", "x" * 64, "1st", ""):
        with pytest.raises(InvalidInputError, match="schema"):
            await open_store(POSTGRES_URL, schema=bad)
    with pytest.raises(InvalidInputError, match="min_size"):
        await open_store(POSTGRES_URL, schema=schema, min_size=5, max_size=2)
    with pytest.raises(InvalidInputError, match="max_size"):
        await open_store(POSTGRES_URL, schema=schema, max_size="many")


async def test_an_unreachable_server_is_unavailable_and_no_password_is_shown() -> None:
    with pytest.raises(StoreUnavailableError) as caught:
        await open_store("postgresql://bob:hunter2@127.0.0.1:1/db", connect_timeout=2)
    assert "hunter2" not in str(caught.value)
    assert "hunter2" not in repr(caught.value)


def test_the_url_shown_never_holds_the_password() -> None:
    conninfo, url = parse_location("bob:p@ss:w/rd@db.example:6543/app", {})
    assert url == "postgresql://bob:***@db.example:6543/app"
    assert "p@ss:w/rd" in conninfo  # given to libpq as a keyword, never in a URL
    assert parse_location("[::1]:5432/x", {})[1] == "postgresql://[::1]:5432/x"
    assert parse_location("/x", {})[1] == "postgresql:///x"


async def test_repr_and_url_hide_the_password(schema: str) -> None:
    await skip_unless_reachable()
    parts = POSTGRES_URL.split("://", 1)[1].split("@", 1)
    user = parts[0].split(":")[0]
    store = await open_store(f"postgresql://{user}:hunter2@{parts[1]}", schema=schema)
    try:
        assert "hunter2" not in store.url
        assert "hunter2" not in repr(store)
        assert ":***@" in store.url
    finally:
        await store.close()


async def test_a_callers_pool_and_connection_can_be_used_and_stay_open(schema: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(POSTGRES_URL, min_size=1, open=False)
    await pool.open(wait=True)
    conn = await psycopg.AsyncConnection.connect(POSTGRES_URL)  # not autocommit
    try:
        on_pool = await PostgresStore.open(pool, schema=schema)
        on_conn = await PostgresStore.open(conn, schema=schema)
        await on_pool.create_session(SessionRecord(id="s1", tenant=TENANT))
        await on_conn.append_entries(TENANT, "s1", [draft("e1")])
        await asyncio.gather(
            *(on_conn.append_entries(TENANT, "s1", [draft(f"c{i}")]) for i in range(5))
        )
        assert len(await on_pool.read_entries(TENANT, "s1")) == 6
        await on_pool.close()
        await on_conn.close()
        assert not conn.closed
        assert not pool.closed
        cur = await conn.execute(f'SELECT count(*) FROM "{schema}".entries')
        assert (await cur.fetchone())[0] == 6
    finally:
        await conn.close()
        await pool.close()


async def test_a_read_only_server_refuses_writes_and_serves_reads(
    store: PostgresStore, schema: str
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    conn = await psycopg.AsyncConnection.connect(
        POSTGRES_URL, autocommit=True, options="-c default_transaction_read_only=on"
    )
    try:
        read_only = await PostgresStore.open(conn, schema=schema)
        assert (await read_only.get_session(TENANT, "s1")).id == "s1"
        with pytest.raises(StoreReadOnlyError):
            await read_only.append_entries(TENANT, "s1", [draft("e1")])
        with pytest.raises(StoreReadOnlyError):
            await read_only.put_record(TENANT, "ns", "k", 1)
        await read_only.close()
    finally:
        await conn.close()


def test_driver_errors_map_to_statekeeper_errors() -> None:
    errors = psycopg.errors
    assert retryable(errors.SerializationFailure())
    assert retryable(errors.DeadlockDetected())
    assert not retryable(errors.UniqueViolation())
    cases = {
        errors.AdminShutdown(): StoreUnavailableError,
        errors.ReadOnlySqlTransaction(): StoreReadOnlyError,
        errors.InsufficientPrivilege(): StoreReadOnlyError,
        psycopg.OperationalError("connection refused"): StoreUnavailableError,
    }
    for exc, kind in cases.items():
        assert type(translate(exc, "here")) is kind, exc
    from statekeeper.errors import StoreFullError

    assert type(translate(errors.DiskFull(), "here")) is StoreFullError


def test_a_missing_psycopg_names_the_extra() -> None:
    code = textwrap.dedent(
        """
        import asyncio, sys
        sys.modules["psycopg"] = None
        from statekeeper.errors import MissingExtraError
        from statekeeper.stores import open_store
        try:
            asyncio.run(open_store("postgresql://localhost/x"))
        except MissingExtraError as exc:
            print("extra:", exc.extra)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "extra: postgres", out.stderr
    assert issubclass(MissingExtraError, ImportError)


# -- appends combined into one statement -------------------------------------------------


async def test_concurrent_appends_of_one_process_keep_their_own_outcomes(
    store: PostgresStore,
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    first = await store.append_entries(TENANT, "s1", [draft("e0")])
    calls = [
        store.append_entries(TENANT, "s1", [draft("a1"), draft("a2")]),
        store.append_entries(TENANT, "s1", [draft("e0")]),  # a retry: replayed
        store.append_entries(TENANT, "s1", [EntryDraft(id="bad", parent=99, payload={})]),
        store.append_entries(
            TENANT, "s1", [draft("old")], expected_version=first.session.version - 1
        ),
        store.append_entries(
            TENANT, "s1", [draft("b1")], patch=SessionPatch(add={"message_count": 1})
        ),
    ]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    ok, replay, bad, stale, last = outcomes
    assert not isinstance(ok, BaseException)
    assert [e.id for e in ok.entries] == ["a1", "a2"]
    assert not isinstance(replay, BaseException)
    assert replay.replayed
    assert [e.id for e in replay.entries] == ["e0"]
    assert isinstance(bad, InvalidInputError)
    assert isinstance(stale, ConflictError)
    assert not isinstance(last, BaseException)
    assert last.session.message_count == 1
    entries = await store.read_entries(TENANT, "s1")
    assert sorted(e.id for e in entries) == ["a1", "a2", "b1", "e0"]
    assert [e.parent_seq for e in entries] == [None, 1, 2, 3]
    assert (await store.get_session(TENANT, "s1")).last_seq == 4

    # Without a replay among them, the queued appends go in one statement, and those
    # refused get the errors they would have got one after the other.
    version = (await store.get_session(TENANT, "s1")).version
    outcomes = await asyncio.gather(
        store.append_entries(TENANT, "s1", [draft("c0")]),
        store.append_entries(TENANT, "s1", [draft("c1")]),
        store.append_entries(TENANT, "s1", [EntryDraft(id="bad2", parent=99, payload={})]),
        store.append_entries(TENANT, "s1", [draft("c2")], expected_version=version),
        store.append_entries(TENANT, "s1", [draft("c3")]),
        return_exceptions=True,
    )
    assert [type(o).__name__ for o in outcomes] == [
        "AppendResult",
        "AppendResult",
        "InvalidInputError",
        "ConflictError",
        "AppendResult",
    ]
    entries = await store.read_entries(TENANT, "s1")
    assert [e.id for e in entries[4:]] == ["c0", "c1", "c3"]
    assert [e.parent_seq for e in entries] == [None, 1, 2, 3, 4, 5, 6]


async def test_process_durability_turns_synchronous_commit_off(schema: str) -> None:
    store = await PostgresStore.from_url(POSTGRES_URL, schema=schema, durability="process")
    try:
        source = store._source
        assert source is not None
        conn = await source.acquire()
        try:
            cur = await conn.execute("SHOW synchronous_commit")
            assert (await cur.fetchone())[0] == "off"
        finally:
            await source.release(conn)
    finally:
        await store.close()
