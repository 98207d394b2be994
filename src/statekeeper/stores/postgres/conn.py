"""PostgreSQL plumbing: connection settings, driver errors, transactions, migrations.

The edges of the PostgreSQL store (``postgres.py`` holds its rules): which connections a
loop uses (their sources are in ``sources.py``), how a transaction is run and retried,
and how psycopg's errors become statekeeper's (STYLE 7).
Passwords never appear in a URL, repr or message made here.
"""

from __future__ import annotations

import asyncio
import random
import warnings
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout, TooManyRequests
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from statekeeper.errors import MissingExtraError

    raise MissingExtraError("PostgreSQL store", "postgres") from exc

from statekeeper.errors import (
    InvalidInputError,
    SchemaVersionError,
    StatekeeperError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES
from statekeeper.loops import HomeLoop, on_their_loops, per_loop, running_loop
from statekeeper.stores.base import ClosingStore
from statekeeper.stores.postgres.schema import (
    DEFAULT_SCHEMA,
    MIGRATIONS,
    SCHEMA_VERSION,
    Statements,
)
from statekeeper.stores.postgres.sources import (
    Connection,
    ConnectionSource,
    PoolSource,
    SingleConnectionSource,
)

__all__ = [
    "AsyncConnectionPool",
    "Connection",
    "ConnectionSource",
    "PoolSource",
    "PostgresBase",
    "SingleConnectionSource",
    "closed_by_server",
    "connection_lost",
    "describe",
    "parse_location",
    "psycopg",
    "retryable",
    "translate",
]

T = TypeVar("T")
ATTEMPTS = 5


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


def describe(conninfo: str) -> str:
    """A password-free URL naming the server and database of libpq settings."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "postgresql://"
    user = f"{params['user']}@" if params.get("user") else ""
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgresql://{user}{params.get('host') or ''}{port}/{params.get('dbname') or ''}"


_LOST_STATES = {"57P01", "57P02", "57P03"}  # admin / crash shutdown, cannot connect now
_RETRY_STATES = {"40001", "40P01"}  # serialization failure, deadlock: rolled back


def connection_lost(exc: BaseException) -> bool:
    """True when the connection broke (closed, refused, terminated by the server)."""
    if isinstance(exc, PoolClosed | PoolTimeout | TooManyRequests):
        return False  # the pool's own errors: no connection was used
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _LOST_STATES


def closed_by_server(conn: Connection) -> bool:
    """True if the server closed this idle connection (restart, pg_terminate_backend).

    A non-blocking read: it sees the goodbye a server sends before it drops a connection,
    so such a connection is never used for a write whose outcome would be unknown.
    """
    pgconn = conn.pgconn
    # Twice: the first read takes the server's goodbye message, the second finds the
    # connection closed (a live idle connection has nothing to read either time).
    for _ in range(2):
        if pgconn.status != psycopg.pq.ConnStatus.OK:
            return True
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            return True
        pgconn.is_busy()  # parses what arrived
    return bool(pgconn.status != psycopg.pq.ConnStatus.OK)


def retryable(exc: BaseException) -> bool:
    """True when the server rolled the transaction back and asks for a retry."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate in _RETRY_STATES


def translate(exc: BaseException, where: str) -> StatekeeperError:
    """The most specific statekeeper error for a psycopg or pool error."""
    reason = _first_line(exc)
    if isinstance(exc, PoolClosed):
        return StoreUnavailableError(f"{where} is closed; open a new store")
    if isinstance(exc, PoolTimeout | TooManyRequests):
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


class Careful(Exception):
    """Internal: a one-statement fast path cannot be used; take the locked one."""


class PostgresBase(HomeLoop, ClosingStore):
    """Connections, transactions, retries and migrations of a PostgreSQL store.

    Connections belong to an event loop: the store's own pool serves its home loop, and
    a twin pool (same settings) serves the background loop, where calls from other loops
    run (`statekeeper.loops`). A caller's pool or connection serves its own loop only.
    """

    def __init__(
        self,
        source: ConnectionSource,
        *,
        schema: str = DEFAULT_SCHEMA,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        url: str = "postgresql://",
    ) -> None:
        self._q = Statements(schema)
        self.schema = schema
        self.max_payload_bytes = max_payload_bytes
        self.url = url
        self._given: ConnectionSource | None = source
        self._given_loop = running_loop()  # the loop the given connections belong to
        self.movable = source.twin() is not None if isinstance(source, PoolSource) else False
        self.notify_channel: str | None = None
        """When set, each event append also sends a NOTIFY on this channel (at commit)."""

    @per_loop
    def _tasks(self) -> set[asyncio.Task[Any]]:
        """Writes under way on a loop: `close` lets them end before it closes."""
        return set()

    @per_loop
    def _loop_source(self) -> ConnectionSource:
        """The connections of the running loop: the given ones on their own loop, else a
        twin with the same settings, else (a caller's connections, to which calls are
        routed) the given ones."""
        given = self._given
        assert given is not None  # `_source` asks only while the store is open
        loop = running_loop()
        if self._given_loop is None:
            self._given_loop = loop
        if loop is self._given_loop:
            return given
        return given.twin() or given

    @property
    def _source(self) -> ConnectionSource | None:
        """The connections of the running loop (None once the store is closed)."""
        return None if self._given is None else self._loop_source

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r}, schema={self.schema!r})"

    def __del__(self) -> None:
        source = getattr(self, "_given", None)
        if source is not None and source.owned:
            warnings.warn(
                f"{self!r} was not closed; call await store.close()",
                ResourceWarning,
                stacklevel=1,
            )

    async def close(self) -> None:
        """Let writes under way end, then close what the store opened (not a caller's),
        on every loop it has connections on. Idempotent."""
        given, self._given = self._given, None
        if given is None:
            return
        made = PostgresBase._loop_source.items(self)
        PostgresBase._loop_source.drop(self)
        parts: list[tuple[asyncio.AbstractEventLoop | None, ConnectionSource]] = [
            (self._given_loop, given),
            *((loop, source) for loop, source in made if source is not given),
        ]
        await on_their_loops(parts, self._drain)

    async def _drain(self, source: ConnectionSource) -> None:
        tasks = self._tasks
        while tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
            tasks.difference_update([task for task in tasks if task.done()])
        await source.close()

    async def migrate(self) -> None:
        """Create or upgrade the schema; `SchemaVersionError` if it is newer than ours."""

        async def read_version(conn: Connection) -> int:
            cur = await conn.execute(self._q.has_versions, (self._q.versions_table,))
            row = await cur.fetchone()
            if not row or not row[0]:
                return 0
            cur = await conn.execute(self._q.max_version)
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        def refuse(version: int) -> SchemaVersionError:
            return SchemaVersionError(
                f"PostgreSQL schema {self.schema!r} has statekeeper schema version {version}, "
                f"but this statekeeper knows versions up to {SCHEMA_VERSION}; upgrade "
                "statekeeper to open it"
            )

        async def upgrade(conn: Connection) -> None:
            # One migrator at a time per schema, whichever process gets there first.
            await conn.execute(self._q.lock_schema, (f"statekeeper:{self.schema}",))
            await conn.execute(self._q.create_schema)
            await conn.execute(self._q.create_versions)
            version = await read_version(conn)
            if version > SCHEMA_VERSION:
                raise refuse(version)
            for number in range(version + 1, SCHEMA_VERSION + 1):
                for statement in self._q.migration(number):
                    await conn.execute(statement)
                await conn.execute(self._q.record_migration, (number, MIGRATIONS[number - 1][0]))

        version = await self._run(read_version, idempotent=True)
        if version > SCHEMA_VERSION:
            raise refuse(version)
        if version < SCHEMA_VERSION:
            await self._run(upgrade, tx=True)

    # -- plumbing --------------------------------------------------------------------------

    async def _run(
        self,
        op: Callable[[Connection], Awaitable[T]],
        *,
        tx: bool = False,
        idempotent: bool = False,
    ) -> T:
        """Run ``op`` on a connection (in a transaction if ``tx``), translating errors.

        Retried: serialization failures and deadlocks (the server rolled back), and a
        lost connection when nothing can have been committed yet, or ``op`` is idempotent.
        """
        attempt = stale = 0
        while True:
            attempt += 1
            source = self._source
            if source is None:
                raise StoreUnavailableError(f"{self!r} is closed; open a new store")
            committing = False
            try:
                conn = await source.acquire()
                try:
                    if closed_by_server(conn):
                        # Nothing was sent on it: safe to try another connection. Closed,
                        # so that a pool drops it instead of lending it out again.
                        await conn.close()
                        raise _Stale
                    if tx or not conn.autocommit:
                        async with conn.transaction():
                            result = await op(conn)
                            committing = True
                        return result
                    committing = True  # a lone autocommit statement commits as it runs
                    return await op(conn)
                finally:
                    await source.release(conn)
            except (Careful, StatekeeperError):
                raise
            except _Stale:
                stale += 1
                attempt -= 1
                if stale > 50 or isinstance(source, SingleConnectionSource):
                    raise StoreUnavailableError(
                        f"PostgreSQL store {self.url}: the server closed the connection; "
                        "retry when the server is reachable"
                    ) from None
                continue
            except psycopg.Error as exc:
                if retryable(exc) and attempt < ATTEMPTS:
                    await asyncio.sleep(0.002 * attempt * random.random())
                    continue
                if connection_lost(exc) and attempt < 3 and (idempotent or not committing):
                    continue
                raise translate(exc, f"PostgreSQL store {self.url}") from exc

    async def _select(self, sql: bytes, params: Any) -> list[Any]:
        """The rows of one read-only statement (retried on a lost connection). The
        statement goes as a partial, not a closure: fewer objects per read."""
        return await self._run(partial(_fetch_all, sql, params), idempotent=True)

    async def _write(
        self,
        op: Callable[[Connection], Awaitable[T]],
        *,
        tx: bool = False,
        idempotent: bool = False,
    ) -> T:
        """`_run` for a write: a cancelled caller waits until the write has ended.

        The write runs in a task of its own (a cancellation must not reach psycopg in the
        middle of a statement), which hands its outcome to ``done`` itself: the caller
        wakes one event-loop turn after the write ends (`asyncio.shield` takes two).
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        task = loop.create_task(self._settle(done, op, tx, idempotent))
        # `_settle` takes it out when it ends; one cancelled before it started is taken
        # out here or by `_drain` (no done callback: every write would pay for one).
        tasks = self._tasks
        tasks.add(task)
        try:
            return await done
        except asyncio.CancelledError:
            if not task.done():
                await asyncio.wait([task])
            tasks.discard(task)
            if done.done() and not done.cancelled():
                done.exception()  # retrieved, so asyncio does not log it as lost
            raise

    async def _settle(
        self,
        done: asyncio.Future[T],
        op: Callable[[Connection], Awaitable[T]],
        tx: bool,
        idempotent: bool,
    ) -> None:
        """Run a write of `_write` and pass its result or error to ``done``."""
        try:
            result = await self._run(op, tx=tx, idempotent=idempotent)
        except asyncio.CancelledError:
            done.cancel()
            raise
        except BaseException as exc:
            if not done.done():  # else the caller was cancelled: nobody reads it
                done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: the loop's to handle
        else:
            if not done.done():
                done.set_result(result)
        finally:  # at once, so that `close` does not wait for it
            task = asyncio.current_task()
            if task is not None:
                self._tasks.discard(task)


async def _fetch_all(sql: bytes, params: Any, conn: Connection) -> list[Any]:
    cur = await conn.execute(sql, params)
    return await cur.fetchall()


class _Stale(Exception):
    """Internal: the server had closed a connection before it was used."""
