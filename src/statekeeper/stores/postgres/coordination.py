"""Coordination between processes through PostgreSQL: session locks and event wake-ups.

`PgSessionLocks` serialises work on a session across processes and machines with
PostgreSQL advisory locks::

    locks = PgSessionLocks.from_url("postgresql://app@db/agents")
    async with locks.hold(tenant, session_id, timeout=30):
        ...  # no other holder of (tenant, session_id) on this server runs meanwhile

Each held lock has a connection of its own for as long as it is held, so waiting for
one session never delays another, and a worker that dies (crash, kill, lost network)
loses its connection and with it the lock: nothing stays locked behind a dead process.
The lock key is 64 bits of SHA-256 of (namespace, tenant, session id); two sessions
that share a key (never seen in practice) would share a lock, which costs waiting,
never exclusion.

`PgEventListener` wakes event subscribers in other processes. A store opened with
``notify_channel=...`` sends, when each event append commits, a NOTIFY naming the log
and its last seq; the listener LISTENs on that channel and calls a callback, for
example ``EventBus.refresh`` so that run subscribers read what another process logged::

    store = await open_store(url, notify_channel="statekeeper_events")
    bus = EventBus(store, tenant)
    async with PgEventListener.from_url(url, refresh_bus(bus)):
        async for event in bus.subscribe(run_id, from_seq=0):
            ...

Notifications sent while the listener is reconnecting are lost; it then calls the
callback with a notice whose ``log_id`` is None, meaning "refresh everything".
"""

# ruff: noqa: ASYNC109 (hold's timeout is the documented API: the wait happens in the server)
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import unquote, urlsplit

from statekeeper.errors import InvalidInputError, StatekeeperError
from statekeeper.ids import validate_id
from statekeeper.stores.postgres.conn import (
    Connection,
    closed_by_server,
    parse_location,
    psycopg,
    translate,
)
from statekeeper.stores.postgres.schema import validate_channel
from statekeeper.stores.rules import check_tenant_and_id

__all__ = [
    "DEFAULT_CHANNEL",
    "EventNotice",
    "HeldLock",
    "PgEventListener",
    "PgSessionLocks",
    "SessionLockTimeoutError",
    "refresh_bus",
]

DEFAULT_CHANNEL = "statekeeper_events"
_log = logging.getLogger("statekeeper.pg_coordination")


class SessionLockTimeoutError(StatekeeperError, TimeoutError):
    """A session lock was not free within the timeout; nothing was locked."""


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
class HeldLock:
    """A lock being held: its key, and a check that it still is."""

    tenant: str
    session_id: str
    key: int
    _conn: Connection

    async def check(self) -> None:
        """Raise `StoreUnavailableError` if the lock's connection (so the lock) was lost."""
        try:
            await self._conn.execute(b"SELECT 1")
        except psycopg.Error as exc:
            raise translate(exc, f"the lock on session {self.session_id!r}") from exc


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
        self, tenant: str, session_id: str, *, timeout: float | None = None
    ) -> AsyncIterator[HeldLock]:
        """Hold the session's lock for the ``async with`` block.

        Waits for it as long as needed, or ``timeout`` seconds (0: only if free now),
        then raises `SessionLockTimeoutError`. Not reentrant: holding it again in the
        block waits for itself until the timeout.
        """
        key = self.key(tenant, session_id)
        conn = await self._take()
        try:
            await self._lock(conn, key, timeout, session_id)
        except BaseException:
            # A cancel may land just after the server granted the lock: dropping the
            # connection releases whatever it holds.
            await self._drop(conn)
            raise
        try:
            yield HeldLock(tenant, session_id, key, conn)
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

    async def _lock(self, conn: Connection, key: int, timeout: float | None, what: str) -> None:
        try:
            if timeout is not None and timeout <= 0:
                cur = await conn.execute(b"SELECT pg_try_advisory_lock(%s)", (key,))
                row = await cur.fetchone()
                if row is None or not row[0]:
                    raise SessionLockTimeoutError(f"session {what!r} is locked by another holder")
                return
            millis = "0" if timeout is None else f"{max(1, round(timeout * 1000))}ms"
            await conn.execute(b"SELECT set_config('lock_timeout', %s, false)", (millis,))
            await conn.execute(b"SELECT pg_advisory_lock(%s)", (key,))
        except psycopg.errors.LockNotAvailable:
            raise SessionLockTimeoutError(
                f"session {what!r} stayed locked by another holder for {timeout:g}s"
            ) from None
        except psycopg.Error as exc:
            raise translate(exc, f"locking session {what!r} on {self.url}") from exc

    async def _release(self, conn: Connection, key: int) -> None:
        try:
            await asyncio.shield(conn.execute(b"SELECT pg_advisory_unlock(%s)", (key,)))
        except BaseException:
            await self._drop(conn)  # closing it releases the lock for sure
            raise
        if self._closed or len(self._idle) >= self.max_idle:
            await conn.close()
        else:
            self._idle.append(conn)

    @staticmethod
    async def _drop(conn: Connection) -> None:
        with suppress(Exception):
            await asyncio.shield(conn.close())


# -- event wake-ups ------------------------------------------------------------------------


@dataclass(frozen=True)
class EventNotice:
    """An event append another process committed (``log_id`` None: maybe some missed)."""

    schema: str | None
    tenant: str | None
    log_id: str | None
    seq: int | None


Callback = Callable[[EventNotice], Awaitable[None] | None]


def refresh_bus(bus: Any, *, schema: str | None = None) -> Callable[[EventNotice], None]:
    """A listener callback that makes ``bus`` (an `EventBus`) read other processes' events.

    Notices of other tenants (and, if ``schema`` is given, of other schemas) are ignored.
    """

    def callback(notice: EventNotice) -> None:
        if notice.log_id is None:
            for run_id in list(getattr(bus, "_by_run", ())):
                bus.refresh(run_id)
        elif notice.tenant == bus.tenant and (schema is None or notice.schema == schema):
            bus.refresh(notice.log_id)

    return callback


class PgEventListener:
    """Calls ``callback(notice)`` for each event append NOTIFY'd on ``channel``.

    The callback may be a function or a coroutine function; its errors are logged and
    the listener goes on. A lost connection is reopened (every ``retry_every``
    seconds), then the callback gets a notice with ``log_id=None``.
    """

    def __init__(
        self,
        conninfo: str,
        callback: Callback,
        *,
        channel: str = DEFAULT_CHANNEL,
        retry_every: float = 1.0,
        url: str = "postgresql://",
    ) -> None:
        self._conninfo = conninfo
        self.callback = callback
        self.channel = validate_channel(channel)
        self.retry_every = retry_every
        self.url = url
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        callback: Callback,
        *,
        channel: str = DEFAULT_CHANNEL,
        retry_every: float = 1.0,
        connect_timeout: int = 10,
    ) -> PgEventListener:
        """A listener on the server of ``postgresql://user@host:port/dbname``."""
        conninfo, shown = _conninfo(url, connect_timeout)
        return cls(conninfo, callback, channel=channel, retry_every=retry_every, url=shown)

    async def start(self) -> None:
        """Connect and LISTEN; returns once notifications are being received."""
        if self._task is not None:
            raise InvalidInputError("the listener is already started")
        self._ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._listen())
        try:
            await asyncio.shield(self._ready)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop listening. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _listen(self) -> None:
        assert self._ready is not None
        first = True
        while True:
            try:
                conn = await _connect(self._conninfo, self.url)
            except StatekeeperError as exc:
                if not self._ready.done():
                    self._ready.set_exception(exc)
                    return
                await asyncio.sleep(self.retry_every)
                continue
            try:
                await conn.execute(f'LISTEN "{self.channel}"'.encode())
                if not self._ready.done():
                    self._ready.set_result(None)
                if not first:
                    await self._deliver(EventNotice(None, None, None, None))
                first = False
                async for notify in conn.notifies():
                    await self._deliver(_notice(notify.payload))
            except psycopg.Error as exc:
                _log.warning("event listener on %s lost its connection: %s", self.url, exc)
                await asyncio.sleep(self.retry_every)
            finally:
                with suppress(Exception):
                    await asyncio.shield(conn.close())

    async def _deliver(self, notice: EventNotice) -> None:
        try:
            outcome = self.callback(notice)
            if outcome is not None:
                await outcome
        except Exception:
            _log.exception("event listener callback failed for %s", notice)


def _notice(payload: str) -> EventNotice:
    try:
        data = json.loads(payload)
        return EventNotice(data["schema"], data["tenant"], data["log_id"], int(data["seq"]))
    except (ValueError, KeyError, TypeError):
        return EventNotice(None, None, None, None)  # not ours: treat as "refresh all"
