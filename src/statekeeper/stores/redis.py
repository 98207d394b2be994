"""The Redis store (``redis://[[user]:password@]host[:port][/db]``), on redis-py's asyncio client.

Options (query string or keywords): ``prefix`` (key namespace, default ``statekeeper``),
``max_payload_bytes``, ``socket_timeout`` (seconds, default 5). Needs the ``redis``
extra. Durability is the server's: with ``appendonly yes`` and ``appendfsync always`` an
acknowledged write survives a power loss; with Redis' defaults it may lose the last
second (or everything, without persistence).

Keys (see `redis_scripts.Keys`; ``P`` is the prefix, ``{t}`` the tenant as a hash tag)::

    P/{t}/s/<session>      hash    doc (SessionRecord JSON), v (version), g (generation)
    P/{t}/e/<session>      zset    transcript entries scored by seq (header + payload)
    P/{t}/i/<session>      hash    entry id -> seq
    P/{t}/sessions         zset    session ids scored by last_active (microseconds)
    P/{t}/r/<ns>/<key>     hash    v, u (updated_us), x (expires_us), d (value JSON)
    P/{t}/rk/<ns>          zset    record keys of a namespace (score 0: byte order)
    P/{t}/ev/<log>         stream  events, entry id "<seq>-0"; fields s, k, t, p

Atomicity: every write is one Lua script (`redis_scripts`), never a read-modify-write
over several round trips. Appends and head updates are planned in Python with the
shared rules (`plan_append`, `apply_patch`) against the head this handle last saw, then
committed by a script that compares the stored head's generation and version first
(compare-and-set) and checks that no draft id is stored yet. When another writer got
there first, the script answers with the current head and any stored drafts instead of
writing, and the append is planned again from that state; so the common case costs one
round trip, and a replayed retry is detected under the same atomic check. The
generation is a random token set at creation, so a session deleted and created again
never matches a version seen before. Writers of one session in one handle queue on a
lock instead of racing each other. Records (compare-and-set on their version) and events
(the next seqs taken from the stream's last id) are single scripts too.

A Redis key of a record with ``expires_at`` also expires in Redis a minute after it (so
clock skew between client and server never hides a live record); until then the client
clock decides, like every backend. Lost connections and timeouts raise
`StoreUnavailableError` (redis-py's own retries are off: a write whose reply was lost may
have been applied, and only the caller knows whether repeating it is safe; an append
retried with the same entry ids replays). A read-only replica raises
`StoreReadOnlyError`, ``maxmemory`` reached `StoreFullError`. Passwords never appear in
``url`` or in error messages.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    AlreadyExistsError,
    InvalidInputError,
    MissingExtraError,
    NotFoundError,
    PayloadTooLargeError,
    StatekeeperError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, encode_json, gc_paused, loads
from statekeeper.stores.base import (
    AppendPlan,
    AppendResult,
    Entry,
    EntryDraft,
    Event,
    EventDraft,
    Page,
    SessionPatch,
    SessionQuery,
    SessionRecord,
    Store,
    VersionedRecord,
    apply_patch,
    check_tenant_and_id,
    check_version,
    corrupt_entry,
    decode_cursor,
    encode_cursor,
    matches_query,
    plan_append,
    prunable,
)
from statekeeper.stores.common import (
    check_expiry,
    check_limit,
    check_prunable_kind,
    check_record_ids,
    check_record_version,
    check_session_record,
    new_session_record,
    record_not_found,
    session_not_found,
)
from statekeeper.stores.redis_scripts import (
    APPEND_EVENTS,
    COMMIT,
    CREATE_SESSION,
    DELETE_RECORD,
    DELETE_SESSION,
    GET_ENTRY,
    LINKS,
    LIST_RECORDS,
    LIST_SESSIONS,
    PRUNE,
    PUT_RECORD,
    READ_ENTRIES,
    Keys,
    Script,
)

try:
    from redis import exceptions as rx
    from redis.asyncio import Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError:  # pragma: no cover - depends on the environment
    raise MissingExtraError("Redis store", "redis") from None

__all__ = ["RedisStore", "open_redis"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EXPIRY_GRACE_MS = 60_000
_MAX_CACHED_HEADS = 10_000
_NO_PATCH = SessionPatch()
_UNAVAILABLE_REPLIES = ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")


def _us(value: datetime) -> int:
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _dt(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStore:
    """A store in a Redis server. ``RedisStore(client)`` uses a client you own;
    `RedisStore.from_url` (or ``open_store("redis://...")``) opens and owns one."""

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = "statekeeper",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        owns_client: bool = False,
    ) -> None:
        validate_id(prefix, "key prefix")
        self.prefix = prefix
        self.max_payload_bytes = max_payload_bytes
        self.keys = Keys(prefix)
        self._client: Redis | None = client
        self._owns_client = owns_client
        info = client.connection_pool.connection_kwargs
        where = info.get("path") or f"{info.get('host', 'localhost')}:{info.get('port', 6379)}"
        self._where = f"{where}/{info.get('db', 0)}"
        self.url = f"redis://{self._where}?prefix={prefix}"
        self._shas: dict[str, str] = {}
        # (tenant, id) -> (generation, head) as this handle last wrote or read it.
        self._heads: dict[tuple[str, str], tuple[bytes, SessionRecord]] = {}
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]] = {}

    @classmethod
    async def from_url(
        cls,
        url: str,
        *,
        prefix: str = "statekeeper",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        socket_timeout: float = 5.0,
    ) -> RedisStore:
        """Connect to ``url`` (checked with a PING) and own the connection pool."""
        client = Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
            protocol=2,
        )
        return await cls._opened(client, prefix, max_payload_bytes)

    @classmethod
    async def _opened(cls, client: Redis, prefix: str, max_payload_bytes: int) -> RedisStore:
        try:
            store = cls(
                client, prefix=prefix, max_payload_bytes=max_payload_bytes, owns_client=True
            )
        except BaseException:
            await client.aclose()
            raise
        try:
            with store._translated():
                await client.ping()
        except BaseException:
            await store.close()
            raise
        return store

    def __del__(self) -> None:
        if getattr(self, "_owns_client", False) and getattr(self, "_client", None) is not None:
            warnings.warn(
                f"RedisStore({self._where}) was not closed; call await store.close()",
                ResourceWarning,
                stacklevel=1,
            )

    async def close(self) -> None:
        """Close the connection pool if this store opened it. Idempotent."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            await client.aclose()

    # -- plumbing ------------------------------------------------------------------------

    @property
    def _redis(self) -> Redis:
        if self._client is None:
            raise StoreUnavailableError("the store is closed; open a new one")
        return self._client

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """Translate redis-py and socket errors into statekeeper's (see `_translate`)."""
        try:
            yield
        except (rx.RedisError, OSError) as exc:
            raise _translate(exc, self._where) from exc

    async def _run(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """EVALSHA, loading the script first if the server does not know it (a restart)."""
        client = self._redis
        with self._translated():
            try:
                return await client.evalsha(script.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
            except rx.NoScriptError:
                await client.script_load(script.source)
                return await client.evalsha(script.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]

    @asynccontextmanager
    async def _serial(self, key: tuple[str, str]) -> AsyncIterator[None]:
        """Queue this handle's writers of one session (other handles still race: CAS)."""
        slot = self._locks.get(key)
        if slot is None:
            slot = self._locks[key] = (asyncio.Lock(), [0])
        slot[1][0] += 1
        try:
            async with slot[0]:
                yield
        finally:
            slot[1][0] -= 1
            if not slot[1][0]:
                del self._locks[key]

    def _remember(self, tenant: str, generation: bytes, record: SessionRecord) -> None:
        if len(self._heads) >= _MAX_CACHED_HEADS:
            del self._heads[next(iter(self._heads))]
        self._heads[tenant, record.id] = (generation, record)

    def _head_doc(self, session_id: str, doc: bytes | str) -> SessionRecord:
        try:
            return SessionRecord.model_validate_json(doc)
        except ValueError as exc:
            raise StoreCorruptError(
                f"the record of session {session_id!r} in Redis {self._where} cannot be "
                f"decoded: {exc}"
            ) from exc

    async def _commit(
        self,
        tenant: str,
        session_id: str,
        base: tuple[bytes, int],
        record: SessionRecord | None,
        ids: Sequence[str] = (),
        entries: Sequence[tuple[int, bytes]] = (),
    ) -> tuple[bytes, SessionRecord, dict[str, Entry]] | None:
        """Write ``record`` (and entries) over head ``base``; None when written.

        Otherwise the current (generation, head, stored drafts among ``ids``) to plan
        again from. A ``record`` of None (with an impossible base) only reads.
        """
        doc = record.model_dump_json() if record is not None else ""
        if len(doc) > self.max_payload_bytes:
            raise PayloadTooLargeError(
                f"session {session_id!r} record would be {len(doc)} bytes; "
                f"the limit is {self.max_payload_bytes}"
            )
        args: list[Any] = [
            base[0],
            base[1],
            record.version if record is not None else 0,
            doc,
            _us(record.last_active) if record is not None else 0,
            session_id,
            len(ids),
            *ids,
        ]
        for seq, member in entries:
            args += [seq, member]
        reply = await self._run(COMMIT, self.keys.session_keys(tenant, session_id), args)
        if reply[0] == 1:
            assert record is not None
            self._remember(tenant, base[0], record)
            return None
        if reply[0] == 0:
            self._heads.pop((tenant, session_id), None)
            raise session_not_found(session_id)
        generation = _bytes(reply[1])
        current = self._head_doc(session_id, reply[2])
        self._remember(tenant, generation, current)
        found = {}
        for i in range(3, len(reply), 3):
            entry = _entry(_bytes(reply[i + 2]), int(reply[i + 1]))
            found[_text(reply[i])] = entry
        return generation, current, found

    async def _state(
        self, tenant: str, session_id: str, ids: Sequence[str] = ()
    ) -> tuple[bytes, SessionRecord, dict[str, Entry]]:
        state = await self._commit(tenant, session_id, (b"", 0), None, ids)
        assert state is not None
        return state

    # -- sessions ------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        record = new_session_record(record, self.max_payload_bytes)
        generation = os.urandom(8).hex().encode()
        created = await self._run(
            CREATE_SESSION,
            self.keys.session_keys(record.tenant, record.id),
            [generation, record.model_dump_json(), _us(record.last_active), record.id],
        )
        if not created:
            raise AlreadyExistsError(f"session {record.id!r} already exists")
        self._remember(record.tenant, generation, record)
        return record

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)
        client = self._redis
        with self._translated():
            generation, doc = await client.hmget(self.keys.head(tenant, session_id), "g", "doc")
        if generation is None or doc is None:
            raise session_not_found(session_id)
        record = self._head_doc(session_id, doc)
        self._remember(tenant, _bytes(generation), record)
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

        def plan(record: SessionRecord) -> SessionRecord:
            check_version(record, expected_version)
            updated = apply_patch(record, patch, now=utcnow())
            if patch.set:
                check_session_record(updated, self.max_payload_bytes)
            return updated

        async with self._serial((tenant, session_id)):
            state = None
            cached = self._heads.get((tenant, session_id))
            if cached is not None:
                try:
                    updated = plan(cached[1])
                except StatekeeperError:
                    pass  # perhaps only because the cached head is stale: check below
                else:
                    base = (cached[0], cached[1].version)
                    state = await self._commit(tenant, session_id, base, updated)
                    if state is None:
                        return updated
            if state is None:
                state = await self._state(tenant, session_id)
            while True:
                generation, record, _ = state
                updated = plan(record)
                state = await self._commit(tenant, session_id, (generation, record.version), updated)
                if state is None:
                    return updated

    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        validate_id(tenant, "tenant")
        position = decode_cursor(query.cursor) if query.cursor is not None else None
        highs = [_us(position[0])] if position is not None else []
        if query.active_before is not None:
            highs.append(_us(query.active_before))
        high = str(min(highs)) if highs else "+inf"
        low = str(_us(query.active_after)) if query.active_after is not None else "-inf"
        batch = min(max(query.offset + query.limit + 1, 64), 1000)
        skip = query.offset
        found: list[SessionRecord] = []
        seen: set[str] = set()
        start = 0
        while len(found) <= query.limit:
            reply = await self._run(
                LIST_SESSIONS,
                [self.keys.sessions(tenant)],
                [self.keys.heads(tenant), high, low, start, batch],
            )
            start += int(reply[0])
            with gc_paused():
                for doc in reply[1:]:
                    record = self._head_doc("(listed)", doc)
                    if record.id in seen or not matches_query(record, query):
                        continue  # (seen: moved by a concurrent update between batches)
                    seen.add(record.id)
                    if position is not None and (record.last_active, record.id) >= position:
                        continue
                    if skip:
                        skip -= 1
                    else:
                        found.append(record)
            if int(reply[0]) < batch:
                break
        items = found[: query.limit]
        more = len(found) > query.limit
        cursor = encode_cursor(items[-1].last_active, items[-1].id) if more else None
        return Page(items=items, next_cursor=cursor)

    async def delete_session(self, tenant: str, session_id: str) -> None:
        check_tenant_and_id(tenant, session_id)
        deleted = await self._run(
            DELETE_SESSION, self.keys.session_keys(tenant, session_id), [session_id]
        )
        self._heads.pop((tenant, session_id), None)
        if not deleted:
            raise session_not_found(session_id)

    # -- transcripts ---------------------------------------------------------------------

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
        ids = [d.id for d in drafts]

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

        async def commit(generation: bytes, planned: AppendPlan) -> Any:
            members = [
                (e.seq, _member(e, text)) for e, text in zip(planned.entries, planned.encoded)
            ]
            base = (generation, planned.session.version - 1)
            return await self._commit(tenant, session_id, base, planned.session, ids, members)

        async with self._serial((tenant, session_id)):
            state = None
            cached = self._heads.get((tenant, session_id))
            if cached is not None:
                try:
                    planned = plan(cached[1], {})
                except StatekeeperError:
                    pass  # perhaps only because the cached head is stale, or a replay
                else:
                    state = await commit(cached[0], planned)
                    if state is None:
                        return AppendResult(session=planned.session, entries=planned.entries)
            if state is None:
                state = await self._state(tenant, session_id, ids)
            while True:
                generation, record, existing = state
                planned = plan(record, existing)
                if planned.replayed:
                    return AppendResult(session=record, entries=planned.replayed, replayed=True)
                state = await commit(generation, planned)
                if state is None:
                    return AppendResult(session=planned.session, entries=planned.entries)

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
        if limit == 0:
            await self.get_session(tenant, session_id)
            return []
        reply = await self._run(
            READ_ENTRIES,
            [self.keys.head(tenant, session_id), self.keys.entries(tenant, session_id)],
            [f"({after_seq}", "+inf" if until_seq is None else until_seq, limit or ""],
        )
        if reply[0] == 0:
            raise session_not_found(session_id)
        with gc_paused():
            return [_entry(_bytes(reply[i]), int(reply[i + 1])) for i in range(1, len(reply), 2)]

    async def get_entry(self, tenant: str, session_id: str, entry_id: str) -> Entry:
        check_tenant_and_id(tenant, session_id)
        validate_id(entry_id, "entry id")
        reply = await self._run(
            GET_ENTRY, self.keys.session_keys(tenant, session_id)[:3], [entry_id]
        )
        if reply[0] == 0:
            raise session_not_found(session_id)
        if reply[0] == 1:
            raise NotFoundError(f"entry {entry_id!r} not found in session {session_id!r}")
        return _entry(_bytes(reply[1]), int(reply[2]))

    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        check_tenant_and_id(tenant, session_id)
        check_prunable_kind(kind)
        keys = self.keys.session_keys(tenant, session_id)
        async with self._serial((tenant, session_id)):
            while True:
                reply = await self._run(LINKS, keys[:2], [])
                if reply == [0]:
                    raise session_not_found(session_id)
                record = self._head_doc(session_id, reply[1])
                links = [
                    _entry(_bytes(reply[i + 1]), int(reply[i]), payload=False)
                    for i in range(2, len(reply), 2)
                ]
                doomed = set(prunable(links, record, kind, before_seq, id_prefix))
                if not doomed:
                    return 0
                updated = apply_patch(record, _NO_PATCH, now=utcnow())
                args: list[Any] = [reply[0], record.version, updated.version]
                args += [updated.model_dump_json(), _us(updated.last_active), session_id]
                for entry in links:
                    if entry.seq in doomed:
                        args += [entry.seq, entry.id]
                done = await self._run(PRUNE, keys, args)
                if done[0] == 0:
                    raise session_not_found(session_id)
                if done[0] == 1:
                    self._remember(tenant, _bytes(reply[0]), updated)
                    return len(doomed)

    # -- records -------------------------------------------------------------------------

    def _record(self, namespace: str, key: str, row: Sequence[Any]) -> VersionedRecord:
        version, updated_us, expires_us, text = row
        try:
            value = loads(text)
        except ValueError as exc:
            raise StoreCorruptError(f"record {namespace}/{key} cannot be decoded: {exc}") from exc
        return VersionedRecord(
            namespace=namespace,
            key=key,
            value=value,
            version=int(version),
            updated_at=_dt(int(updated_us)),
            expires_at=_dt(int(expires_us)) if expires_us else None,
        )

    async def get_record(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        check_record_ids(tenant, namespace, key)
        client = self._redis
        with self._translated():
            row = await client.hmget(self.keys.record(tenant, namespace, key), "v", "u", "x", "d")
        if row[0] is None or (row[2] and int(row[2]) <= _us(utcnow())):
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
        check_record_ids(tenant, namespace, key)
        check_expiry(expires_at)
        text = encode_json(value, what=f"record {namespace}/{key}", limit=self.max_payload_bytes)
        now = _us(utcnow())
        expires = "" if expires_at is None else _us(expires_at)
        redis_expiry = "" if expires_at is None else _us(expires_at) // 1000 + _EXPIRY_GRACE_MS
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
    ) -> list[VersionedRecord]:
        check_record_ids(tenant, namespace)
        check_limit(limit)
        if prefix:
            validate_id(prefix, "key prefix")
        low = f"({after_key}" if after_key is not None and after_key >= prefix else f"[{prefix}"
        high = f"({prefix}\x7f" if prefix else "+"
        out: list[VersionedRecord] = []
        batch = min(max(limit, 16), 1000)
        while len(out) < limit:
            reply = await self._run(
                LIST_RECORDS,
                [self.keys.record_index(tenant, namespace)],
                [self.keys.records(tenant, namespace), low, high, batch],
            )
            now = _us(utcnow())
            for i in range(2, len(reply), 5):
                row = reply[i + 1 : i + 5]
                if (not row[2] or int(row[2]) > now) and len(out) < limit:
                    out.append(self._record(namespace, _text(reply[i]), row))
            if int(reply[0]) < batch:
                break
            low = f"({_text(reply[1])}"
        return out

    async def delete_record(
        self, tenant: str, namespace: str, key: str, *, expected_version: int | None = None
    ) -> None:
        check_record_ids(tenant, namespace, key)
        reply = await self._run(
            DELETE_RECORD,
            [self.keys.record(tenant, namespace, key), self.keys.record_index(tenant, namespace)],
            [_us(utcnow()), _optional(expected_version), key],
        )
        if reply[0] == 0:
            raise record_not_found(namespace, key)
        if reply[0] == 1:
            check_record_version(namespace, key, int(reply[1]), expected_version)

    # -- events --------------------------------------------------------------------------

    async def append_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft]
    ) -> list[Event]:
        check_record_ids(tenant, log_id)
        texts = [
            encode_json(e.payload, what=f"event {e.stream}/{e.kind}", limit=self.max_payload_bytes)
            for e in events
        ]
        if not events:
            return []
        args: list[Any] = []
        for event, text in zip(events, texts, strict=True):
            args += [event.stream, event.kind, _us(event.ts), text]
        first = int(await self._run(APPEND_EVENTS, [self.keys.events(tenant, log_id)], args))
        return [
            Event(log_id, first + i, e.stream, e.kind, _dt(_us(e.ts)), loads(text))
            for i, (e, text) in enumerate(zip(events, texts, strict=True))
        ]

    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        check_record_ids(tenant, log_id)
        if check_limit(limit) == 0:
            return []
        client = self._redis
        with self._translated():
            rows = await client.xrange(
                self.keys.events(tenant, log_id), f"{max(after_seq, 0) + 1}-0", "+", count=limit
            )
        return [event_from_stream(log_id, entry_id, fields) for entry_id, fields in rows]

    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        check_record_ids(tenant, log_id)
        client = self._redis
        with self._translated():
            await client.unlink(self.keys.events(tenant, log_id))


# -- encoding ------------------------------------------------------------------------------


def _optional(value: int | None) -> int | str:
    return "" if value is None else value


def _member(entry: Entry, text: str) -> bytes:
    """An entry as stored: its JSON header, a newline, its payload's JSON text."""
    header = encode_json(
        [entry.id, entry.parent_seq, entry.kind, _us(entry.created_at)],
        what=f"entry {entry.id!r}",
    )
    return f"{header}\n{text}".encode()


def _entry(member: bytes, seq: int, *, payload: bool = True) -> Entry:
    """Decode a stored entry; undecodable bytes become a "corrupt" entry, never a skip."""
    header, _, body = member.partition(b"\n")
    try:
        entry_id, parent, kind, created_us = loads(header)
        created = _dt(created_us)
        if not isinstance(entry_id, str) or not isinstance(kind, str):
            raise ValueError("entry header has the wrong types")
    except (ValueError, TypeError) as exc:
        raw = member.decode(errors="replace")
        return corrupt_entry(seq, f"corrupt-{seq}", None, _EPOCH, raw, f"bad header: {exc}")
    if not payload:
        return Entry(seq, entry_id, parent, kind, created, {})
    try:
        data = loads(body)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    except ValueError as exc:
        raw = body.decode(errors="replace")
        return corrupt_entry(seq, entry_id, parent, created, raw, str(exc))
    return Entry(seq, entry_id, parent, kind, created, data)


def event_from_stream(log_id: str, entry_id: bytes | str, fields: dict[Any, Any]) -> Event:
    """An event from its stream entry (also used by cross-process subscribers)."""
    seq = int(_text(entry_id).partition("-")[0])
    get = {_text(k): v for k, v in fields.items()}
    try:
        payload = loads(get["p"])
        stream, kind, ts = _text(get["s"]), _text(get["k"]), _dt(int(get["t"]))
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raw = str(get.get("p", b""))[:200]
        return Event(log_id, seq, "error", "corrupt", _EPOCH, {"error": str(exc), "raw": raw})
    return Event(log_id, seq, stream, kind, ts, payload)


def _translate(exc: Exception, where: str) -> StoreError:
    """The most specific statekeeper error for a redis-py or socket error."""
    text = str(exc)
    if isinstance(exc, rx.ReadOnlyError) or text.startswith("READONLY"):
        return StoreReadOnlyError(
            f"Redis at {where} is a read-only replica and refuses writes ({text}); "
            "connect to the primary"
        )
    if isinstance(exc, rx.OutOfMemoryError) or text.startswith("OOM"):
        return StoreFullError(
            f"Redis at {where} is out of memory ({text}); free memory or raise maxmemory"
        )
    if isinstance(exc, rx.AuthenticationError | rx.AuthenticationWrongNumberOfArgsError):
        return StoreUnavailableError(
            f"Redis at {where} refused the credentials ({text}); check the user and password"
        )
    if isinstance(exc, rx.NoPermissionError):
        return StoreUnavailableError(
            f"the Redis user may not run this command at {where} ({text}); check its ACL"
        )
    if isinstance(exc, rx.ConnectionError | rx.TimeoutError | OSError) or text.startswith(
        _UNAVAILABLE_REPLIES
    ):
        return StoreUnavailableError(
            f"cannot reach Redis at {where} ({text or type(exc).__name__}); retry when it is back"
        )
    if text.startswith("WRONGTYPE"):
        return StoreCorruptError(
            f"a key under this store's prefix at {where} holds another type ({text}); "
            "is another application writing under the same prefix?"
        )
    return StoreError(f"Redis at {where}: {text}")


# -- opening from a URL --------------------------------------------------------------------


async def open_redis(location: str, options: dict[str, str]) -> Store:
    """``redis://[[user]:password@]host[:port][/db]`` or ``redis:///path/to/redis.sock``."""
    from statekeeper.stores.opening import _no_more, _take

    prefix = options.pop("prefix", "statekeeper")
    validate_id(prefix, "key prefix")
    limit = _take(options, "max_payload_bytes", int, DEFAULT_MAX_PAYLOAD_BYTES)
    timeout = _take(options, "socket_timeout", float, 5.0)
    _no_more(options, "redis")
    client = Redis(
        **_connection(location),
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        protocol=2,
    )
    return await RedisStore._opened(client, prefix, limit)


def _connection(location: str) -> dict[str, Any]:
    """Connection arguments from the URL's unquoted netloc + path (password included)."""
    userinfo, at, address = location.rpartition("@")
    settings: dict[str, Any] = {}
    if at:
        username, colon, password = userinfo.partition(":")
        settings["username"] = username or None
        settings["password"] = password if colon else None
    if address.startswith("/"):
        settings["unix_socket_path"] = address
        return settings
    hostport, _, db = address.partition("/")
    if hostport.startswith("["):  # [IPv6]:port
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = hostport.partition(":")
    try:
        settings["host"] = host or "localhost"
        settings["port"] = int(port) if port else 6379
        settings["db"] = int(db.strip("/")) if db.strip("/") else 0
    except ValueError:
        # The address, never the credentials, goes into the message.
        raise InvalidInputError(
            f"invalid Redis address {address!r}; use redis://host:port/db"
        ) from None
    return settings
