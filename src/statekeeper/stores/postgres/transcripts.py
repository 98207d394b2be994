"""Session heads and transcript entries of the PostgreSQL store.

Ordering and compare-and-set happen in the database:

- an append is one statement that moves the session row from the version this store
  last saw to the next *and* inserts the entries (``WITH head AS (UPDATE ... WHERE sk =
  .. AND version = ..) INSERT ...``): the row lock orders the writers of a session and
  the version check refuses a stale head, so both happen or neither does;
- when the store has not seen the current head (another process wrote, an id is reused,
  nothing is cached), the careful path locks the row (``SELECT ... FOR UPDATE``) in a
  transaction, decides with the shared rules (`plan_append`) and writes.

Appends to one session that arrive while this store is already writing to it are
combined into one statement (each keeps its own result, or its own error), so
concurrent writers of one session share commits instead of queueing on the row lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    NotFoundError,
    PayloadTooLargeError,
    StatekeeperError,
    StoreCorruptError,
    StoreUnavailableError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, gc_paused, loads
from statekeeper.stores.base import AppendResult, Entry, EntryDraft, SessionPatch, SessionRecord
from statekeeper.stores.postgres.conn import (
    Careful,
    Connection,
    ConnectionSource,
    PostgresBase,
    psycopg,
)
from statekeeper.stores.postgres.schema import DEFAULT_SCHEMA, metadata_tokens
from statekeeper.stores.rules import (
    AppendPlan,
    apply_patch,
    check_limit,
    check_prunable_kind,
    check_session_record,
    check_tenant_and_id,
    corrupt_entry,
    plan_append,
    session_not_found,
)

__all__ = ["KEY_END", "PostgresTranscripts"]

KEY_END = "\x7f"  # sorts after every character an id may contain
_HEADS_KEPT = 4096  # cached session heads (a miss costs a locked read of the head)

Key = tuple[str, str]
T = TypeVar("T")


@dataclass
class _Append:
    """One caller's append, waiting for this store's writer of its session."""

    drafts: Sequence[EntryDraft]
    expected_version: int | None
    patch: SessionPatch | None
    move_head: bool
    done: asyncio.Future[AppendResult] | None  # None: its caller awaits the writing task


class PostgresTranscripts(PostgresBase):
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
        self._heads: dict[Key, tuple[int, SessionRecord]] = {}
        # Appends queued per session while one is being written (by a task in _tasks).
        self._appends: dict[Key, list[_Append]] = {}

    async def close(self) -> None:
        await super().close()
        self._heads.clear()

    # -- heads ---------------------------------------------------------------------------

    def _remember(self, tenant: str, sk: int, record: SessionRecord) -> None:
        """Cache a committed head (never an uncommitted one: reads trust the cache)."""
        key = (tenant, record.id)
        known = self._heads.get(key)
        if known is not None and known[0] == sk and known[1].version > record.version:
            return  # a later write of this process already landed
        if known is None and len(self._heads) >= _HEADS_KEPT:
            del self._heads[next(iter(self._heads))]
        self._heads[key] = (sk, record)

    def _forget(self, tenant: str, session_id: str) -> None:
        self._heads.pop((tenant, session_id), None)

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
        """The parameters that set a head row (statements ``save_head`` and ``append``)."""
        doc = record.model_dump_json()
        if len(doc) > self.max_payload_bytes:
            raise PayloadTooLargeError(
                f"session {record.id!r} record would be {len(doc)} bytes; "
                f"the limit is {self.max_payload_bytes}"
            )
        meta = metadata_tokens(record.metadata) if metadata_changed else None
        return (record.agent_id, record.last_active, record.version, meta, doc)

    # -- appends -------------------------------------------------------------------------

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
        if self._source is None:
            raise StoreUnavailableError(f"{self!r} is closed; open a new store")
        loop = asyncio.get_running_loop()
        key = (tenant, session_id)
        queue = self._appends.get(key)
        if queue is None:
            # Nothing under way for this session here: write now, in a task of its own.
            self._appends[key] = []
            request = _Append(drafts, expected_version, patch, move_head, None)
            return await self._outcome(self._spawn(self._write_first(key, request)))
        # Another append to it is being written: queue, to be written with the others.
        done: asyncio.Future[AppendResult] = loop.create_future()
        queue.append(_Append(drafts, expected_version, patch, move_head, done))
        return await self._outcome(done)

    def _spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    async def _outcome(done: asyncio.Future[T]) -> T:
        """Wait for a write; a cancelled caller sees the cancel once the write has ended."""
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            if not done.done():
                await asyncio.wait([done])
            if not done.cancelled():
                done.exception()  # retrieved, so asyncio does not log it as lost
            raise

    async def _write_first(self, key: Key, request: _Append) -> AppendResult:
        """Write one append; then hand the appends queued meanwhile to a writer."""
        try:
            return await self._append_alone(key, request)
        finally:
            if self._appends[key]:
                self._spawn(self._write_queued(key))
            else:
                del self._appends[key]

    async def _write_queued(self, key: Key) -> None:
        """Write a session's queued appends until none is left (one writer per session)."""
        batch: list[_Append] = []
        try:
            while True:
                # Let the callers answered last queue their next appends first (a few
                # loop turns), so that they share the next statement's commit.
                for _ in range(3):
                    await asyncio.sleep(0)
                batch, self._appends[key] = self._appends[key], []
                if not batch:
                    break
                if len(batch) > 1:
                    batch = await self._append_combined(key, batch)
                for request in batch:
                    assert request.done is not None
                    try:
                        request.done.set_result(await self._append_alone(key, request))
                    except Exception as exc:
                        request.done.set_exception(exc)
        finally:
            for request in batch + self._appends.pop(key, []):
                if request.done is not None and not request.done.done():
                    request.done.set_exception(
                        StoreUnavailableError(f"{self!r} stopped before this append was written")
                    )

    def _plan(
        self, record: SessionRecord, request: _Append, existing: dict[str, Entry]
    ) -> AppendPlan:
        planned = plan_append(
            record,
            request.drafts,
            existing,
            expected_version=request.expected_version,
            patch=request.patch,
            move_head=request.move_head,
            max_payload_bytes=self.max_payload_bytes,
            now=utcnow(),
        )
        if planned.entries and request.patch is not None and request.patch.set:
            check_session_record(planned.session, self.max_payload_bytes)
        return planned

    async def _insert(
        self,
        conn: Connection,
        sk: int,
        old: SessionRecord,
        new: SessionRecord,
        entries: list[Entry],
        encoded: list[str],
    ) -> bool:
        """Move the head from ``old`` to ``new`` and insert ``entries``; False if stale."""
        # apply_patch copies the metadata object unless it was set: identity tells a change.
        head = self._head_params(new, metadata_changed=new.metadata is not old.metadata)
        if len(entries) == 1:  # plain parameters cost less to send than arrays
            [e] = entries
            sql = self._q.append_one
            rows: tuple[Any, ...] = (e.seq, e.id, e.parent_seq, e.kind, e.created_at, encoded[0])
        else:
            sql = self._q.append
            rows = (
                [e.seq for e in entries],
                [e.id for e in entries],
                [e.parent_seq for e in entries],
                [e.kind for e in entries],
                [e.created_at for e in entries],
                encoded,
            )
        try:
            cur = await conn.execute(sql, (*head, old.tenant, old.id, sk, old.version, *rows))
        except psycopg.errors.UniqueViolation:
            raise Careful from None  # an entry id is already stored: look at it
        return cur.rowcount == len(entries)

    async def _append_alone(self, key: Key, request: _Append) -> AppendResult:
        tenant, session_id = key

        async def fast(conn: Connection) -> tuple[int, AppendResult]:
            # The usual case: this store wrote or read the head last. The statement's
            # version check proves the cached head current; anything unusual (another
            # writer, a reused id, a stale cache) goes the careful way.
            cached = self._heads.get(key)
            if cached is None:
                raise Careful
            sk, record = cached
            try:
                planned = self._plan(record, request, {})
            except StatekeeperError:
                raise Careful from None  # perhaps only the cached copy is stale
            if not await self._insert(
                conn, sk, record, planned.session, planned.entries, planned.encoded
            ):
                raise Careful
            # Built from checked parts: no need to validate them again.
            return sk, AppendResult.model_construct(
                session=planned.session, entries=planned.entries, replayed=False
            )

        async def careful(conn: Connection) -> tuple[int, AppendResult]:
            ids = [validate_id(d.id, "entry id") for d in request.drafts]
            sk, record = await self._head(conn, tenant, session_id, lock=True)
            cur = await conn.execute(self._q.entries_by_id, (sk, ids))
            existing = {e.id: e for e in self._entries(await cur.fetchall())}
            planned = self._plan(record, request, existing)
            if planned.replayed:
                return sk, AppendResult(session=record, entries=planned.replayed, replayed=True)
            await self._insert(conn, sk, record, planned.session, planned.entries, planned.encoded)
            return sk, AppendResult(session=planned.session, entries=planned.entries)

        try:
            # Idempotent: a retry after a lost commit finds its entries and replays them.
            sk, result = await self._run(fast, idempotent=True)
        except Careful:
            try:
                sk, result = await self._run(careful, tx=True, idempotent=True)
            except StatekeeperError:
                self._forget(tenant, session_id)
                raise
        self._remember(tenant, sk, result.session)
        return result

    async def _append_combined(self, key: Key, batch: list[_Append]) -> list[_Append]:
        """Write several appends in one statement; return those left to write one by one.

        Each is planned on the head the one before it leaves, as if they ran in turn. If
        the statement succeeds those plans were made on the current head, so an append
        whose plan failed gets that error (a stale version, a bad parent) as it would
        have in turn; if the statement fails, every append is retried on its own.
        """
        cached = self._heads.get(key)
        if cached is None:
            return batch
        sk, base = cached
        record = base
        planned: list[tuple[_Append, AppendPlan]] = []
        refused: list[tuple[_Append, StatekeeperError]] = []
        for request in batch:
            try:
                plan = self._plan(record, request, {})
            except StatekeeperError as exc:
                refused.append((request, exc))
                continue
            planned.append((request, plan))
            record = plan.session
        if len(planned) < 2:
            return batch
        entries = [e for _, plan in planned for e in plan.entries]
        encoded = [text for _, plan in planned for text in plan.encoded]

        async def insert(conn: Connection) -> bool:
            return await self._insert(conn, sk, base, record, entries, encoded)

        try:
            written = await self._run(insert, idempotent=True)
        except Exception:
            self._forget(*key)
            return batch
        if not written:
            return batch
        self._remember(key[0], sk, record)
        for request, plan in planned:
            assert request.done is not None
            request.done.set_result(AppendResult(session=plan.session, entries=plan.entries))
        for request, error in refused:
            assert request.done is not None
            request.done.set_exception(error)
        return []

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
            await conn.execute(self._q.save_head, (*params, tenant, session_id, sk, record.version))
            return sk, updated, cur.rowcount

        try:
            sk, updated, count = await self._write(prune, tx=True)
        except StatekeeperError:
            self._forget(tenant, session_id)
            raise
        if updated is not None:
            self._remember(tenant, sk, updated)
        return count
