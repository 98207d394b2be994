"""The PostgreSQL store (``postgresql://user@host:5432/dbname?schema=statekeeper``).

psycopg 3 (async) over a psycopg_pool `AsyncConnectionPool`; or a caller's pool or single
connection (`PostgresStore.open`). Tables live in one PostgreSQL schema (option
``schema``), created and migrated on open; a schema written by a newer statekeeper is
refused with `SchemaVersionError` and left untouched.

The store is assembled from parts, each in its own module: connections, transactions,
retries and migrations (``conn``), session heads and transcripts on the shared append
engine, where ordering and compare-and-set live (``transcripts``), records and event logs
(``records``), and the schema and its statements (``schema``).
This module opens stores and holds the session operations. Nothing is ordered behind a
client-side lock: row locks and version checks in the database do it.

Payloads are stored as JSON text, so big integers, -0.0 and key order come back exactly.
Errors are translated at the boundary (`conn.translate`); serialization
failures are retried; a lost connection is retried when the operation had not reached
its commit, or is idempotent (reads, appends, whose retry finds its own entries).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from statekeeper.errors import (
    AlreadyExistsError,
    InvalidInputError,
    StoreCorruptError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES
from statekeeper.stores.base import (
    Durability,
    Page,
    SessionQuery,
    SessionRecord,
)
from statekeeper.stores.options import StoreOptions
from statekeeper.stores.postgres.conn import (
    AsyncConnectionPool,
    Connection,
    ConnectionSource,
    PoolSource,
    SingleConnectionSource,
    describe,
    parse_location,
    psycopg,
    translate,
)
from statekeeper.stores.postgres.records import PostgresRecordsAndEvents
from statekeeper.stores.postgres.schema import (
    COUNTERS,
    DEFAULT_SCHEMA,
    Statements,
    metadata_tokens,
    validate_channel,
)
from statekeeper.stores.postgres.transcripts import PostgresTranscripts, stored_head
from statekeeper.stores.rules import (
    check_tenant_and_id,
    decode_cursor,
    new_session_record,
    page_of,
    session_not_found,
)

__all__ = ["PostgresStore", "open_postgres"]


class PostgresStore(PostgresTranscripts, PostgresRecordsAndEvents):
    """A store in a PostgreSQL schema. Open with `open_postgres`, `from_url` or `open`."""

    # -- opening and closing ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        conn_or_pool: Connection | AsyncConnectionPool[Any],
        *,
        schema: str = DEFAULT_SCHEMA,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        pool_timeout: float = 30.0,
        notify_channel: str | None = None,
    ) -> PostgresStore:
        """A store over a caller's connection or pool (both left open by `close`).

        Creates or migrates the schema first. A single connection serves one operation at
        a time; a pool serves as many as it has connections.
        """
        if isinstance(conn_or_pool, AsyncConnectionPool):
            source: ConnectionSource = PoolSource(conn_or_pool, owned=False, timeout=pool_timeout)
            conninfo = conn_or_pool.conninfo
            url = describe(conninfo if isinstance(conninfo, str) else "")
        else:
            source = SingleConnectionSource(conn_or_pool)
            url = describe(conn_or_pool.info.dsn)
        store = cls(source, schema=schema, max_payload_bytes=max_payload_bytes, url=url)
        if notify_channel is not None:
            store.notify_channel = validate_channel(notify_channel)
        await store.migrate()
        store._home = asyncio.get_running_loop()
        return store

    @classmethod
    async def from_url(cls, url: str, **options: Any) -> PostgresStore:
        """Open ``postgresql://...`` with its own pool; ``options`` override the query."""
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise InvalidInputError(f"not a PostgreSQL URL: {parts.scheme}://...")
        query = dict(parse_qsl(parts.query))
        query.update({k: str(v) for k, v in options.items()})
        return await _open_owned(
            unquote(parts.netloc + parts.path), StoreOptions(parts.scheme, query)
        )

    # -- sessions --------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        record = new_session_record(record, self.max_payload_bytes)
        params = (
            record.tenant,
            record.id,
            record.agent_id,
            record.last_active,
            record.created_at,
            record.version,
            metadata_tokens(record.metadata),
            record.model_dump_json(),
            *(getattr(record, name) for name in COUNTERS),
        )

        async def create(conn: Connection) -> int:
            cur = await conn.execute(self._q.create_session, params)
            row = await cur.fetchone()
            if row is None:
                raise AlreadyExistsError(f"session {record.id!r} already exists")
            return int(row[0])

        self._engine.remember(record.tenant, await self._write(create), record)
        return record

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)

        async def get(conn: Connection) -> tuple[int, SessionRecord]:
            return await self._head(conn, tenant, session_id, lock=False)

        sk, record = await self._run(get, idempotent=True)
        self._engine.remember(tenant, sk, record)
        return record

    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        validate_id(tenant, "tenant")
        where = ["tenant = %s"]
        params: list[Any] = [tenant]
        if query.agent_id is not None:
            where.append("agent_id = %s")
            params.append(query.agent_id)
        if query.active_after is not None:
            where.append("last_active > %s")
            params.append(query.active_after)
        if query.active_before is not None:
            where.append("last_active < %s")
            params.append(query.active_before)
        if query.metadata:
            where.append("meta @> %s::text[]")
            params.append(metadata_tokens(query.metadata))
        if query.cursor is not None:
            stamp, after_id = decode_cursor(query.cursor)
            where.append("(last_active, id) < (%s, %s)")
            params += [stamp, after_id]
        sql = (
            self._q.list_sessions
            + " AND ".join(where)
            + " ORDER BY last_active DESC, id DESC LIMIT %s OFFSET %s"
        ).encode()
        params += [query.limit + 1, query.offset]

        rows: list[tuple[datetime, str, str | SessionRecord]] = []
        for active, sid, doc, *columns in await self._select(sql, params):
            if len(rows) == query.limit:  # the row past the page: only its position counts
                rows.append((active, sid, doc))
                break
            try:
                rows.append((active, sid, stored_head(tenant, sid, doc, columns, self.url)))
            except StoreCorruptError:
                rows.append((active, sid, doc))  # page_of reports it
        return page_of(rows, tenant, query.limit, self.url)

    async def delete_session(self, tenant: str, session_id: str) -> None:
        check_tenant_and_id(tenant, session_id)

        async def delete(conn: Connection) -> None:
            # Two statements: the second sees entries a writer committed while this one
            # waited for the session's row lock.
            cur = await conn.execute(self._q.delete_session, (tenant, session_id))
            row = await cur.fetchone()
            if row is None:
                raise session_not_found(session_id)
            await conn.execute(self._q.delete_entries, (row[0],))

        self._engine.forget(tenant, session_id)
        await self._write(delete, tx=True)
        self._engine.forget(tenant, session_id)


async def _open_owned(location: str, options: StoreOptions) -> PostgresStore:
    """A store with its own pool, from a URL's location and query options."""
    schema = options.take("schema", str, DEFAULT_SCHEMA)
    min_size = options.take("min_size", int, 1)
    max_size = options.take("max_size", int, 10)
    limit = options.max_payload_bytes()
    timeout = options.take("timeout", float, 30.0)
    connect_timeout = options.take("connect_timeout", int, 10)
    durability = options.durability()
    sslmode = options.optional("sslmode")
    libpq = {"sslmode": sslmode} if sslmode is not None else {}
    channel = options.optional("notify_channel")
    if channel is not None:
        validate_channel(channel)
    options.done()
    if not 0 <= min_size <= max_size or max_size < 1:
        raise InvalidInputError(
            f"need 0 <= min_size <= max_size and max_size >= 1, got {min_size} and {max_size}"
        )
    if timeout <= 0 or connect_timeout < 0:
        raise InvalidInputError("timeout must be > 0 and connect_timeout >= 0 (seconds)")
    statements = Statements(schema)  # validates the name before anything connects
    conninfo, url = parse_location(location, {"connect_timeout": str(connect_timeout), **libpq})
    # The server's default commit survives a power loss; "process" lets the server
    # acknowledge before its WAL reaches the disk (a server crash may lose the last
    # commits, never corrupt).
    settings = "-c TimeZone=UTC"
    if durability is Durability.PROCESS:
        settings += " -c synchronous_commit=off"
    try:
        # One direct connection first: a wrong address or password fails now, clearly,
        # instead of as a pool timeout later.
        first = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, options=settings)
    except psycopg.Error as exc:
        raise translate(exc, f"cannot connect to {url}") from exc
    try:
        await PostgresStore(
            SingleConnectionSource(first), schema=statements.schema, url=url
        ).migrate()
    finally:
        await first.close()

    def make() -> AsyncConnectionPool[Any]:
        return AsyncConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True, "options": settings},
            open=False,
            timeout=timeout,
            name=f"statekeeper:{schema}",
        )

    pool = make()
    await pool.open(wait=False)
    source = PoolSource(pool, owned=True, timeout=timeout, make=make)
    source.watch()
    store = PostgresStore(
        source,
        schema=schema,
        max_payload_bytes=limit,
        url=url,
    )
    store.notify_channel = channel
    store._home = asyncio.get_running_loop()
    return store


async def open_postgres(location: str, options: StoreOptions) -> PostgresStore:
    """``postgresql://user@host:5432/dbname?schema=...`` (the opener `open_store` uses).

    Options: ``schema`` (default ``statekeeper``), ``min_size`` / ``max_size`` (pool
    connections, 1 / 10), ``max_payload_bytes``, ``timeout`` (seconds to wait for a pooled
    connection, 30), ``connect_timeout`` (10), ``sslmode``, ``durability``
    (``power`` or ``process``: ``synchronous_commit=off``), ``notify_channel`` (a NOTIFY
    on this channel for every event append, for `coordination.PgEventFeed`).
    """
    return await _open_owned(location, options)
