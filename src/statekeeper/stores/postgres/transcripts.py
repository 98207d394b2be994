"""Session heads and transcript entries of the PostgreSQL store.

Planning, caching, retries and group commit are `statekeeper.stores.engine`'s; this module
gives it its two primitives, with ordering and compare-and-set in the database:

- ``commit_head`` is one statement that moves the session row from the version the
  engine planned on to the next *and* inserts the entries (``WITH head AS (UPDATE ...
  WHERE sk = .. AND version = ..) INSERT ...``): the row lock orders the writers of a
  session and the version check refuses a stale head, so both happen or neither does;
  a taken entry id violates the unique index and writes nothing either. An append that
  changes only the counters (the usual one) sets those columns and leaves the head's
  doc as it is (`stored_head` puts them together again);
- ``load_head`` reads the head and the stored entries among the drafts' ids, and the
  engine plans again from them.

The engine's token is the session row's key (``sk``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC
from functools import partial
from operator import attrgetter
from typing import Any, TypeVar, cast

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    NotFoundError,
    StatekeeperError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, gc_paused, loads
from statekeeper.loops import per_loop
from statekeeper.stores.base import Entry, Event, SessionPatch, SessionRecord
from statekeeper.stores.engine import AppendEngine, EventWrite, Snapshot, Write
from statekeeper.stores.engine_writes import EngineWrites
from statekeeper.stores.postgres.conn import (
    Careful,
    Connection,
    ConnectionSource,
    PostgresBase,
    psycopg,
)
from statekeeper.stores.postgres.schema import COUNTERS, DEFAULT_SCHEMA, metadata_tokens
from statekeeper.stores.rules import (
    apply_patch,
    check_prunable_kind,
    check_read,
    check_rewrites,
    check_tenant_and_id,
    corrupt_entry,
    decode_session,
    document_fields,
    encoded_head,
    same_document,
    same_payload,
    session_not_found,
)

__all__ = ["KEY_END", "PostgresTranscripts", "log_events", "stored_head"]

KEY_END = "\x7f"  # sorts after every character an id may contain
_HEADS_KEPT = 4096  # cached session heads (a miss costs a locked read of the head)

Key = tuple[str, str]
T = TypeVar("T")
# Head fields kept in the doc only: an append that changes none of them leaves the doc.
_IN_DOC = document_fields(COUNTERS)


def stored_head(
    tenant: str, session_id: str, doc: str, columns: Sequence[Any], where: str
) -> SessionRecord:
    """A head from its row: the doc, with ``columns`` (version, last_active and the
    `COUNTERS`) over it. Rows last written before migration 2 have no counters: their
    doc is whole. `StoreCorruptError` if the doc cannot be decoded."""
    record = decode_session(tenant, session_id, doc, where)
    version, last_active, *counters = columns
    if counters[0] is None:
        return record
    update: dict[str, Any] = dict(zip(COUNTERS, counters, strict=True))
    update["version"] = version
    if last_active != record.last_active:  # same instant: keep the doc's own offset
        update["last_active"] = last_active.astimezone(UTC)
    return record.model_copy(update=update)


_counters: Callable[[SessionRecord], tuple[int, ...]] = attrgetter(*COUNTERS)
"""A head's `COUNTERS`, in order."""


class PostgresTranscripts(EngineWrites, PostgresBase):
    """The head cache and the `TranscriptStore` half of `PostgresStore`."""

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
        self._heads: dict[tuple[str, str], Any] = {}

    @per_loop
    def _engine(self) -> AppendEngine:
        return AppendEngine(self, max_payload_bytes=self.max_payload_bytes, heads=self._heads)

    async def close(self) -> None:
        await super().close()
        self._heads.clear()

    # -- heads ---------------------------------------------------------------------------

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
        sk, doc, *columns = row
        if doc is None and cached is not None:
            return sk, cached[1]
        return sk, stored_head(tenant, session_id, doc, columns, self.url)

    def _head_params(self, record: SessionRecord, *, metadata_changed: bool) -> tuple[Any, ...]:
        """The parameters that set a whole head row (``save_head``, ``append``)."""
        doc = encoded_head(record, self.max_payload_bytes)
        meta = metadata_tokens(record.metadata) if metadata_changed else None
        return (record.agent_id, record.last_active, record.version, meta, doc, *_counters(record))

    # -- appends -------------------------------------------------------------------------

    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        """The engine's read primitive: the head and stored entries among ``ids``."""

        async def read(conn: Connection) -> Snapshot:
            sk, record = await self._head(conn, tenant, session_id, lock=False)
            existing: dict[str, Entry] = {}
            if ids:
                cur = await conn.execute(self._q.entries_by_id, (sk, list(ids)))
                existing = {e.id: e for e in self._entries(await cur.fetchall())}
            return Snapshot(sk, record, existing)

        return await self._run(read, tx=True, idempotent=True)

    async def commit_head(
        self,
        tenant: str,
        session_id: str,
        base: Snapshot,
        head: SessionRecord,
        writes: Sequence[Write],
        ids: Sequence[str],
        *,
        events: Sequence[EventWrite] = (),
    ) -> Snapshot | None:
        """The engine's write primitive (see the module docstring); ``events`` are
        logged in the same transaction, once the head has moved."""
        # A partial, not a closure: one object fewer per cell for the garbage collector.
        sk = cast(int, base.token)
        write = partial(self._commit_write, sk, base.record, head, writes, events)
        try:
            # Idempotent: a retry after a lost commit finds its entries and replays them.
            # With events, a transaction holds the head, the entries and the events.
            if await self._write(write, tx=bool(events), idempotent=True):
                return None
        except Careful:
            pass  # an entry id is already stored: look at it
        return await self.load_head(tenant, session_id, ids)

    async def _commit_write(
        self,
        sk: int,
        old: SessionRecord,
        head: SessionRecord,
        writes: Sequence[Write],
        events: Sequence[EventWrite],
        conn: Connection,
    ) -> bool:
        """`commit_head`'s transaction: True if the head moved (and the rest was written)."""
        if writes:
            moved = await self._insert(conn, sk, old, head, writes)
        else:
            changed = head.metadata is not old.metadata
            params = self._head_params(head, metadata_changed=changed)
            cur = await conn.execute(
                self._q.save_head, (*params, old.tenant, old.id, sk, old.version)
            )
            moved = cur.rowcount == 1
        for log in events if moved else ():
            await log_events(self, conn, old.tenant, log)
        return moved

    async def _insert(
        self,
        conn: Connection,
        sk: int,
        old: SessionRecord,
        new: SessionRecord,
        writes: Sequence[Write],
    ) -> bool:
        """Move the head from ``old`` to ``new`` and insert ``writes``; False if stale."""
        q = self._q
        if same_document(old, new, _IN_DOC):  # the usual append: only the columns change
            head: tuple[Any, ...] = (new.last_active, new.version, *_counters(new))
            one, many = q.append_one_counted, q.append_counted
        else:
            # apply_patch copies the metadata object unless it was set: identity tells.
            head = self._head_params(new, metadata_changed=new.metadata is not old.metadata)
            one, many = q.append_one, q.append
        if len(writes) == 1:  # plain parameters cost less to send than arrays
            [(e, text, _)] = writes
            sql = one
            rows: tuple[Any, ...] = (e.seq, e.id, e.parent_seq, e.kind, e.created_at, text)
        else:
            sql = many
            rows = (
                [w.entry.seq for w in writes],
                [w.entry.id for w in writes],
                [w.entry.parent_seq for w in writes],
                [w.entry.kind for w in writes],
                [w.entry.created_at for w in writes],
                [w.text for w in writes],
            )
        try:
            cur = await conn.execute(sql, (*head, old.tenant, old.id, sk, old.version, *rows))
        except psycopg.errors.UniqueViolation:
            raise Careful from None
        return cur.rowcount == len(writes)

    # -- reads and pruning -------------------------------------------------------------

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

        rows = await self._select(sql, params)
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
        check_read(after_seq, until_seq, limit)
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
            await conn.execute(self._q.save_head, (*params, tenant, session_id, sk, record.version))
            return sk, updated, cur.rowcount

        async with self._engine.serial(tenant, session_id):
            try:
                sk, updated, count = await self._write(prune, tx=True)
            except StatekeeperError:
                self._engine.forget(tenant, session_id)
                raise
        if updated is not None:
            self._engine.remember(tenant, sk, updated)
        return count

    async def rewrite_entry_payloads(
        self, tenant: str, session_id: str, payloads: Mapping[str, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses)."""
        check_tenant_and_id(tenant, session_id)
        checked = check_rewrites(payloads, events=False, limit=self.max_payload_bytes)

        async def rewrite(conn: Connection) -> int:
            sk, _ = await self._head(conn, tenant, session_id, lock=False)
            cur = await conn.execute(self._q.entry_payloads, (sk, list(checked)))
            done = 0
            for entry_id, stored in await cur.fetchall():
                expected, text = checked[entry_id]
                if same_payload(stored, expected):
                    await conn.execute(self._q.rewrite_entry, (text, sk, entry_id))
                    done += 1
            return done

        return await self._write(rewrite, tx=True)


async def log_events(
    store: PostgresBase, conn: Connection, tenant: str, write: EventWrite
) -> list[Event]:
    """Insert ``write``'s events with the log's next seqs, in the caller's transaction
    (with a NOTIFY for event feeds when the store sends them)."""
    count, log_id = len(write.drafts), write.log_id
    params = (
        tenant,
        log_id,
        count,
        tenant,
        log_id,
        count,
        [e.stream for e in write.drafts],
        [e.kind for e in write.drafts],
        [e.ts for e in write.drafts],
        list(write.texts),
    )
    if store.notify_channel is None:
        cur = await conn.execute(store._q.append_events, params)
        first = min(int(seq) for (seq,) in await cur.fetchall())
    else:
        notify = (store.notify_channel, store.schema, tenant, log_id)
        cur = await conn.execute(store._q.append_events_notify, (*params, *notify))
        row = await cur.fetchone()
        assert row is not None
        first = int(row[0])
    return write.stored(first)
