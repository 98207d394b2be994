"""Versioned records and event logs of the SQLite store (a mixin of `SQLiteStore`),
and the small conversions both halves use."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from pydantic import JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidInputError, StoreCorruptError
from statekeeper.jsoncodec import loads
from statekeeper.stores.base import Event, EventDraft, RecordList, VersionedRecord
from statekeeper.stores.engine import EventWrite
from statekeeper.stores.record_query import Picked, RecordQuery, RecordValues, Stamp
from statekeeper.stores.rules import (
    add_record,
    check_limit,
    check_read,
    check_record_ids,
    check_record_listing,
    check_record_version,
    check_rewrites,
    event_texts,
    from_micros,
    record_not_found,
    record_text,
    record_value,
    same_payload,
    to_micros,
)
from statekeeper.stores.sqlite.conn import SQLiteConnection
from statekeeper.stores.sqlite.record_sql import guarded, json_path, query_condition
from statekeeper.stores.types import CorruptItem

__all__ = ["SQLiteRecordsAndEvents"]

T = TypeVar("T")
_KEY_END = "\x7f"  # sorts after every character an id may contain


_us = to_micros
_dt = from_micros


def _limit(limit: int | None) -> int:
    """A SQL LIMIT (-1: none)."""
    checked = check_limit(limit)
    return -1 if checked is None else checked


def _filtered(
    db: sqlite3.Connection, select: Callable[[str], str], condition: str, args: Sequence[Any]
) -> tuple[list[Any], str]:
    """The rows of ``select(condition)``, and the condition that gave them.

    A record that is not JSON makes SQLite's JSON functions fail the statement: the
    condition is then run `guarded`, keeping such records for the caller to report as
    damaged (the check costs every row, so only when needed).
    """
    try:
        return db.execute(select(condition), args).fetchall(), condition
    except sqlite3.OperationalError as exc:
        if condition == "1" or "malformed JSON" not in str(exc):
            raise
    condition = guarded(condition)
    return db.execute(select(condition), args).fetchall(), condition


class SQLiteRecordsAndEvents(SQLiteConnection):
    """Records and event logs on the store's connection (see `SQLiteStore`)."""

    # -- records -------------------------------------------------------------------------

    @staticmethod
    def _record(namespace: str, row: tuple[Any, ...]) -> VersionedRecord:
        key, version, updated_us, expires_us, text = row
        return VersionedRecord(
            namespace=namespace,
            key=key,
            value=record_value(namespace, key, text),
            version=version,
            updated_at=_dt(updated_us),
            expires_at=None if expires_us is None else _dt(expires_us),
        )

    _LIVE = "(expires_us IS NULL OR expires_us > ?)"

    async def get_record(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        check_record_ids(tenant, namespace, key)

        def get(db: sqlite3.Connection) -> VersionedRecord:
            row = db.execute(
                "SELECT key, version, updated_us, expires_us, value FROM records "
                f"WHERE tenant=? AND namespace=? AND key=? AND {self._LIVE}",
                (tenant, namespace, key, _us(utcnow())),
            ).fetchone()
            if row is None:
                raise record_not_found(namespace, key)
            return self._record(namespace, row)

        return await self._read(get, inline=True, snapshot=False)  # one statement

    async def put_record(
        self,
        tenant: str,
        namespace: str,
        key: str,
        value: JsonValue,
        *,
        expected_version: int | None = None,
        expires_at: datetime | None = None,
    ) -> VersionedRecord:
        text = record_text(tenant, namespace, key, value, expires_at, self.max_payload_bytes)
        expires_us = None if expires_at is None else _us(expires_at)

        def put(db: sqlite3.Connection) -> VersionedRecord:
            now = utcnow()
            row = db.execute(
                f"SELECT version FROM records WHERE tenant=? AND namespace=? AND key=? "
                f"AND {self._LIVE}",
                (tenant, namespace, key, _us(now)),
            ).fetchone()
            version = row[0] if row else 0
            check_record_version(namespace, key, version, expected_version)
            db.execute(
                "INSERT OR REPLACE INTO records (tenant, namespace, key, version, updated_us,"
                " expires_us, value) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (tenant, namespace, key, version + 1, _us(now), expires_us, text),
            )
            return self._record(namespace, (key, version + 1, _us(now), expires_us, text))

        return await self._write(put)

    async def list_records(
        self,
        tenant: str,
        namespace: str,
        *,
        prefix: str = "",
        after_key: str | None = None,
        limit: int = 100,
    ) -> RecordList:
        check_record_listing(tenant, namespace, prefix, limit)
        return await self._listing(tenant, namespace, prefix, after_key, limit, "1", [])

    async def query_records(
        self,
        tenant: str,
        namespace: str,
        query: RecordQuery,
        *,
        prefix: str = "",
        after_key: str | None = None,
        limit: int = 100,
    ) -> RecordList:
        """See `statekeeper.stores.record_query`: the tests run in SQL."""
        check_record_listing(tenant, namespace, prefix, limit)
        condition, params = query_condition(query)
        return await self._listing(tenant, namespace, prefix, after_key, limit, condition, params)

    async def _listing(
        self,
        tenant: str,
        namespace: str,
        prefix: str,
        after_key: str | None,
        limit: int,
        condition: str,
        params: list[Any],
    ) -> RecordList:
        def select(where: str) -> str:
            return (
                "SELECT key, version, updated_us, expires_us, value FROM records WHERE"
                f" tenant=? AND namespace=? AND key>=? AND key<? AND key>? AND {self._LIVE}"
                f" AND {where} ORDER BY key LIMIT ?"
            )

        def run(db: sqlite3.Connection) -> RecordList:
            nonlocal condition
            found, after, now = RecordList(), after_key or "", _us(utcnow())
            while True:  # more batches only when damaged rows took places in this one
                args = (tenant, namespace, prefix, prefix + _KEY_END, after, now, *params, limit)
                rows, condition = _filtered(db, select, condition, args)
                for row in rows:
                    decode = partial(self._record, namespace, row)
                    if not add_record(found, limit, row[0], decode, row[4]):
                        return found
                if not rows or len(rows) < limit:
                    return found
                after = rows[-1][0]

        return await self._read(run)

    async def pick_record_values(
        self, tenant: str, namespace: str, query: RecordQuery, path: tuple[str, ...], *, prefix: str
    ) -> RecordValues:
        """See `statekeeper.stores.record_query`: one statement, the rest of each value
        never leaves SQLite."""
        check_record_listing(tenant, namespace, prefix, 1)
        where = json_path(path)
        if where is None:
            raise InvalidInputError(f"record value path {path!r} cannot be read in SQL")
        condition, params = query_condition(query)
        condition = guarded(condition)
        sql = (
            "SELECT key, version, updated_us, CASE WHEN json_valid(value) THEN value -> ? END,"
            " CASE WHEN json_valid(value) THEN NULL ELSE value END FROM records "
            f"WHERE tenant=? AND namespace=? AND key>=? AND key<? AND {self._LIVE}"
            f" AND {condition} ORDER BY key"
        )

        def run(db: sqlite3.Connection) -> RecordValues:
            args = (where, tenant, namespace, prefix, prefix + _KEY_END, _us(utcnow()), *params)
            found = RecordValues()
            for key, version, updated_us, picked, damaged in db.execute(sql, args):
                if damaged is not None:
                    try:
                        record_value(namespace, key, damaged)
                    except StoreCorruptError as exc:
                        found.corrupt.append(CorruptItem(id=key, error=str(exc), raw=damaged[:200]))
                        continue
                value = None if picked is None else loads(picked)
                found.values.append(Picked(key, (version, updated_us), value))
            return found

        return await self._read(run)

    async def list_record_stamps(
        self, tenant: str, namespace: str, query: RecordQuery, *, prefix: str
    ) -> list[tuple[str, Stamp]]:
        """See `statekeeper.stores.record_query`: without a test, no value is read."""
        check_record_listing(tenant, namespace, prefix, 1)
        condition, params = query_condition(query)

        def select(where: str) -> str:
            return (
                "SELECT key, version, updated_us FROM records WHERE tenant=? AND namespace=?"
                f" AND key>=? AND key<? AND {self._LIVE} AND {where} ORDER BY key"
            )

        def run(db: sqlite3.Connection) -> list[tuple[str, Stamp]]:
            args = (tenant, namespace, prefix, prefix + _KEY_END, _us(utcnow()), *params)
            rows, _ = _filtered(db, select, condition, args)
            return [(key, (version, updated_us)) for key, version, updated_us in rows]

        return await self._read(run)

    async def list_key_heads(
        self, tenant: str, namespace: str, *, prefix: str, separator: str
    ) -> list[str]:
        """See `statekeeper.stores.record_query`: a skip scan, one index seek per head
        (records that are not JSON do not count, as listings leave them out)."""
        check_record_listing(tenant, namespace, prefix, 1)
        if not separator:
            raise InvalidInputError("list_key_heads needs a separator")
        first = (
            "SELECT key FROM records WHERE tenant=:t AND namespace=:n AND key{op}{low}"
            f" AND key<:high AND {self._LIVE.replace('?', ':now')} AND json_valid(value)"
            " ORDER BY key LIMIT 1"
        )
        past = (
            "CASE WHEN instr(k, :sep) > 0 THEN substr(k, 1, instr(k, :sep) + length(:sep) - 1)"
            " || char(127) ELSE k END"
        )
        sql = (
            f"WITH RECURSIVE heads(k) AS (SELECT ({first.format(op='>=', low=':low')})"
            f" UNION ALL SELECT ({first.format(op='>', low=past)}) FROM heads"
            " WHERE k IS NOT NULL) SELECT k FROM heads WHERE k IS NOT NULL"
        )
        args = {
            "t": tenant,
            "n": namespace,
            "low": prefix,
            "high": prefix + _KEY_END,
            "now": _us(utcnow()),
            "sep": separator,
        }

        def run(db: sqlite3.Connection) -> list[str]:
            heads = (key.partition(separator) for (key,) in db.execute(sql, args))
            return [head for head, sep, _ in heads if sep]

        return await self._read(run)

    async def delete_record(
        self, tenant: str, namespace: str, key: str, *, expected_version: int | None = None
    ) -> None:
        check_record_ids(tenant, namespace, key)

        def delete(db: sqlite3.Connection) -> None:
            row = db.execute(
                f"SELECT version FROM records WHERE tenant=? AND namespace=? AND key=? "
                f"AND {self._LIVE}",
                (tenant, namespace, key, _us(utcnow())),
            ).fetchone()
            if row is None:
                raise record_not_found(namespace, key)
            check_record_version(namespace, key, row[0], expected_version)
            db.execute(
                "DELETE FROM records WHERE tenant=? AND namespace=? AND key=?",
                (tenant, namespace, key),
            )

        await self._write(delete)

    # -- events --------------------------------------------------------------------------

    async def append_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft]
    ) -> list[Event]:
        texts = event_texts(tenant, log_id, events, self.max_payload_bytes)
        write = EventWrite(log_id, events, texts)
        return await self._write(lambda db: self._log_events(db, tenant, write))

    @staticmethod
    def _log_events(db: sqlite3.Connection, tenant: str, write: EventWrite) -> list[Event]:
        """Insert ``write``'s events with the log's next seqs (inside the caller's
        transaction: an append's events commit with its entries)."""
        (last,) = db.execute(
            "SELECT coalesce(max(seq), 0) FROM events WHERE tenant=? AND log_id=?",
            (tenant, write.log_id),
        ).fetchone()
        db.executemany(
            "INSERT INTO events (tenant, log_id, seq, stream, kind, ts_us, payload)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (tenant, write.log_id, last + i, e.stream, e.kind, _us(e.ts), text)
                for i, (e, text) in enumerate(zip(write.drafts, write.texts, strict=True), 1)
            ],
        )
        return write.stored(last + 1)

    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        check_record_ids(tenant, log_id)
        check_read(after_seq, None, limit)

        def read(db: sqlite3.Connection) -> list[Event]:
            out: list[Event] = []
            for seq, stream, kind, ts_us, text in db.execute(
                "SELECT seq, stream, kind, ts_us, payload FROM events "
                "WHERE tenant=? AND log_id=? AND seq>? ORDER BY seq LIMIT ?",
                (tenant, log_id, after_seq, _limit(limit)),
            ):
                try:
                    payload = loads(text)
                except ValueError as exc:
                    payload = {"error": f"corrupt event: {exc}", "raw": str(text)[:200]}
                    stream, kind = "error", "corrupt"
                out.append(Event(log_id, seq, stream, kind, _dt(ts_us), payload))
            return out

        return await self._read(read)

    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        check_record_ids(tenant, log_id)
        await self._write(
            lambda db: db.execute(
                "DELETE FROM events WHERE tenant=? AND log_id=?", (tenant, log_id)
            ).close()
        )

    async def rewrite_event_payloads(
        self, tenant: str, log_id: str, payloads: Mapping[int, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses)."""
        check_record_ids(tenant, log_id)
        checked = check_rewrites(payloads, events=True, limit=self.max_payload_bytes)

        def rewrite(db: sqlite3.Connection) -> int:
            done = 0
            for seq, (expected, text) in checked.items():
                row = db.execute(
                    "SELECT payload FROM events WHERE tenant=? AND log_id=? AND seq=?",
                    (tenant, log_id, seq),
                ).fetchone()
                if row is not None and same_payload(row[0], expected):
                    db.execute(
                        "UPDATE events SET payload=? WHERE tenant=? AND log_id=? AND seq=?",
                        (text, tenant, log_id, seq),
                    )
                    done += 1
            return done

        return await self._write(rewrite) if checked else 0
