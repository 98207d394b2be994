"""Where a PostgreSQL store's connections come from: a pool the store owns (one per
event loop it runs on), a caller's pool, or a caller's single connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

try:
    import psycopg
    from psycopg_pool import AsyncConnectionPool
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from statekeeper.errors import MissingExtraError

    raise MissingExtraError("PostgreSQL store", "postgres") from exc

from statekeeper.errors import StoreUnavailableError

__all__ = ["Connection", "ConnectionSource", "PoolSource", "SingleConnectionSource"]

Connection = psycopg.AsyncConnection[Any]


class PoolSource:
    """Connections from a psycopg_pool `AsyncConnectionPool`.

    A pool belongs to one event loop. A source that can make its pool (``make``, for a
    store that owns it) makes another for another loop (`twin`), opened on first use.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        owned: bool,
        timeout: float,
        make: Callable[[], AsyncConnectionPool[Any]] | None = None,
        opened: bool = True,
    ) -> None:
        self.pool = pool
        self.owned = owned
        self.timeout = timeout
        self.make = make
        self._opened = opened
        self._closing = False
        self._guard: asyncio.Task[None] | None = None

    def watch(self) -> None:
        """Close the pool when its loop shuts down with the store left open.

        ``asyncio.run`` ends by cancelling every task and waiting for them. A pool
        worker cancelled while it opens a connection swallows the cancellation (psycopg_pool
        keeps the pool consistent that way) and waits for more work, so the wait never
        ends. This task is cancelled along with them and closes the pool, which stops its
        workers.
        """
        if self.owned:
            self._guard = asyncio.get_running_loop().create_task(
                self._close_at_loop_end(), name="statekeeper-pool-guard"
            )

    async def _close_at_loop_end(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # never done
        except asyncio.CancelledError:
            if not self._closing:
                with contextlib.suppress(Exception):
                    await self.pool.close(timeout=1.0)
            raise

    def twin(self) -> PoolSource | None:
        """A source like this one with a pool of its own (for another loop), if it can."""
        if self.make is None:
            return None
        return PoolSource(
            self.make(), owned=True, timeout=self.timeout, make=self.make, opened=False
        )

    def acquire(self) -> Awaitable[Connection]:
        """A connection from the pool (opened on first use). Not a coroutine itself: it
        hands the pool's own, one frame fewer on every statement."""
        if not self._opened:
            return self._open_and_acquire()
        return self.pool.getconn(timeout=self.timeout)

    async def _open_and_acquire(self) -> Connection:
        if not self._opened:
            self._opened = True
            await self.pool.open(wait=False)
            self.watch()
        conn: Connection = await self.pool.getconn(timeout=self.timeout)
        return conn

    def release(self, conn: Connection) -> Awaitable[None]:
        return self.pool.putconn(conn)  # the pool drops a broken one

    async def close(self) -> None:
        self._closing = True
        if self._guard is not None:
            self._guard.cancel()
        if self.owned and self._opened:
            await self.pool.close()


class SingleConnectionSource:
    """One caller-supplied connection, lent to one operation at a time.

    A transaction owns its connection until it ends, so operations queue here rather
    than interleave their statements on the one connection.
    """

    def __init__(self, conn: Connection, *, owned: bool = False) -> None:
        self.conn = conn
        self.owned = owned
        self._lock = asyncio.Lock()

    async def acquire(self) -> Connection:
        await self._lock.acquire()
        if self.conn.closed:
            self._lock.release()
            raise StoreUnavailableError(
                "the PostgreSQL connection given to the store is closed; "
                "open the store again with a live connection or a pool"
            )
        return self.conn

    async def release(self, conn: Connection) -> None:
        self._lock.release()

    async def close(self) -> None:
        if self.owned:
            await self.conn.close()

    def twin(self) -> None:
        """None: a caller's connection serves its own loop only."""
        return None


ConnectionSource = PoolSource | SingleConnectionSource
