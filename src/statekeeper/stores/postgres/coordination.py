"""Coordination between processes through PostgreSQL: session locks and event feeds.

Both implement the protocols of `statekeeper.runtime.coordination`: `PgSessionLocks` is a
`SessionLocks`, `PgEventFeed` an `EventFeed`.

`PgSessionLocks` serialises work on a session across processes and machines with
PostgreSQL advisory locks::

    async with PgSessionLocks.from_url("postgresql://app@db/agents") as locks:
        async with locks.hold(tenant, session_id, wait=30):
            ...  # no other holder of (tenant, session_id) on this server runs meanwhile

Each held lock has a connection of its own for as long as it is held, so waiting for
one session never delays another, and a worker that dies (crash, kill, lost network)
loses its connection and with it the lock: nothing stays locked behind a dead process.
The lock key is 64 bits of SHA-256 of (namespace, tenant, session id); two sessions
that share a key (never seen in practice) would share a lock, which costs waiting,
never exclusion.

`PgEventFeed` tells other processes about event appends. A store opened with
``notify_channel=...`` sends, when each event append commits, a NOTIFY naming the schema,
tenant, log and last seq; the feed LISTENs on that channel and yields the notices of one
tenant and schema. `statekeeper.runtime.coordination.feed_bus` keeps a bus live from it::

    store = await open_store(url, notify_channel="statekeeper_events")
    bus = EventBus(store, tenant)
    async with feed_bus(bus, PgEventFeed.from_url(url, channel="statekeeper_events")):
        async for event in bus.subscribe(run_id, from_seq=0):
            ...

Notifications sent while the feed is reconnecting are lost: it then yields a resync.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Self
from urllib.parse import unquote, urlsplit

from statekeeper.errors import (
    InvalidInputError,
    SessionLockLostError,
    SessionLockTimeoutError,
    StatekeeperError,
)
from statekeeper.ids import validate_id
from statekeeper.stores.base import EventNotice
from statekeeper.stores.postgres.conn import (
    Connection,
    closed_by_server,
    parse_location,
    psycopg,
    translate,
)
from statekeeper.stores.postgres.schema import DEFAULT_SCHEMA, validate_channel
from statekeeper.stores.rules import check_tenant_and_id, check_wait

__all__ = [
    "DEFAULT_CHANNEL",
    "PgEventFeed",
    "PgHeldLock",
    "PgSessionLocks",
]

DEFAULT_CHANNEL = "statekeeper_events"
_log = logging.getLogger(__name__)


def _conninfo(url: str, connect_timeout: int) -> tuple[str, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise InvalidInputError(f"not a PostgreSQL URL: {parts.scheme}://...")
    if parts.query:
        raise InvalidInputError("pass options as keyword arguments, not in the URL's query")
    extra = {"connect_timeout": str(connect_timeout)}
    return parse_location(unquote(parts.netloc + parts.path), extra)


async def _connect(conninfo: str, url: str) -> Connection:
    try:
        return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    except psycopg.Error as exc:
        raise translate(exc, f"cannot connect to {url}") from exc


# -- session locks -------------------------------------------------------------------------


@dataclass(frozen=True)
class PgHeldLock:
    """A lock being held: its key, and a check that it still is."""

    tenant: str
    session_id: str
    key: int
    _conn: Connection

    async def check(self) -> None:
        """Raise `SessionLockLostError` if the lock's connection (so the lock) was lost.

        A round trip to the server: the connection may have died unnoticed.
        """
        try:
            await self._conn.execute(b"SELECT 1")
        except psycopg.Error as exc:
            raise SessionLockLostError(self.session_id, f": its connection failed ({exc})") from exc


class PgSessionLocks:
    """Per-session locks shared by every process connected to one PostgreSQL server.

    Args:
        conninfo: libpq connection settings (see `from_url` for a URL).
        namespace: keeps these locks apart from other users of advisory locks.
        max_idle: connections kept for later locks once released.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        namespace: str = "statekeeper",
        max_idle: int = 4,
        url: str = "postgresql://",
    ) -> None:
        self._conninfo = conninfo
        self.namespace = validate_id(namespace, "lock namespace")
        self.max_idle = max_idle
        self.url = url
        self._idle: list[Connection] = []
        self._closed = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "statekeeper",
        max_idle: int = 4,
        connect_timeout: int = 10,
    ) -> PgSessionLocks:
        """Locks on the server of ``postgresql://user@host:port/dbname``."""
        conninfo, shown = _conninfo(url, connect_timeout)
        return cls(conninfo, namespace=namespace, max_idle=max_idle, url=shown)

    def __repr__(self) -> str:
        return f"PgSessionLocks({self.url!r}, namespace={self.namespace!r})"

    def key(self, tenant: str, session_id: str) -> int:
        """The advisory lock key of a session (a signed 64-bit integer)."""
        check_tenant_and_id(tenant, session_id)
        digest = hashlib.sha256(f"{self.namespace}\0{tenant}\0{session_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    @asynccontextmanager
    async def hold(
        self, tenant: str, session_id: str, *, wait: float | None = None
    ) -> AsyncIterator[PgHeldLock]:
        """Hold the session's lock for the ``async with`` block.

        Waits for it as long as needed, or ``wait`` seconds (0: only if free now), then
        raises `SessionLockTimeoutError`. Not reentrant: holding it again in the block
        waits for itself until ``wait`` runs out.
        """
        key = self.key(tenant, session_id)
        check_wait(wait)
        conn = await self._take()
        try:
            await self._lock(conn, key, wait, session_id)
        except BaseException:
            # A cancel may land just after the server granted the lock: dropping the
            # connection releases whatever it holds.
            await _close(conn)
            raise
        try:
            yield PgHeldLock(tenant, session_id, key, conn)
        finally:
            await self._release(conn, key)

    async def close(self) -> None:
        """Close the idle connections (locks still held are released when their blocks end)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _take(self) -> Connection:
        if self._closed:
            raise InvalidInputError(f"{self!r} is closed")
        while self._idle:
            conn = self._idle.pop()
            if not closed_by_server(conn):
                return conn
            await conn.close()
        return await _connect(self._conninfo, self.url)

    async def _lock(self, conn: Connection, key: int, wait: float | None, what: str) -> None:
        # The wait happens in the server (lock_timeout): no polling, woken at release.
        try:
            if wait is not None and wait <= 0:
                cur = await conn.execute(b"SELECT pg_try_advisory_lock(%s)", (key,))
                row = await cur.fetchone()
                if row is None or not row[0]:
                    raise SessionLockTimeoutError(what, 0.0)
                return
            millis = "0" if wait is None else f"{max(1, round(wait * 1000))}ms"
            await conn.execute(b"SELECT set_config('lock_timeout', %s, false)", (millis,))
            await conn.execute(b"SELECT pg_advisory_lock(%s)", (key,))
        except psycopg.errors.LockNotAvailable:
            raise SessionLockTimeoutError(what, wait or 0.0) from None
        except psycopg.Error as exc:
            raise translate(exc, f"locking session {what!r} on {self.url}") from exc

    async def _release(self, conn: Connection, key: int) -> None:
        try:
            await asyncio.shield(conn.execute(b"SELECT pg_advisory_unlock(%s)", (key,)))
        except psycopg.Error:
            await _close(conn)  # the lock went with its connection (or goes now)
            return
        except BaseException:
            await _close(conn)  # closing it releases the lock for sure
            raise
        if self._closed or len(self._idle) >= self.max_idle:
            await conn.close()
        else:
            self._idle.append(conn)


# -- event feed ---------------------------------------------------------------------------


class PgEventFeed:
    """Notices of event appends NOTIFY'd on ``channel`` by stores of ``schema``.

    Each `notices` call LISTENs on a connection of its own; a lost connection is
    reopened every ``retry_every`` seconds, then a resync is yielded.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        channel: str = DEFAULT_CHANNEL,
        schema: str = DEFAULT_SCHEMA,
        retry_every: float = 1.0,
        url: str = "postgresql://",
    ) -> None:
        if retry_every <= 0:
            raise InvalidInputError(f"retry_every must be > 0 seconds, got {retry_every!r}")
        self._conninfo = conninfo
        self.channel = validate_channel(channel)
        self.schema = schema
        self.retry_every = retry_every
        self.url = url

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        channel: str = DEFAULT_CHANNEL,
        schema: str = DEFAULT_SCHEMA,
        retry_every: float = 1.0,
        connect_timeout: int = 10,
    ) -> PgEventFeed:
        """A feed from the server of ``postgresql://user@host:port/dbname``."""
        conninfo, shown = _conninfo(url, connect_timeout)
        return cls(conninfo, channel=channel, schema=schema, retry_every=retry_every, url=shown)

    def __repr__(self) -> str:
        return f"PgEventFeed({self.url!r}, channel={self.channel!r}, schema={self.schema!r})"

    async def notices(self, tenant: str) -> AsyncIterator[EventNotice]:
        """The tenant's notices (see `EventFeed.notices`): a resync once listening, then
        one per committed append, and a resync after each reconnection."""
        validate_id(tenant, "tenant")
        conn = await self._listen()  # the first failure is the caller's to see
        try:
            while True:
                yield EventNotice(tenant)
                try:
                    async for notify in conn.notifies():
                        notice = self._parse(notify.payload, tenant)
                        if notice is not None:
                            yield notice
                except psycopg.Error as exc:
                    _log.warning("event feed on %s lost its connection: %s", self.url, exc)
                await _close(conn)
                conn = await self._reconnect()
        finally:
            await _close(conn)

    async def _listen(self) -> Connection:
        conn = await _connect(self._conninfo, self.url)
        try:
            await conn.execute(f'LISTEN "{self.channel}"'.encode())  # validated: no quotes
        except BaseException:
            await _close(conn)
            raise
        return conn

    async def _reconnect(self) -> Connection:
        while True:
            await asyncio.sleep(self.retry_every)
            with suppress(StatekeeperError, psycopg.Error):
                return await self._listen()

    def _parse(self, payload: str, tenant: str) -> EventNotice | None:
        """The notice for ``tenant``, None if it is another's; a resync if unreadable."""
        try:
            data = json.loads(payload)
            if data["schema"] != self.schema or data["tenant"] != tenant:
                return None
            return EventNotice(tenant, validate_id(data["log_id"], "log id"), int(data["seq"]))
        except (ValueError, KeyError, TypeError):
            return EventNotice(tenant)  # not written by a store: "re-read everything" is safe


async def _close(conn: Connection) -> None:
    with suppress(Exception):
        await asyncio.shield(conn.close())
