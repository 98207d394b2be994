"""The embedded SQLite store (``sqlite:///path.db``), statekeeper's default.

One connection per store, used only from the store's worker thread, so the event loop
never blocks on the disk or on another process's lock. WAL journal; every write is one
``BEGIN IMMEDIATE`` transaction, so concurrent writers (threads or processes) queue on
SQLite's busy handler instead of failing with "database is locked".

Durability: ``power`` (default) fsyncs the WAL on every commit (``synchronous=FULL``) and
survives a power loss; ``process`` (``synchronous=NORMAL``) survives a process crash only.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    AlreadyExistsError,
    InvalidInputError,
    NotFoundError,
    StoreCorruptError,
    StoreFullError,
)
from statekeeper.ids import validate_id
from statekeeper.loops import per_loop
from statekeeper.stores.base import (
    Entry,
    Page,
    SessionPatch,
    SessionQuery,
    SessionRecord,
)
from statekeeper.stores.engine import AppendEngine, EventWrite, Snapshot, Write
from statekeeper.stores.engine_writes import EngineWrites
from statekeeper.stores.options import StoreOptions
from statekeeper.stores.rules import (
    apply_patch,
    check_prunable_kind,
    check_read,
    check_rewrites,
    check_tenant_and_id,
    decode_cursor,
    decode_session,
    encoded_head,
    new_session_record,
    page_of,
    same_document,
    session_not_found,
)
from statekeeper.stores.sqlite.records import _KEY_END, SQLiteRecordsAndEvents, _dt, _limit, _us
from statekeeper.stores.sqlite.rows import (
    DOC_FIELDS,
    HEAD_COLUMNS,
    SAVE_ALL,
    SAVE_LIVE,
    SELECT_ENTRIES,
    entries_of,
    metadata_conditions,
    split_payload,
    stored_payload,
)
from statekeeper.stores.sqlite.schema import LIVE_COLUMNS, SEQ_BITS

__all__ = ["SQLiteStore"]


_INLINE_ENTRIES = 64
"""Reads of at most this many entries run inline (see `read_entries`)."""


class _Stale(Exception):
    """The head moved or an entry id is taken: roll back, report the current state."""


class SQLiteStore(EngineWrites, SQLiteRecordsAndEvents):
    """A store in one SQLite file. Open with ``await SQLiteStore.open(path)``."""

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(path, **options)
        # (tenant, id) -> (sk, record): skips re-parsing an unchanged head on every append.
        self._heads: dict[tuple[str, str], Any] = {}

    @per_loop
    def _engine(self) -> AppendEngine:
        return AppendEngine(self, max_payload_bytes=self.max_payload_bytes, heads=self._heads)

    def _write_failed(self) -> None:
        self._heads.clear()  # cached heads may be ahead of what is on disk

    def _head(
        self, db: sqlite3.Connection, tenant: str, session_id: str
    ) -> tuple[int, SessionRecord]:
        row = db.execute(
            "SELECT sk, version FROM sessions WHERE tenant=? AND id=?", (tenant, session_id)
        ).fetchone()
        if row is None:
            raise session_not_found(session_id)
        cached = self._heads.get((tenant, session_id))
        if cached is not None and cached[0] == row[0] and cached[1].version == row[1]:
            return row[0], cached[1]
        stored = db.execute(f"SELECT {HEAD_COLUMNS} FROM sessions WHERE sk=?", (row[0],))
        columns = stored.fetchone()
        if columns is None:  # deleted since the first statement (reads without a snapshot)
            raise session_not_found(session_id)
        record = self._decode_head(tenant, session_id, *columns)
        self._heads[tenant, session_id] = (row[0], record)
        return row[0], record

    def _decode_head(
        self, tenant: str, session_id: str, doc: str, active_us: int, version: int, *live: Any
    ) -> SessionRecord:
        """A head from its document and its live columns (see schema version 3)."""
        record = decode_session(tenant, session_id, doc, str(self.path))
        if live[0] is None:  # written before version 3: the document is current
            return record
        columns = dict(zip(LIVE_COLUMNS, live, strict=True))
        return record.model_copy(
            update={"last_active": _dt(active_us), "version": version, **columns}
        )

    def _save_head(
        self, db: sqlite3.Connection, sk: int, record: SessionRecord, base: SessionRecord
    ) -> bool:
        """Write a head over ``base``; False if ``base`` is no longer the stored version.

        An append changes only the live columns; the document is written when any other
        field changed (it then carries the live values too, for readers of old versions).
        """
        live = [getattr(record, name) for name in LIVE_COLUMNS]
        common = [_us(record.last_active), record.version, *live]
        if same_document(base, record, DOC_FIELDS):
            cursor = db.execute(SAVE_LIVE, (*common, sk, base.version))
            return cursor.rowcount == 1
        doc = encoded_head(record, self.max_payload_bytes)
        cursor = db.execute(SAVE_ALL, (*common, record.agent_id, doc, sk, base.version))
        return cursor.rowcount == 1

    # -- sessions ------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        record = new_session_record(record, self.max_payload_bytes)

        def create(db: sqlite3.Connection) -> int:
            try:
                cursor = db.execute(
                    "INSERT INTO sessions (tenant, id, agent_id, active_us, created_us, version,"
                    f" doc, {', '.join(LIVE_COLUMNS)}) VALUES ({', '.join('?' * 12)})",
                    (
                        record.tenant,
                        record.id,
                        record.agent_id,
                        _us(record.last_active),
                        _us(record.created_at),
                        record.version,
                        record.model_dump_json(),
                        *(getattr(record, name) for name in LIVE_COLUMNS),
                    ),
                )
            except sqlite3.IntegrityError:
                raise AlreadyExistsError(f"session {record.id!r} already exists") from None
            assert cursor.lastrowid is not None
            return cursor.lastrowid

        self._engine.remember(record.tenant, await self._write(create), record)
        return record

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)
        # Each statement of `_head` reads a whole row (the key, then the head by its key):
        # no snapshot across them is needed.
        return await self._read(
            lambda db: self._head(db, tenant, session_id)[1], inline=True, snapshot=False
        )

    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        validate_id(tenant, "tenant")
        where = ["tenant=?"]
        params: list[Any] = [tenant]
        if query.agent_id is not None:
            where.append("agent_id=?")
            params.append(query.agent_id)
        if query.active_after is not None:
            where.append("active_us>?")
            params.append(_us(query.active_after))
        if query.active_before is not None:
            where.append("active_us<?")
            params.append(_us(query.active_before))
        if query.metadata:
            # A head that is not JSON cannot be ruled out: it is reported, not left out.
            conditions = " AND ".join(metadata_conditions(query.metadata, params))
            where.append(f"CASE WHEN json_valid(doc) THEN {conditions} ELSE 1 END")
        if query.cursor is not None:
            stamp, after_id = decode_cursor(query.cursor)
            where.append("(active_us, id) < (?, ?)")
            params += [_us(stamp), after_id]
        sql = (
            f"SELECT id, {HEAD_COLUMNS} FROM sessions WHERE {' AND '.join(where)} "
            "ORDER BY active_us DESC, id DESC LIMIT ? OFFSET ?"
        )
        params += [query.limit + 1, query.offset]

        def run(db: sqlite3.Connection) -> Page:
            # Decoded on the worker too: a page of heads is long work for the event loop.
            rows: list[tuple[datetime, str, str | SessionRecord]] = []
            for sid, doc, us, *rest in db.execute(sql, params):
                try:
                    rows.append((_dt(us), sid, self._decode_head(tenant, sid, doc, us, *rest)))
                except StoreCorruptError:
                    rows.append((_dt(us), sid, doc))  # reported by page_of
            return page_of(rows, tenant, query.limit, str(self.path))

        return await self._read(run)

    async def delete_session(self, tenant: str, session_id: str) -> None:
        check_tenant_and_id(tenant, session_id)

        def delete(db: sqlite3.Connection) -> None:
            # The key only: a session whose head cannot be decoded can be deleted too.
            row = db.execute(
                "SELECT sk FROM sessions WHERE tenant=? AND id=?", (tenant, session_id)
            ).fetchone()
            if row is None:
                raise session_not_found(session_id)
            sk = row[0]
            db.execute(
                "DELETE FROM entries WHERE rid>=? AND rid<?", (sk << SEQ_BITS, (sk + 1) << SEQ_BITS)
            )
            db.execute("DELETE FROM sessions WHERE sk=?", (sk,))
            self._heads.pop((tenant, session_id), None)

        await self._write(delete)

    # -- transcripts ---------------------------------------------------------------------

    def _existing(self, db: sqlite3.Connection, sk: int, ids: Sequence[str]) -> dict[str, Entry]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        found = entries_of(
            db,
            f"{SELECT_ENTRIES} WHERE session_sk=? AND id IN ({marks})",
            [sk, *ids],
        )
        return {e.id: e for e in found}

    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        """The engine's read primitive: the head and stored entries among ``ids``."""

        def load(db: sqlite3.Connection) -> Snapshot:
            sk, record = self._head(db, tenant, session_id)
            return Snapshot(sk, record, self._existing(db, sk, ids))

        return await self._read(load, inline=True)

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
        """The engine's write primitive: the UPDATE's version check is the compare-and-set,
        the entries' unique index refuses a taken id; either rolls the whole commit back.
        ``events`` go in the same transaction (the events table is in the same file)."""
        sk = cast(int, base.token)

        def commit(db: sqlite3.Connection) -> None:
            if not self._save_head(db, sk, head, base.record):
                raise _Stale
            if not writes:
                return
            if writes[-1].entry.seq >= 1 << SEQ_BITS:
                raise StoreFullError(f"session {session_id!r} has {(1 << SEQ_BITS) - 1} entries")
            base_rid = sk << SEQ_BITS
            try:
                db.executemany(
                    "INSERT INTO entries (rid, session_sk, id, parent_seq, kind, created_us,"
                    " payload, tokens, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            base_rid | e.seq,
                            sk,
                            e.id,
                            e.parent_seq,
                            e.kind,
                            _us(e.created_at),
                            *split_payload(e.payload, text),
                        )
                        for e, text, _ in writes
                    ],
                )
            except sqlite3.IntegrityError:
                raise _Stale from None
            for log in events:
                self._log_events(db, tenant, log)

        try:
            await self._write(commit)
        except _Stale:
            return await self.load_head(tenant, session_id, ids)
        self._note_write(sum(len(w.text) for w in writes), commits=0)
        return None

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

        def read(db: sqlite3.Connection) -> list[Entry]:
            sk, _ = self._head(db, tenant, session_id)
            low = sk << SEQ_BITS
            last = (1 << SEQ_BITS) - 1 if until_seq is None else min(until_seq, (1 << SEQ_BITS) - 1)
            if after_seq >= last:
                return []
            return entries_of(
                db,
                f"{SELECT_ENTRIES} WHERE rid>? AND rid<=? ORDER BY rid LIMIT ?",
                [low | max(after_seq, 0), low | last, _limit(limit)],
            )

        # A few entries (the newest N of a chat, a window of a walk) are read right here:
        # less work than the hop to the worker. Whole transcripts go to the worker.
        span = None if until_seq is None else until_seq - after_seq
        if limit is not None:
            span = limit if span is None else min(span, limit)
        return await self._read(read, inline=span is not None and span <= _INLINE_ENTRIES)

    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        check_tenant_and_id(tenant, session_id)
        check_prunable_kind(kind)

        def prune(db: sqlite3.Connection) -> int:
            sk, record = self._head(db, tenant, session_id)
            low = sk << SEQ_BITS
            before = min(max(before_seq, 0), 1 << SEQ_BITS)
            cursor = db.execute(
                "DELETE FROM entries WHERE rid>? AND rid<? AND kind=? AND rid<>? "
                "AND id>=? AND id<? AND (rid & 4294967295) NOT IN (SELECT parent_seq "
                "FROM entries WHERE rid>? AND rid<? AND parent_seq IS NOT NULL)",
                (
                    low,
                    low + before,
                    kind,
                    low | record.head_seq,
                    id_prefix,
                    id_prefix + _KEY_END,
                    low,
                    low + (1 << SEQ_BITS),
                ),
            )
            if cursor.rowcount:
                updated = apply_patch(record, SessionPatch(), now=utcnow())
                self._save_head(db, sk, updated, record)
            return cursor.rowcount

        return await self._write(prune)

    async def rewrite_entry_payloads(
        self, tenant: str, session_id: str, payloads: Mapping[str, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses)."""
        check_tenant_and_id(tenant, session_id)
        checked = check_rewrites(payloads, events=False, limit=self.max_payload_bytes)

        def rewrite(db: sqlite3.Connection) -> int:
            sk, _ = self._head(db, tenant, session_id)
            done = 0
            for entry_id, (expected, text) in checked.items():
                row = db.execute(
                    "SELECT rid, payload, tokens, body FROM entries WHERE session_sk=? AND id=?",
                    (sk, entry_id),
                ).fetchone()
                if row is None:
                    continue
                try:
                    stored = stored_payload(row[1], row[2], row[3])
                except ValueError:
                    continue  # damaged: never what the caller expects
                if stored == expected:
                    db.execute(
                        "UPDATE entries SET payload=?, tokens=NULL, body=NULL WHERE rid=?",
                        (text, row[0]),
                    )
                    done += 1
            return done

        return await self._write(rewrite)

    async def get_entry(self, tenant: str, session_id: str, entry_id: str) -> Entry:
        check_tenant_and_id(tenant, session_id)
        validate_id(entry_id, "entry id")

        def get(db: sqlite3.Connection) -> Entry:
            sk, _ = self._head(db, tenant, session_id)
            found = entries_of(db, f"{SELECT_ENTRIES} WHERE session_sk=? AND id=?", [sk, entry_id])
            if not found:
                raise NotFoundError(f"entry {entry_id!r} not found in session {session_id!r}")
            return found[0]

        return await self._read(get)


async def open_sqlite(location: str, options: StoreOptions) -> SQLiteStore:
    """``sqlite:///relative.db`` or ``sqlite:////absolute.db``.

    Options: ``durability=power|process``, ``busy_timeout=<seconds>`` (30), ``mode=rw|ro``,
    ``max_payload_bytes=<n>``, ``inline_writes=true|false``, ``page_size=<bytes>`` (a new
    file only; 8192. Chosen by measurement: appends with 8 KB pages cost about what they
    cost with 4 KB pages and 15-25% less than with 16 KB pages, which write twice the
    bytes per commit; the benchmark's mix of 0.4 and 2 KB messages takes 1.23x its JSON
    size with 8 KB pages (raw sqlite3: 1.18x), 1.41x with 4 KB pages, more than the
    OpenAI Agents SDK's ``SQLiteSession`` (1.37x), and 1.11x with 16 KB pages).
    """
    path = location[1:] if location.startswith("/") else location
    if not path:
        raise InvalidInputError("sqlite URL needs a path, e.g. sqlite:///state.db")
    durability = options.durability()
    mode = options.choice("mode", ("rw", "ro"), "rw")
    busy_timeout = options.take("busy_timeout", float, 30.0)
    limit = options.max_payload_bytes()
    inline = options.take("inline_writes", bool, True)
    page_size = options.take("page_size", int, 8192)
    options.done()
    return await SQLiteStore.open(
        path,
        durability=durability,
        busy_timeout=busy_timeout,
        read_only=mode == "ro",
        inline_writes=inline,
        max_payload_bytes=limit,
        page_size=page_size,
    )
