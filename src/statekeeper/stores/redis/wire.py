"""The wire: running the store's scripts on connections of its own, and redis-py's errors
translated into statekeeper's.

Why not ``client.evalsha``: redis-py's ``execute_command`` takes a connection from the
pool under a lock, runs observability hooks on the way, and with a socket timeout wraps
every send in `asyncio.wait_for`, a new task and so an extra event-loop turn per command;
its ``pack_command`` costs twice what `pack` does. A script is one round trip either
way; here nothing else stands between the call and the socket (see `ScriptConnections`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

from statekeeper.errors import (
    MissingExtraError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from statekeeper.stores.redis.scripts import Script

try:
    import redis.exceptions as rx
    from redis.asyncio import ConnectionPool
    from redis.asyncio.connection import AbstractConnection
except ImportError:  # pragma: no cover - depends on the environment
    raise MissingExtraError("Redis store", "redis") from None

__all__ = [
    "CLIENT_ERRORS",
    "REDIRECTS",
    "Replicas",
    "ScriptArg",
    "ScriptConnections",
    "pack",
    "translate",
]

_UNAVAILABLE_REPLIES = ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")


ScriptArg = bytes | str | int | float
"""What scripts take as arguments."""
CLIENT_ERRORS = (rx.RedisError, rx.RedisClusterException, OSError)
"""What redis-py and sockets raise (`translate` makes statekeeper errors of them)."""


def pack(args: Sequence[ScriptArg]) -> bytes:
    """A command as RESP: the bytes redis-py's ``pack_command`` makes for these types
    (str as UTF-8, numbers as their decimal text), at half its cost."""
    return b"*%d\r\n%b" % (len(args), _bulks(args))


def _bulks(args: Sequence[ScriptArg]) -> bytes:
    out: list[bytes] = []
    add = out.append
    for arg in args:
        data: bytes
        if type(arg) is bytes:
            data = arg
        elif type(arg) is str:
            data = arg.encode()
        elif type(arg) is int:
            data = str(arg).encode()
        else:
            data = _other(arg)
        add(b"$%d\r\n" % len(data))
        add(data)
        add(b"\r\n")
    return b"".join(out)


def _other(arg: object) -> bytes:
    """A subclass of bytes, str or int, or a float, as `pack` sends it."""
    if isinstance(arg, bytes):
        return bytes(arg)
    if isinstance(arg, str):
        return str.encode(arg)
    if isinstance(arg, int) and not isinstance(arg, bool):
        return b"%d" % arg
    if isinstance(arg, float):
        return repr(arg).encode()
    raise TypeError(f"a script argument must be bytes, str, int or float, not {arg!r}")


class ScriptConnections:
    """EVALSHA on idle connections of the store's own: the path every write takes.

    redis-py's ``execute_command`` takes a connection from the pool under a lock, runs
    observability hooks on the way, and with a socket timeout wraps every send in
    `asyncio.wait_for`: a new task, so an extra event-loop turn per command. Here a
    script takes an idle connection (made like the pool's: same address, credentials,
    database and protocol, but no socket timeout of its own), writes the packed command
    and reads the reply. The pool's ``socket_timeout`` bounds the whole call
    (connecting, sending, the reply): a `_Watchdog` cancels a call past it, which then
    raises `StoreUnavailableError`, at a fraction of `asyncio.timeout`'s cost. A connection
    is checked before reuse as the pool checks its own (one the server closed, after a
    restart, reconnects), and one that failed or was interrupted mid-call is closed,
    never reused: its reply may still come. The packed start of a command (EVALSHA, the
    script, its keys) is kept per script and keys: a session's appends repeat it.
    """

    KEEP = 16
    """Idle connections kept (more are made under load, and closed when they come back)."""
    PREFIXES = 4096
    """Packed command starts kept (all are dropped when there are more)."""

    def __init__(
        self,
        connection_class: type[AbstractConnection],
        settings: dict[str, Any],
        where: str,
        *,
        wait: Replicas | None = None,
        redirects: bool = False,
    ) -> None:
        settings = dict(settings)
        self._timeout: float | None = settings.get("socket_timeout")
        settings["socket_timeout"] = None  # the calls' timer bounds them
        self._make = partial(connection_class, **settings)
        self._where = where
        self._wait = wait
        self._redirects = redirects
        self._idle: list[AbstractConnection] = []
        self._prefixes: dict[tuple[str, tuple[str, ...]], bytes] = {}
        self._watchdog = _Watchdog(self._timeout) if self._timeout else None
        self._closed = False

    @classmethod
    def of_pool(cls, pool: ConnectionPool, where: str, wait: Replicas | None) -> ScriptConnections:
        """Connections made like ``pool``'s."""
        return cls(pool.connection_class, pool.connection_kwargs, where, wait=wait)

    async def run(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[ScriptArg],
        *,
        asking: bool = False,
    ) -> Any:
        """Run ``script``; errors translated (see `translate`). With ``redirects``, a
        cluster's redirections (`REDIRECTS`: nothing ran) are raised as they are, for
        the caller to follow; ``asking`` sends ASKING first (after an ASK)."""
        conn = self._idle.pop() if self._idle else self._make()
        watched = None
        if self._watchdog is not None and (task := asyncio.current_task()) is not None:
            watched = (self._watchdog, task)
            self._watchdog.start(task)
        refused: rx.ResponseError | None = None
        try:
            if not conn.is_connected or await _dirty(conn):
                await conn.disconnect(nowait=True)
                await conn.connect()  # type: ignore[no-untyped-call]  # untyped in redis-py
            try:
                reply = await self._call(conn, script, keys, args, asking)
                if self._wait is not None and script.writes:
                    await self._wait.check(conn, self._where)
            except rx.ResponseError as exc:  # the server's whole answer: still in step
                refused = exc
        except BaseException as exc:
            expired = watched is not None and watched[0].end(watched[1], exc)
            await conn.disconnect(nowait=True)
            if expired:
                raise StoreUnavailableError(
                    f"cannot reach Redis at {self._where} (no answer within "
                    f"{self._timeout} s); retry when it is back"
                ) from None
            if isinstance(exc, rx.RedisError | OSError):
                raise translate(exc, self._where) from exc
            raise
        if watched is not None:
            watched[0].end(watched[1], None)
        await self._give_back(conn)
        if refused is not None:
            if self._redirects and isinstance(refused, REDIRECTS):
                raise refused
            raise translate(refused, self._where) from refused
        return reply

    async def _call(
        self,
        conn: AbstractConnection,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Any],
        asking: bool = False,
    ) -> Any:
        if asking:
            await _asking(conn)
        fixed = (script.sha, tuple(keys))
        prefix = self._prefixes.get(fixed)
        if prefix is None:
            if len(self._prefixes) >= self.PREFIXES:
                self._prefixes.clear()
            prefix = self._prefixes[fixed] = _bulks(["EVALSHA", script.sha, len(keys), *keys])
        count = 3 + len(keys) + len(args)
        await conn.send_packed_command(
            b"*%d\r\n%b%b" % (count, prefix, _bulks(args)), check_health=False
        )
        try:
            return await conn.read_response()
        except rx.NoScriptError:  # a restarted (or new) server lacks it: EVAL loads it
            if asking:
                await _asking(conn)
            await conn.send_packed_command(
                pack(["EVAL", script.source, len(keys), *keys, *args]), check_health=False
            )
            return await conn.read_response()

    async def _give_back(self, conn: AbstractConnection) -> None:
        if self._closed or len(self._idle) >= self.KEEP:
            await conn.disconnect()
        else:
            self._idle.append(conn)

    async def close(self) -> None:
        """Close the idle connections; calls still running close theirs when they end."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect()


_ASKING = pack(["ASKING"])


async def _asking(conn: AbstractConnection) -> None:
    """ASKING: the next command (only) may use a slot the node is importing."""
    await conn.send_packed_command(_ASKING, check_health=False)
    await conn.read_response()


REDIRECTS = (rx.MovedError, rx.AskError, rx.TryAgainError, rx.ClusterDownError)
"""A cluster's answers that nothing ran: the slot is elsewhere (now or for this call),
or the cluster is between two states. Following them is always safe."""


class Replicas(NamedTuple):
    """Durability that waits for replicas: after each write, ``WAIT replicas timeout_ms``
    on the connection that wrote. Fewer acknowledgements in time raise `StoreUnavailableError`
    (the write is on the primary and may be lost if it fails now; repeating the same
    call is safe: appends and updates replay as themselves)."""

    replicas: int
    timeout_ms: int

    async def check(self, conn: AbstractConnection, where: str) -> None:
        await conn.send_packed_command(
            pack(["WAIT", self.replicas, self.timeout_ms]), check_health=False
        )
        acked = int(await conn.read_response())
        if acked < self.replicas:
            raise StoreUnavailableError(
                f"Redis at {where} applied the write, but only {acked} of {self.replicas} "
                f"replica(s) confirmed it within {self.timeout_ms} ms, so a failover now "
                "could lose it; retry the same call (it is recognised as a replay), or "
                "check the replicas"
            )


class _Watchdog:
    """The timeout of every call of a `ScriptConnections`, on one timer: a call still
    running at its deadline has its task cancelled, as `asyncio.timeout` would, but a
    call only notes its task and deadline in a dict on the way in and out (a timer per
    call, created and cancelled, costs several times more)."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._calls: dict[asyncio.Task[Any], tuple[float, int]] = {}  # deadline, cancelling
        self._fired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def start(self, task: asyncio.Task[Any]) -> None:
        """A call of ``task`` starts."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._seconds
        self._calls[task] = (deadline, task.cancelling())
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check)

    def end(self, task: asyncio.Task[Any], exc: BaseException | None) -> bool:
        """A call of ``task`` ended (with ``exc``): whether this watchdog's cancellation
        ended it, and no one else's (then it is taken back: the task is not cancelled)."""
        _, cancelling = self._calls.pop(task, (0.0, 0))
        if task not in self._fired:
            return False
        self._fired.discard(task)
        return isinstance(exc, asyncio.CancelledError) and task.uncancel() <= cancelling

    def _check(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        pending = []
        for task, (deadline, _) in self._calls.items():
            if task in self._fired:
                continue
            if deadline <= now:
                self._fired.add(task)
                task.cancel()
            else:
                pending.append(deadline)
        if pending:
            self._timer = loop.call_at(min(pending), self._check)


async def _dirty(conn: AbstractConnection) -> bool:
    """Whether an open connection has unread bytes or was closed by the server."""
    try:
        return await conn.can_read()
    except (rx.ConnectionError, OSError):
        return True


def translate(exc: Exception, where: str) -> StoreError:
    """The most specific statekeeper error for a redis-py or socket error."""
    text = str(exc)
    if isinstance(exc, rx.RedisClusterException) and "not enabled" in text:
        return StoreUnavailableError(
            f"Redis at {where} is not a cluster ({text}); open it with a redis:// URL"
        )
    if isinstance(exc, rx.RedisClusterException):
        return StoreUnavailableError(
            f"cannot reach Redis Cluster at {where} ({text}); retry when it is back"
        )
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
    if isinstance(exc, rx.MovedError | rx.AskError) or text.startswith(("MOVED", "ASK ")):
        return StoreUnavailableError(
            f"Redis at {where} is a node of a Redis Cluster ({text}); open it with a "
            "redis+cluster:// URL"
        )
    if text.startswith("WRONGTYPE"):
        return StoreCorruptError(
            f"a key under this store's prefix at {where} holds another type ({text}); "
            "is another application writing under the same prefix?"
        )
    return StoreError(f"Redis at {where}: {text}")
