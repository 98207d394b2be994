"""Versioned records and event logs of the Redis store (see `statekeeper.stores.redis`).

A record is a hash (version, updated and expiry times, value JSON) plus a member of its
namespace's index, a sorted set whose members all score 0 so they sort by bytes (the
key order every backend lists in). Writes are compare-and-set scripts. A record written
with ``expires_at`` also expires in Redis a minute later (so clock skew between client
and server never hides a live record); until then the client clock decides, like every
backend. Index members of records Redis expired are removed when a listing meets them.

An event log is a Redis stream whose entry ids are ``<seq>-0``: a script takes the next
seqs from the last id, so they are gap-free and start at 1 (again after a delete), and
other processes can follow a log with XREAD from any seq. The same script adds a notice
(log id, first and last seq) to the tenant's capped notice stream, so a process can
follow every log of a tenant (see `statekeeper.stores.redis.coordination`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from pydantic import JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.jsoncodec import loads
from statekeeper.stores.base import Event, EventDraft, RecordList, VersionedRecord
from statekeeper.stores.redis.base import RedisBase, decode_event, dt, to_bytes, to_text, us
from statekeeper.stores.redis.scripts import (
    APPEND_EVENTS,
    DELETE_RECORD,
    LIST_RECORDS,
    PUT_RECORD,
    REWRITE_EVENTS,
)
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

__all__ = ["EVENT_NOTICES_KEPT", "RedisRecords"]

_EXPIRY_GRACE_MS = 60_000
EVENT_NOTICES_KEPT = 10_000
"""About how many notices (log id, first seq, last seq) each tenant's notice stream keeps."""


class RedisRecords(RedisBase):
    """The record and event-log part of `RedisStore`."""

    # -- records -------------------------------------------------------------------------

    def _record(self, namespace: str, key: str, row: Sequence[Any]) -> VersionedRecord:
        version, updated_us, expires_us, text = row
        return VersionedRecord(
            namespace=namespace,
            key=key,
            value=record_value(namespace, key, text),
            version=int(version),
            updated_at=dt(int(updated_us)),
            expires_at=dt(int(expires_us)) if expires_us else None,
        )

    async def get_record(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        check_record_ids(tenant, namespace, key)
        client = self._redis
        with self._translated():
            row = await client.hmget(self.keys.record(tenant, namespace, key), "v", "u", "x", "d")
        if row[0] is None or (row[2] and int(row[2]) <= us(utcnow())):
            raise record_not_found(namespace, key)
        return self._record(namespace, key, row)

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
        now = us(utcnow())
        expires = "" if expires_at is None else us(expires_at)
        redis_expiry = "" if expires_at is None else us(expires_at) // 1000 + _EXPIRY_GRACE_MS
        reply = await self._run(
            PUT_RECORD,
            [self.keys.record(tenant, namespace, key), self.keys.record_index(tenant, namespace)],
            [now, _optional(expected_version), text, now, expires, key, redis_expiry],
        )
        if reply[0] == 0:
            check_record_version(namespace, key, int(reply[1]), expected_version)
        return self._record(namespace, key, (reply[1], now, expires, text))

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
        low = f"({after_key}" if after_key is not None and after_key >= prefix else f"[{prefix}"
        high = f"({prefix}\x7f" if prefix else "+"
        found = RecordList()
        batch = min(max(limit, 16), 1000)
        while len(found) < limit:
            reply = await self._run(
                LIST_RECORDS,
                [self.keys.record_index(tenant, namespace)],
                [self.keys.records(tenant, namespace), low, high, batch],
            )
            now = us(utcnow())
            for i in range(2, len(reply), 5):
                key, row = to_text(reply[i]), reply[i + 1 : i + 5]
                if row[2] and int(row[2]) <= now:
                    continue  # expired
                decode = partial(self._record, namespace, key, row)
                if not add_record(found, limit, key, decode, row[3]):
                    return found
            if int(reply[0]) < batch:
                break
            low = f"({to_text(reply[1])}"
        return found

    async def delete_record(
        self, tenant: str, namespace: str, key: str, *, expected_version: int | None = None
    ) -> None:
        check_record_ids(tenant, namespace, key)
        reply = await self._run(
            DELETE_RECORD,
            [self.keys.record(tenant, namespace, key), self.keys.record_index(tenant, namespace)],
            [us(utcnow()), _optional(expected_version), key],
        )
        if reply[0] == 0:
            raise record_not_found(namespace, key)
        if reply[0] == 1:
            check_record_version(namespace, key, int(reply[1]), expected_version)

    # -- events --------------------------------------------------------------------------

    async def append_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft]
    ) -> list[Event]:
        texts = event_texts(tenant, log_id, events, self.max_payload_bytes)
        if not events:
            return []
        first = await self._log_events(tenant, log_id, events, texts)
        return [
            Event(log_id, first + i, e.stream, e.kind, dt(us(e.ts)), loads(text))
            for i, (e, text) in enumerate(zip(events, texts, strict=True))
        ]

    async def _log_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft], texts: Sequence[str]
    ) -> int:
        """Append checked events (``texts``: their payloads' JSON) to the log and note it
        tenant-wide, in one script: the first new seq."""
        args: list[Any] = [log_id, EVENT_NOTICES_KEPT]
        for event, text in zip(events, texts, strict=True):
            args += [event.stream, event.kind, us(event.ts), text]
        keys = [self.keys.events(tenant, log_id), self.keys.event_notices(tenant)]
        return int(await self._run(APPEND_EVENTS, keys, args))

    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        check_record_ids(tenant, log_id)
        if check_read(after_seq, None, limit) == 0:
            return []
        client = self._redis
        with self._translated():
            rows: Any = await client.xrange(
                self.keys.events(tenant, log_id), f"{max(after_seq, 0) + 1}-0", "+", count=limit
            )
        return [decode_event(log_id, entry_id, fields) for entry_id, fields in rows or ()]

    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        check_record_ids(tenant, log_id)
        client = self._redis
        with self._translated():
            await client.unlink(self.keys.events(tenant, log_id))

    async def rewrite_event_payloads(
        self, tenant: str, log_id: str, payloads: Mapping[int, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses)."""
        check_record_ids(tenant, log_id)
        checked = check_rewrites(payloads, events=True, limit=self.max_payload_bytes)
        key = self.keys.events(tenant, log_id)
        args: list[Any] = []
        client = self._redis
        for seq, (expected, text) in checked.items():
            with self._translated():
                rows: Any = await client.xrange(key, f"{seq}-0", f"{seq}-0")
            fields = {to_text(k): v for k, v in dict(rows[0][1]).items()} if rows else {}
            stored = fields.get("p")
            raw = None if stored is None else to_bytes(stored).decode(errors="replace")
            if raw is not None and same_payload(raw, expected):
                args += [seq, stored, text]
        return int(await self._run(REWRITE_EVENTS, [key], args)) if args else 0


def _optional(value: int | None) -> int | str:
    return "" if value is None else value
