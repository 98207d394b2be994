"""The Redis store (``redis://[[user]:password@]host[:port][/db]``), on redis-py's asyncio client.

Options (query string or keywords): ``prefix`` (key namespace, default ``statekeeper``),
``max_payload_bytes``, ``socket_timeout`` (seconds, default 5). Needs the ``redis``
extra. Durability is the server's: with ``appendonly yes`` and ``appendfsync always`` an
acknowledged write survives a power loss; with Redis' defaults it may lose the last
second, and without persistence everything on a restart.

Keys (see `keys.Keys`; ``P`` is the prefix, ``{t}`` the tenant as a hash tag)::

    P/{t}/s/<session>      hash    doc (SessionRecord JSON), v (version), g (generation)
    P/{t}/e/<session>      zset    transcript entries scored by seq (header + payload)
    P/{t}/i/<session>      hash    entry id -> seq
    P/{t}/sessions         zset    session ids scored by last_active (microseconds)
    P/{t}/r/<ns>/<key>     hash    v, u (updated_us), x (expires_us), d (value JSON)
    P/{t}/rk/<ns>          zset    record keys of a namespace (score 0: byte order)
    P/{t}/ev/<log>         stream  events, entry id "<seq>-0"; fields s, k, t, p
    P/{t}/evnotices        stream  capped: (log, first seq, last seq) per event batch
    P/{t}/lease/<session>  string  lease holder and fence (the coordination module)
    P/{t}/fence/<session>  string  the session's fencing-token counter (ditto)

Atomicity: every write is one Lua script (`scripts`), never a read-modify-write
spread over round trips. Appends and head updates are planned in Python with the shared
rules (`plan_append`, `apply_patch`) against the head this handle last saw, then
committed by a script that first compares the stored head's generation and version
(compare-and-set) and checks that no draft id is stored yet. When another writer got
there first, the script answers with the current head and the drafts already stored
instead of writing, and the append is planned again from that state: the usual case
costs one round trip, and a retried append is recognised as a replay under the same
atomic check. The generation is a random token set at creation, so a session deleted
and created again never matches a version seen before. Writers of one session through
one handle queue on a lock and are committed together, several changes per script call
(group commit, see `statekeeper.stores.engine`); other handles and processes race, and the
compare-and-set decides. Listing is not one snapshot (each batch of it is).

Why scripts rather than WATCH/MULTI: a WATCH transaction needs a read round trip before
every write and retries under contention; a script checks and writes in one round trip,
and `plan_append` still decides everything in Python. Why a generation: versions
restart at 1 when a session is deleted and created again.

The parts live in sibling modules: `scripts` (keys and Lua), `base` (client, stored
forms), `wire` (running scripts on the store's own connections, errors), `heads` (the
append engine's read and commit primitives), `records` (records and event logs) and
`coordination` (leases and the event feed).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    AlreadyExistsError,
    InvalidInputError,
    NotFoundError,
    StoreCorruptError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, gc_paused
from statekeeper.loops import per_loop
from statekeeper.stores.base import (
    Entry,
    Page,
    SessionPatch,
    SessionQuery,
    SessionRecord,
)
from statekeeper.stores.engine import AppendEngine
from statekeeper.stores.engine_writes import EngineWrites
from statekeeper.stores.options import StoreOptions
from statekeeper.stores.redis.base import (
    DEFAULT_SOCKET_TIMEOUT,
    AnyRedis,
    connect,
    decode_entry,
    dt,
    to_bytes,
    us,
)
from statekeeper.stores.redis.cluster import RedisCluster, connect_cluster, listed_heads
from statekeeper.stores.redis.heads import RedisHeads
from statekeeper.stores.redis.records import RedisRecords
from statekeeper.stores.redis.scripts import (
    CREATE_SESSION,
    DELETE_SESSION,
    GET_ENTRY,
    LINKS,
    LIST_SESSIONS,
    PRUNE,
    READ_ENTRIES,
    REWRITE_ENTRIES,
)
from statekeeper.stores.redis.wire import Replicas
from statekeeper.stores.rules import (
    apply_patch,
    check_prunable_kind,
    check_read,
    check_rewrites,
    check_tenant_and_id,
    decode_cursor,
    matches_query,
    new_session_record,
    page_of,
    prunable,
    same_payload,
    session_not_found,
)

__all__ = ["RedisStore", "open_redis", "open_redis_cluster"]

DEFAULT_WAIT_TIMEOUT = 1.0
"""Seconds a write waits for its replicas (``wait_replicas``) by default."""

_NO_PATCH = SessionPatch()


class RedisStore(EngineWrites, RedisRecords):
    """A store in a Redis server.

    ``RedisStore(client, prefix=...)`` uses a redis-py asyncio client you own (and keep
    open); `RedisStore.open` (or ``open_store("redis://...")``) connects and owns one.
    """

    def __init__(
        self,
        client: AnyRedis,
        *,
        prefix: str = "statekeeper",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        owns_client: bool = False,
        make: Callable[[], AnyRedis] | None = None,
        wait: Replicas | None = None,
    ) -> None:
        super().__init__(
            client,
            prefix=prefix,
            max_payload_bytes=max_payload_bytes,
            owns_client=owns_client,
            make=make,
            wait=wait,
        )
        self._heads = RedisHeads(self)
        self._cached: dict[tuple[str, str], Any] = {}

    @per_loop
    def _engine(self) -> AppendEngine:
        return AppendEngine(
            self._heads, max_payload_bytes=self.max_payload_bytes, heads=self._cached
        )

    @classmethod
    async def open(
        cls,
        location: str = "localhost:6379/0",
        *,
        prefix: str = "statekeeper",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        cluster: bool = False,
        wait: Replicas | None = None,
    ) -> RedisStore:
        """Connect to ``[[user]:password@]host[:port][/db]`` (or a unix socket path),
        or with ``cluster`` to the cluster of seeds ``host:port[,host:port...]``, check
        the server answers, and own the connection pool. ``wait``: after each write,
        wait for that many replicas to confirm it (see `Replicas`)."""

        def make() -> AnyRedis:
            if cluster:
                return connect_cluster(location, socket_timeout=socket_timeout)
            return connect(location, socket_timeout=socket_timeout)

        client = make()
        try:
            store = cls(
                client,
                prefix=prefix,
                max_payload_bytes=max_payload_bytes,
                owns_client=True,
                make=make,
                wait=wait,
            )
        except BaseException:
            await client.aclose()
            raise
        store._home = asyncio.get_running_loop()
        await store._check()
        return store

    # -- sessions ------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        record = new_session_record(record, self.max_payload_bytes)
        generation = os.urandom(8).hex().encode()
        if self.cluster:  # listed before it exists: a created session is always listed
            await self._index(record.tenant, "add", record.id, record.last_active)
        created = await self._run(
            CREATE_SESSION,
            self.keys.session_keys(record.tenant, record.id),
            [generation, record.model_dump_json(), us(record.last_active), record.id],
        )
        if not created:
            raise AlreadyExistsError(f"session {record.id!r} already exists")
        self._engine.remember(record.tenant, generation, record)
        return record

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)
        client = self._redis
        with self._translated():
            generation, doc, live = await client.hmget(
                self.keys.head(tenant, session_id), "g", "doc", "live"
            )
        if generation is None or doc is None:
            raise session_not_found(session_id)
        live = None if live is None else to_bytes(live)
        record = self._heads.decode_parts(tenant, session_id, doc, live)
        self._engine.remember(tenant, to_bytes(generation), record)
        return record

    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        validate_id(tenant, "tenant")
        position = decode_cursor(query.cursor) if query.cursor is not None else None
        highs = [us(position[0])] if position is not None else []
        if query.active_before is not None:
            highs.append(us(query.active_before))
        high = str(min(highs)) if highs else "+inf"
        low = str(us(query.active_after)) if query.active_after is not None else "-inf"
        batch = min(max(query.offset + query.limit + 1, 64), 1000)
        skip = query.offset
        rows: list[tuple[datetime, str, bytes | SessionRecord]] = []
        seen: set[str] = set()
        start = 0
        while len(rows) <= query.limit:
            if self.cluster:
                client = self._redis
                assert isinstance(client, RedisCluster)
                reply = await listed_heads(
                    client, self.keys, self.where, tenant, high, low, start, batch
                )
            else:
                reply = await self._run(
                    LIST_SESSIONS,
                    [self.keys.sessions(tenant)],
                    [self.keys.heads(tenant), high, low, start, batch],
                )
            start += int(reply[0])
            with gc_paused():
                for member in reply[1:]:
                    position_text, _, doc = to_bytes(member).partition(b"\n")
                    score, _, name = position_text.partition(b" ")
                    session_id, active = name.decode(), dt(int(float(score)))
                    if session_id in seen:
                        continue  # moved by a concurrent update between batches
                    seen.add(session_id)
                    if position is not None and (active, session_id) >= position:
                        continue
                    row = self._listed(tenant, session_id, doc, query)
                    if row is None:
                        continue
                    if skip:
                        skip -= 1
                    else:
                        rows.append((active, session_id, row))
            if int(reply[0]) < batch:
                break
        return page_of(rows, tenant, query.limit, f"Redis {self.url}")

    def _listed(
        self, tenant: str, session_id: str, doc: bytes, query: SessionQuery
    ) -> bytes | SessionRecord | None:
        """A listed head if it passes the filters (the raw doc when it cannot be decoded:
        the filters cannot rule it out, so it is reported), else None."""
        try:
            record = self._heads.decode(tenant, session_id, doc)
        except StoreCorruptError:
            return doc
        return record if matches_query(record, query) else None

    async def delete_session(self, tenant: str, session_id: str) -> None:
        check_tenant_and_id(tenant, session_id)
        deleted = await self._run(
            DELETE_SESSION, self.keys.session_keys(tenant, session_id), [session_id]
        )
        self._engine.forget(tenant, session_id)
        if self.cluster:
            await self._index(tenant, "drop", session_id)
        if not deleted:
            raise session_not_found(session_id)

    # -- transcripts ---------------------------------------------------------------------

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
            return [
                decode_entry(to_bytes(reply[i]), int(reply[i + 1])) for i in range(1, len(reply), 2)
            ]

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
        return decode_entry(to_bytes(reply[1]), int(reply[2]))

    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        check_tenant_and_id(tenant, session_id)
        check_prunable_kind(kind)
        keys = self.keys.session_keys(tenant, session_id)
        async with self._engine.serial(tenant, session_id):
            while True:
                reply = await self._run(LINKS, keys[:2], [])
                if reply == [0]:
                    raise session_not_found(session_id)
                record = self._heads.decode(tenant, session_id, reply[1])
                links = [
                    decode_entry(to_bytes(reply[i + 1]), int(reply[i]), payload=False)
                    for i in range(2, len(reply), 2)
                ]
                doomed = set(prunable(links, record, kind, before_seq, id_prefix))
                if not doomed:
                    return 0
                updated = apply_patch(record, _NO_PATCH, now=utcnow())
                args: list[Any] = [reply[0], record.version, updated.version]
                args += [updated.model_dump_json(), us(updated.last_active), session_id]
                for entry in links:
                    if entry.seq in doomed:
                        args += [entry.seq, entry.id]
                done = await self._run(PRUNE, keys, args)
                if done[0] == 0:
                    raise session_not_found(session_id)
                if done[0] == 1:
                    self._engine.remember(tenant, to_bytes(reply[0]), updated)
                    if self.cluster:
                        await self._index(tenant, "touch", session_id, updated.last_active)
                    return len(doomed)

    async def rewrite_entry_payloads(
        self, tenant: str, session_id: str, payloads: Mapping[str, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses)."""
        check_tenant_and_id(tenant, session_id)
        checked = check_rewrites(payloads, events=False, limit=self.max_payload_bytes)
        keys = self.keys.session_keys(tenant, session_id)
        args: list[Any] = []
        for entry_id, (expected, text) in checked.items():
            reply = await self._run(GET_ENTRY, keys[:3], [entry_id])
            if reply[0] == 0:
                raise session_not_found(session_id)
            if reply[0] == 1:
                continue
            member = to_bytes(reply[1])
            header, _, body = member.partition(b"\n")
            if same_payload(body.decode(errors="replace"), expected):
                args += [int(reply[2]), member, header + b"\n" + text.encode()]
        if not args:
            await self.get_session(tenant, session_id)  # NotFoundError when it is gone
            return 0
        return int(await self._run(REWRITE_ENTRIES, keys[:2], args))


async def open_redis(location: str, options: StoreOptions) -> RedisStore:
    """``redis://[[user]:password@]host[:port][/db]`` or ``redis:///path/to/redis.sock``."""
    return await _open(location or "localhost:6379/0", options, cluster=False)


async def open_redis_cluster(location: str, options: StoreOptions) -> RedisStore:
    """``redis+cluster://[[user]:password@]host:port[,host:port...]`` (any nodes of it)."""
    return await _open(location or "localhost:7000", options, cluster=True)


async def _open(location: str, options: StoreOptions, *, cluster: bool) -> RedisStore:
    prefix = options.take("prefix", str, "statekeeper")
    validate_id(prefix, "key prefix")
    limit = options.max_payload_bytes()
    timeout = options.take("socket_timeout", float, DEFAULT_SOCKET_TIMEOUT, positive=True)
    replicas = options.take("wait_replicas", int, 0)
    wait_for = options.take("wait_timeout", float, DEFAULT_WAIT_TIMEOUT, positive=True)
    options.done()
    if replicas < 0:
        raise InvalidInputError(f"wait_replicas must be 0 or more, not {replicas}")
    if replicas and wait_for >= timeout:
        raise InvalidInputError(
            f"wait_timeout ({wait_for} s) must be below socket_timeout ({timeout} s)"
        )
    return await RedisStore.open(
        location,
        prefix=prefix,
        max_payload_bytes=limit,
        socket_timeout=timeout,
        cluster=cluster,
        wait=Replicas(replicas, int(wait_for * 1000)) if replicas else None,
    )
