"""Versioned records and event logs of the PostgreSQL store (each one statement).

A record write is a single upsert or compare-and-set ``UPDATE`` whose ``WHERE`` holds the
version check; an event append takes its numbers from the log's row in the same
statement as the insert, so numbers have no gaps and concurrent appenders queue on that
row only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from pydantic import JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidInputError, StoreUnavailableError
from statekeeper.jsoncodec import loads
from statekeeper.stores.base import Event, EventDraft, RecordList, VersionedRecord
from statekeeper.stores.engine import EventWrite
from statekeeper.stores.postgres.conn import ATTEMPTS, Connection, PostgresBase
from statekeeper.stores.postgres.transcripts import KEY_END, log_events
from statekeeper.stores.rules import (
    add_record,
    check_read,
    check_record_ids,
    check_record_listing,
    check_record_version,
    check_rewrites,
    event_texts,
    record_not_found,
    record_text,
    record_value,
    same_payload,
)

__all__ = ["PostgresRecordsAndEvents"]

_LIVE = "(expires_at IS NULL OR expires_at > %(now)s)"


def _key_heads_sql(schema: str) -> bytes:
    """The first live record of each head, jumping past a head's keys in one seek."""
    first = (
        f"SELECT key, value FROM {schema}.records WHERE tenant = %(t)s AND namespace = %(ns)s"
        " AND key {op} {low} AND key < %(high)s AND " + _LIVE + " ORDER BY key LIMIT 1"
    )
    past = (
        "(CASE WHEN strpos(h.key, %(sep)s) > 0 THEN left(h.key, strpos(h.key, %(sep)s)"
        " + length(%(sep)s) - 1) || chr(127) ELSE h.key END)"
    )
    return (
        f"WITH RECURSIVE heads(key, value) AS (({first.format(op='>=', low='%(low)s')})"
        f" UNION ALL SELECT n.key, n.value FROM heads h, LATERAL"
        f" ({first.format(op='>', low=past)}) n) SELECT key, value FROM heads"
    ).encode()


class PostgresRecordsAndEvents(PostgresBase):
    """The `RecordStore` and `EventLogStore` halves of `PostgresStore`."""

    # -- records ---------------------------------------------------------------------------

    @staticmethod
    def _record(namespace: str, row: Sequence[Any]) -> VersionedRecord:
        key, version, updated_at, expires_at, text = row
        return VersionedRecord(
            namespace=namespace,
            key=key,
            value=record_value(namespace, key, text),
            version=version,
            updated_at=updated_at,
            expires_at=expires_at,
        )

    async def get_record(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        check_record_ids(tenant, namespace, key)
        params = {"t": tenant, "ns": namespace, "k": key, "now": utcnow()}

        async def get(conn: Connection) -> VersionedRecord:
            cur = await conn.execute(self._q.get_record, params)
            row = await cur.fetchone()
            if row is None:
                raise record_not_found(namespace, key)
            return self._record(namespace, row)

        return await self._run(get, idempotent=True)

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
        if expected_version is None:
            sql = self._q.put_record
        elif expected_version == 0:
            sql = self._q.create_record
        else:
            sql = self._q.replace_record

        async def put(conn: Connection) -> VersionedRecord:
            for _ in range(ATTEMPTS):
                now = utcnow()
                params = {
                    "t": tenant,
                    "ns": namespace,
                    "k": key,
                    "now": now,
                    "exp": expires_at,
                    "v": text,
                    "ver": expected_version,
                }
                row = await (await conn.execute(sql, params)).fetchone()
                if row is not None:
                    return self._record(namespace, (key, row[0], now, expires_at, text))
                found = await (await conn.execute(self._q.record_version, params)).fetchone()
                check_record_version(namespace, key, found[0] if found else 0, expected_version)
            raise StoreUnavailableError(f"record {namespace}/{key} keeps changing; retry later")

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
        params = {
            "t": tenant,
            "ns": namespace,
            "low": prefix,
            "high": prefix + KEY_END,
            "after": after_key or "",
            "now": utcnow(),
            "limit": limit,
        }

        async def run(conn: Connection) -> RecordList:
            found, batch = RecordList(), dict(params)  # a retry starts from the beginning
            while True:  # more batches only when damaged rows took places in this one
                cur = await conn.execute(self._q.list_records, batch)
                rows = await cur.fetchall()
                for row in rows:
                    decode = partial(self._record, namespace, row)
                    if not add_record(found, limit, row[0], decode, row[4]):
                        return found
                if not rows or len(rows) < limit:
                    return found
                batch["after"] = rows[-1][0]

        return await self._run(run, idempotent=True)

    async def delete_record(
        self, tenant: str, namespace: str, key: str, *, expected_version: int | None = None
    ) -> None:
        check_record_ids(tenant, namespace, key)

        async def delete(conn: Connection) -> None:
            for _ in range(ATTEMPTS):
                params = {"t": tenant, "ns": namespace, "k": key, "now": utcnow()}
                params["ver"] = expected_version
                cur = await conn.execute(self._q.delete_record, params)
                if await cur.fetchone() is not None:
                    return
                found = await (await conn.execute(self._q.record_version, params)).fetchone()
                if found is None:
                    raise record_not_found(namespace, key)
                check_record_version(namespace, key, found[0], expected_version)
            raise StoreUnavailableError(f"record {namespace}/{key} keeps changing; retry later")

        await self._write(delete)

    async def list_key_heads(
        self, tenant: str, namespace: str, *, prefix: str, separator: str
    ) -> list[str]:
        """See `statekeeper.stores.record_query`: a skip scan, one index seek per head. A
        head whose first record is not JSON is kept only if another record counts."""
        check_record_listing(tenant, namespace, prefix, 1)
        if not separator:
            raise InvalidInputError("list_key_heads needs a separator")
        params = {
            "t": tenant,
            "ns": namespace,
            "low": prefix,
            "high": prefix + KEY_END,
            "now": utcnow(),
            "sep": separator,
        }

        heads = []
        for key, value in await self._select(_key_heads_sql(self._q.quoted), params):
            head, sep, _ = key.partition(separator)
            if not sep:
                continue
            try:
                loads(value)
            except ValueError:  # damaged: does any other record of the head count?
                rest = await self.list_records(tenant, namespace, prefix=head + sep, limit=1)
                if not rest:
                    continue
            heads.append(head)
        return heads

    # -- events ----------------------------------------------------------------------------

    async def append_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft]
    ) -> list[Event]:
        texts = event_texts(tenant, log_id, events, self.max_payload_bytes)
        if not events:
            return []
        write = EventWrite(log_id, events, texts)
        return await self._write(lambda conn: log_events(self, conn, tenant, write))

    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        check_record_ids(tenant, log_id)
        check_read(after_seq, None, limit)

        out: list[Event] = []
        rows = await self._select(self._q.read_events, (tenant, log_id, after_seq, limit))
        for seq, stream, kind, ts, text in rows:
            try:
                payload = loads(text)
            except ValueError as exc:
                payload = {"error": f"corrupt event: {exc}", "raw": str(text)[:200]}
                stream, kind = "error", "corrupt"
            out.append(Event(log_id, seq, stream, kind, ts, payload))
        return out

    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        check_record_ids(tenant, log_id)

        async def delete(conn: Connection) -> None:
            # The log's row first: an append in flight holds it, and is then deleted too.
            await conn.execute(self._q.delete_event_log, (tenant, log_id))
            await conn.execute(self._q.delete_events, (tenant, log_id))

        await self._write(delete, tx=True)

    async def rewrite_event_payloads(
        self, tenant: str, log_id: str, payloads: Mapping[int, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses)."""
        check_record_ids(tenant, log_id)
        checked = check_rewrites(payloads, events=True, limit=self.max_payload_bytes)
        if not checked:
            return 0

        async def rewrite(conn: Connection) -> int:
            cur = await conn.execute(self._q.event_payloads, (tenant, log_id, list(checked)))
            done = 0
            for seq, stored in await cur.fetchall():
                expected, text = checked[seq]
                if same_payload(stored, expected):
                    await conn.execute(self._q.rewrite_event, (text, tenant, log_id, seq))
                    done += 1
            return done

        return await self._write(rewrite, tx=True)
