"""PostgreSQL plumbing: connection settings from a URL, connection sources, driver errors.

Kept apart from the store so that it holds only the rules (`PostgresStore` in
``postgres.py``) and this module only the edges: where connections come from (a pool the
store owns, a caller's pool, a caller's single connection) and how psycopg's errors
become statekeeper's (STYLE 7). Passwords never appear in a URL, repr or message made
here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

try:
    import psycopg
    from psycopg.conninfo import make_conninfo
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from statekeeper.errors import MissingExtraError

    raise MissingExtraError("PostgreSQL store", "postgres") from exc

from statekeeper.errors import (
    InvalidInputError,
    StatekeeperError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)

__all__ = [
    "Connection",
    "ConnectionSource",
    "PoolSource",
    "SingleConnectionSource",
    "Source",
    "connection_lost",
    "parse_location",
    "retryable",
    "translate",
]

Connection = psycopg.AsyncConnection[Any]


def parse_location(location: str, extra: dict[str, str]) -> tuple[str, str]:
    """libpq settings and a password-free URL for ``user:password@host:port/dbname``.

    ``location`` is the URL after ``postgresql://``, already unquoted, so a password may
    hold any character: the last ``@`` ends the user part. Settings are passed to libpq
    as keywords, never re-assembled into a URL that would need quoting.
    """
    userinfo, at, hostpath = location.rpartition("@")
    if not at:
        userinfo, hostpath = "", location
    user, colon, password = userinfo.partition(":")
    hostport, _, dbname = hostpath.partition("/")
    hosts: list[str] = []
    ports: list[str] = []
    for part in hostport.split(",") if hostport else []:
        if part.startswith("["):  # [::1]:5432
            host, _, port = part[1:].partition("]")
            port = port.removeprefix(":")
        else:
            host, _, port = part.partition(":")
        if port and not port.isdigit():
            raise InvalidInputError(f"port {port!r} in the PostgreSQL URL is not a number")
        hosts.append(host)
        ports.append(port)
    settings: dict[str, Any] = {
        "host": ",".join(hosts) or None,
        "port": ",".join(ports) if any(ports) else None,
        "user": user or None,
        "password": password if colon else None,
        "dbname": dbname or None,
    }
    conninfo = make_conninfo("", **settings, **extra)
    shown_user = f"{user}{':***' if colon else ''}@" if userinfo else ""
    return conninfo, f"postgresql://{shown_user}{hostport}/{dbname}"


class Source(Protocol):
    """Where a store gets a connection for one operation."""

    def connection(self) -> Any:
        """An async context manager lending a connection (autocommit or not)."""
        ...

    async def close(self) -> None:
        """Release what the store owns (a caller's pool or connection stays open)."""
        ...


class PoolSource:
    """Connections from a psycopg_pool `AsyncConnectionPool`."""

    def __init__(self, pool: AsyncConnectionPool[Any], *, owned: bool, timeout: float) -> None:
        self.pool = pool
        self.owned = owned
        self.timeout = timeout

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        async with self.pool.connection(timeout=self.timeout) as conn:
            yield conn

    async def close(self) -> None:
        if self.owned:
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

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        async with self._lock:
            if self.conn.closed:
                raise StoreUnavailableError(
                    "the PostgreSQL connection given to the store is closed; "
                    "open the store again with a live connection or a pool"
                )
            yield self.conn

    async def close(self) -> None:
        if self.owned:
            await self.conn.close()


ConnectionSource = PoolSource | SingleConnectionSource

_LOST_STATES = {"57P01", "57P02", "57P03"}  # admin / crash shutdown, cannot connect now
_RETRY_STATES = {"40001", "40P01"}  # serialization failure, deadlock: rolled back


def connection_lost(exc: BaseException) -> bool:
    """True when the connection broke (closed, refused, terminated by the server)."""
    if isinstance(exc, PoolTimeout):
        return False
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _LOST_STATES


def retryable(exc: BaseException) -> bool:
    """True when the server rolled the transaction back and asks for a retry."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate in _RETRY_STATES


def translate(exc: BaseException, where: str) -> StatekeeperError:
    """The most specific statekeeper error for a psycopg or pool error."""
    reason = _first_line(exc)
    if isinstance(exc, PoolTimeout):
        return StoreUnavailableError(
            f"{where}: no connection became free or could be opened in time ({reason}); "
            "check that the server is up, or raise max_size / timeout"
        )
    state = getattr(exc, "sqlstate", None)
    if connection_lost(exc):
        return StoreUnavailableError(
            f"{where}: the connection to PostgreSQL failed ({reason}); retry when the "
            "server is reachable"
        )
    if state == "25006":
        return StoreReadOnlyError(f"{where} refuses writes: {reason} (a read-only server?)")
    if state == "42501":
        return StoreReadOnlyError(
            f"{where}: permission denied ({reason}); grant the store's user access to its schema"
        )
    if state == "53100":
        return StoreFullError(f"{where}: the server's disk is full ({reason}); free space")
    if state in _RETRY_STATES or (state or "").startswith("53") or state == "57014":
        return StoreUnavailableError(f"{where} is busy or overloaded ({reason}); retry later")
    if isinstance(exc, psycopg.DataError) or (state or "").startswith("22"):
        return InvalidInputError(f"{where} cannot store this value: {reason}")
    return StoreError(f"{where}: {reason}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
