"""The PostgreSQL store (``postgresql://user@host:5432/dbname?schema=statekeeper``).

psycopg 3 (async) over a psycopg_pool `AsyncConnectionPool`; or a caller's pool or single
connection (`PostgresStore.open`). Tables live in one PostgreSQL schema (option
``schema``), created and migrated on open; a schema written by a newer statekeeper is
refused with `SchemaVersionError` and left untouched.

Ordering and compare-and-set happen in the database, never behind a client-side lock:

- an append is one statement that moves the session row from the version the store last
  saw to the next one *and* inserts the entries (``WITH head AS (UPDATE ... WHERE sk = ..
  AND version = ..) INSERT ...``): the row lock orders writers of a session, and the
  version check refuses a stale head, so both happen or neither does;
- when the store has not seen the current head (another process wrote, a reused id ...),
  the careful path locks the row (``SELECT ... FOR UPDATE``) in a transaction, decides
  with the shared rules (`plan_append`) and writes;
- event numbers come from a per-log row updated in the same statement as the insert.

Payloads are stored as JSON text, so big integers, -0.0 and key order come back exactly.
Errors are translated at the boundary (`postgres_conn.translate`); serialization
failures are retried; a lost connection is retried when the operation had not reached
its commit, or is idempotent (reads, appends, whose retry finds its own entries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    AlreadyExistsError,
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    StatekeeperError,
    StoreCorruptError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, gc_paused, loads
from statekeeper.stores.base import (
    AppendPlan,
    AppendResult,
    Durability,
    Entry,
    EntryDraft,
    Page,
    SessionPatch,
    SessionQuery,
    SessionRecord,
    Store,
    apply_patch,
    check_tenant_and_id,
    check_version,
    corrupt_entry,
    decode_cursor,
    encode_cursor,
    plan_append,
)
from statekeeper.stores.common import (
    check_limit,
    check_prunable_kind,
    check_session_record,
    new_session_record,
    session_not_found,
)
from statekeeper.stores.opening import _no_more, _take
from statekeeper.stores.postgres_conn import (
    AsyncConnectionPool,
    Careful,
    Connection,
    ConnectionSource,
    PoolSource,
    SingleConnectionSource,
    describe,
    parse_location,
    psycopg,
    translate,
)
from statekeeper.stores.postgres_records import KEY_END, PostgresRecordsAndEvents
from statekeeper.stores.postgres_schema import DEFAULT_SCHEMA, Statements, metadata_tokens

__all__ = ["PostgresStore", "open_postgres"]

_HEADS_KEPT = 4096  # cached session heads (a miss costs a locked read of the head)


class PostgresStore(PostgresRecordsAndEvents):
    """A store in a PostgreSQL schema. Open with `open_postgres`, `from_url` or `open`."""

    def __init__(
        self,
        source: ConnectionSource,
        *,
        schema: str = DEFAULT_SCHEMA,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        url: str = "postgresql://",
    ) -> None:
        super().__init__(source, schema=schema, max_payload_bytes=max_payload_bytes, url=url)
        # (tenant, id) -> (sk, record) of heads this store last read or committed.
        self._heads: dict[tuple[str, str], tuple[int, SessionRecord]] = {}

    # -- opening and closing ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        conn_or_pool: Connection | AsyncConnectionPool[Any],
        *,
        schema: str = DEFAULT_SCHEMA,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        pool_timeout: float = 30.0,
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
        await store.migrate()
        return store

    @classmethod
    async def from_url(cls, url: str, **options: Any) -> PostgresStore:
        """Open ``postgresql://...`` with its own pool; ``options`` override the query."""
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise InvalidInputError(f"not a PostgreSQL URL: {parts.scheme}://...")
        query = dict(parse_qsl(parts.query))
        query.update({k: str(v) for k, v in options.items()})
        return await _open_owned(unquote(parts.netloc + parts.path), query)

    async def close(self) -> None:
        """Close the pool or connection the store opened (a caller's stays open)."""
        self._heads.clear()
        await super().close()

    def _remember(self, tenant: str, sk: int, record: SessionRecord) -> None:
        key = (tenant, record.id)
        known = self._heads.get(key)
        if known is not None and known[0] == sk and known[1].version > record.version:
            return  # a later write of this process already landed
        if known is None and len(self._heads) >= _HEADS_KEPT:
            del self._heads[next(iter(self._heads))]
        self._heads[key] = (sk, record)

    async def _head(
        self, conn: Connection, tenant: str, session_id: str, *, lock: bool
    ) -> tuple[int, SessionRecord]:
        """The stored head; the doc crosses the wire only if the cached copy is stale."""
        cached = self._heads.get((tenant, session_id))
        known = (cached[0], cached[1].version) if cached else (0, 0)
        cur = await conn.execute(
            self._q.lock_head if lock else self._q.get_head, (*known, tenant, session_id)
        )
        row = await cur.fetchone()
        if row is None:
            raise session_not_found(session_id)
        sk, _, doc = row
        if doc is None and cached is not None:
            return cached
        try:
            return sk, SessionRecord.model_validate_json(doc)
        except ValueError as exc:
            raise StoreCorruptError(
                f"the record of session {session_id!r} in {self.url} cannot be decoded: {exc}"
            ) from exc

    def _head_params(self, record: SessionRecord, *, metadata_changed: bool) -> tuple[Any, ...]:
        doc = record.model_dump_json()
        if len(doc) > self.max_payload_bytes:
            raise PayloadTooLargeError(
                f"session {record.id!r} record would be {len(doc)} bytes; "
                f"the limit is {self.max_payload_bytes}"
            )
        meta = metadata_tokens(record.metadata) if metadata_changed else None
        return (record.agent_id, record.last_active, record.version, meta, doc)

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
        )

        async def create(conn: Connection) -> int:
            cur = await conn.execute(self._q.create_session, params)
            row = await cur.fetchone()
            if row is None:
                raise AlreadyExistsError(f"session {record.id!r} already exists")
            return int(row[0])

        self._remember(record.tenant, await self._write(create), record)
        return record

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)

        async def get(conn: Connection) -> tuple[int, SessionRecord]:
            return await self._head(conn, tenant, session_id, lock=False)

        sk, record = await self._run(get, idempotent=True)
        self._remember(tenant, sk, record)
        return record

    async def update_session(
        self,
        tenant: str,
        session_id: str,
        patch: SessionPatch,
        *,
        expected_version: int | None = None,
    ) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)

        def change(record: SessionRecord) -> SessionRecord:
            check_version(record, expected_version)
            updated = apply_patch(record, patch, now=utcnow())
            if patch.set:
                check_session_record(updated, self.max_payload_bytes)
            return updated

        async def save(conn: Connection, sk: int, old: int, new: SessionRecord) -> bool:
            params = self._head_params(new, metadata_changed="metadata" in patch.set)
            cur = await conn.execute(self._q.save_head, (*params, sk, old))
            return cur.rowcount == 1

        async def fast(conn: Connection) -> tuple[int, SessionRecord]:
            cached = self._heads.get((tenant, session_id))
            if cached is None:
                raise Careful
            sk, record = cached
            try:
                updated = change(record)
            except StatekeeperError:
                raise Careful from None  # perhaps only the cached copy is stale
            if not await save(conn, sk, record.version, updated):
                raise Careful
            return sk, updated

        async def careful(conn: Connection) -> tuple[int, SessionRecord]:
            sk, record = await self._head(conn, tenant, session_id, lock=True)
            updated = change(record)
            await save(conn, sk, record.version, updated)
            return sk, updated

        try:
            sk, updated = await self._write(fast)
        except Careful:
            try:
                sk, updated = await self._write(careful, tx=True)
            except StatekeeperError:
                self._heads.pop((tenant, session_id), None)
                raise
        self._remember(tenant, sk, updated)
        return updated

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

        async def run(conn: Connection) -> list[SessionRecord]:
            cur = await conn.execute(sql, params)
            return [SessionRecord.model_validate_json(doc) for (doc,) in await cur.fetchall()]

        rows = await self._run(run, idempotent=True)
        items = rows[: query.limit]
        more = len(rows) > query.limit
        cursor = encode_cursor(items[-1].last_active, items[-1].id) if more else None
        return Page(items=items, next_cursor=cursor)

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

        self._heads.pop((tenant, session_id), None)
        await self._write(delete, tx=True)
        self._heads.pop((tenant, session_id), None)

    # -- transcripts -----------------------------------------------------------------------

    async def append_entries(
        self,
        tenant: str,
        session_id: str,
        drafts: Sequence[EntryDraft],
        *,
        expected_version: int | None = None,
        patch: SessionPatch | None = None,
        move_head: bool = True,
    ) -> AppendResult:
        check_tenant_and_id(tenant, session_id)
        metadata_changed = patch is not None and "metadata" in patch.set

        def plan(record: SessionRecord, existing: dict[str, Entry]) -> AppendPlan:
            planned = plan_append(
                record,
                drafts,
                existing,
                expected_version=expected_version,
                patch=patch,
                move_head=move_head,
                max_payload_bytes=self.max_payload_bytes,
                now=utcnow(),
            )
            if planned.entries and patch is not None and patch.set:
                check_session_record(planned.session, self.max_payload_bytes)
            return planned

        async def write(conn: Connection, sk: int, old: int, planned: AppendPlan) -> bool:
            entries = planned.entries
            head = self._head_params(planned.session, metadata_changed=metadata_changed)
            if len(entries) == 1:  # arrays cost more to send than plain parameters
                [e] = entries
                sql = self._q.append_one
                rows: tuple[Any, ...] = (
                    e.seq,
                    e.id,
                    e.parent_seq,
                    e.kind,
                    e.created_at,
                    planned.encoded[0],
                )
            else:
                sql = self._q.append
                rows = (
                    [e.seq for e in entries],
                    [e.id for e in entries],
                    [e.parent_seq for e in entries],
                    [e.kind for e in entries],
                    [e.created_at for e in entries],
                    planned.encoded,
                )
            cur = await conn.execute(sql, (*head, sk, old, *rows))
            return cur.rowcount == len(entries)

        async def fast(conn: Connection) -> tuple[int, AppendResult]:
            # The usual case: this store wrote or read the head last. The statement's
            # version check proves the cached head current; anything unusual (another
            # writer, a reused id, a stale cache) goes the careful way.
            cached = self._heads.get((tenant, session_id))
            if cached is None:
                raise Careful
            sk, record = cached
            try:
                planned = plan(record, {})
            except StatekeeperError:
                raise Careful from None
            try:
                written = await write(conn, sk, record.version, planned)
            except psycopg.errors.UniqueViolation:
                raise Careful from None
            if not written:
                raise Careful
            return sk, AppendResult(session=planned.session, entries=planned.entries)

        async def careful(conn: Connection) -> tuple[int, AppendResult]:
            ids = [validate_id(d.id, "entry id") for d in drafts]
            sk, record = await self._head(conn, tenant, session_id, lock=True)
            cur = await conn.execute(self._q.entries_by_id, (sk, ids))
            existing = {e.id: e for e in self._entries(await cur.fetchall())}
            planned = plan(record, existing)
            if planned.replayed:
                return sk, AppendResult(session=record, entries=planned.replayed, replayed=True)
            await write(conn, sk, record.version, planned)
            return sk, AppendResult(session=planned.session, entries=planned.entries)

        try:
            sk, result = await self._write(fast, idempotent=True)
        except Careful:
            try:
                sk, result = await self._write(careful, tx=True, idempotent=True)
            except StatekeeperError:
                self._heads.pop((tenant, session_id), None)
                raise
        self._remember(tenant, sk, result.session)
        return result

    def _entries(self, rows: Sequence[tuple[Any, ...]]) -> list[Entry]:
        out: list[Entry] = []
        with gc_paused():
            for seq, entry_id, parent, kind, created, text in rows:
                try:
                    payload = loads(text)
                    if not isinstance(payload, dict):
                        raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
                except ValueError as exc:
                    out.append(corrupt_entry(seq, entry_id, parent, created, str(text), str(exc)))
                    continue
                out.append(Entry(seq, entry_id, parent, kind, created, payload))
        return out

    async def _session_rows(
        self, sql: bytes, params: tuple[Any, ...], session_id: str
    ) -> list[Entry]:
        """Entries from a query joining the session (one row, NULL entry, if it has none)."""

        async def read(conn: Connection) -> list[tuple[Any, ...]]:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()

        rows = await self._run(read, idempotent=True)
        if not rows:
            raise session_not_found(session_id)
        return self._entries([row[1:] for row in rows if row[1] is not None])

    async def read_entries(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        check_tenant_and_id(tenant, session_id)
        check_limit(limit)
        last = until_seq if until_seq is not None else 2**63 - 1
        params = (after_seq, last, limit, tenant, session_id)
        return await self._session_rows(self._q.read_entries, params, session_id)

    async def get_entry(self, tenant: str, session_id: str, entry_id: str) -> Entry:
        check_tenant_and_id(tenant, session_id)
        validate_id(entry_id, "entry id")
        params = (entry_id, tenant, session_id)
        found = await self._session_rows(self._q.get_entry, params, session_id)
        if not found:
            raise NotFoundError(f"entry {entry_id!r} not found in session {session_id!r}")
        return found[0]

    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        check_tenant_and_id(tenant, session_id)
        check_prunable_kind(kind)

        async def prune(conn: Connection) -> tuple[int, SessionRecord | None, int]:
            sk, record = await self._head(conn, tenant, session_id, lock=True)
            cur = await conn.execute(
                self._q.prune,
                (sk, kind, before_seq, record.head_seq, id_prefix, id_prefix + KEY_END, sk),
            )
            if not cur.rowcount:
                return sk, None, 0
            updated = apply_patch(record, SessionPatch(), now=utcnow())
            params = self._head_params(updated, metadata_changed=False)
            await conn.execute(self._q.save_head, (*params, sk, record.version))
            return sk, updated, cur.rowcount

        try:
            sk, updated, count = await self._write(prune, tx=True)
        except StatekeeperError:
            self._heads.pop((tenant, session_id), None)
            raise
        if updated is not None:
            self._remember(tenant, sk, updated)
        return count


async def _open_owned(location: str, options: dict[str, str]) -> PostgresStore:
    """A store with its own pool, from a URL's location and query options."""
    options = dict(options)
    schema = options.pop("schema", DEFAULT_SCHEMA)
    min_size = _take(options, "min_size", int, 1)
    max_size = _take(options, "max_size", int, 10)
    limit = _take(options, "max_payload_bytes", int, DEFAULT_MAX_PAYLOAD_BYTES)
    timeout = _take(options, "timeout", float, 30.0)
    connect_timeout = _take(options, "connect_timeout", int, 10)
    durability = options.pop("durability", Durability.POWER.value)
    libpq = {"sslmode": options.pop("sslmode")} if "sslmode" in options else {}
    _no_more(options, "postgresql")
    if not 0 <= min_size <= max_size or max_size < 1:
        raise InvalidInputError(
            f"need 0 <= min_size <= max_size and max_size >= 1, got {min_size} and {max_size}"
        )
    if durability not in {d.value for d in Durability}:
        raise InvalidInputError(
            f"durability={durability!r} is not one of: {', '.join(d.value for d in Durability)}"
        )
    if timeout <= 0 or connect_timeout < 0:
        raise InvalidInputError("timeout must be > 0 and connect_timeout >= 0 (seconds)")
    statements = Statements(schema)  # validates the name before anything connects
    conninfo, url = parse_location(location, {"connect_timeout": str(connect_timeout), **libpq})
    # The server's default commit survives a power loss; "process" lets the server
    # acknowledge before its WAL reaches the disk (a server crash may lose the last
    # commits, never corrupt).
    settings = "-c TimeZone=UTC"
    if durability == Durability.PROCESS.value:
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
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True, "options": settings},
        open=False,
        timeout=timeout,
        name=f"statekeeper:{schema}",
    )
    await pool.open(wait=False)
    return PostgresStore(
        PoolSource(pool, owned=True, timeout=timeout),
        schema=schema,
        max_payload_bytes=limit,
        url=url,
    )


async def open_postgres(location: str, options: dict[str, str]) -> Store:
    """``postgresql://user@host:5432/dbname?schema=...`` (the opener `open_store` uses).

    Options: ``schema`` (default ``statekeeper``), ``min_size`` / ``max_size`` (pool
    connections, 1 / 10), ``max_payload_bytes``, ``timeout`` (seconds to wait for a pooled
    connection, 30), ``connect_timeout`` (10), ``sslmode``, ``durability``
    (``power`` or ``process``).
    """
    return await _open_owned(location, options)
