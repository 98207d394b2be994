"""Plumbing shared by the parts of the Redis store: the client, scripts, errors, encodings.

Connections: redis-py's own retries are off. A write whose reply was lost may have been
applied, and only the caller knows whether repeating it is safe (an append retried with
the same entry ids replays; a counter added twice is not), so lost connections and
timeouts raise `StoreUnavailableError` at once. The pool checks a connection before
reusing it, so the first operation after a server comes back reconnects and succeeds.
Passwords never appear in ``url`` or in error messages.

Scripts (every write, and most reads) of a store that opened its own client run on
`ScriptConnections`: connections of the store's own beside the client's pool, one
round trip and no extra task per script (see there why). A store given a client runs
them through that client, so its pool settings (limits, sentinels) apply.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

from statekeeper.errors import (
    InvalidInputError,
    MissingExtraError,
    StoreUnavailableError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, encode_json, loads
from statekeeper.loops import HomeLoop, on_their_loops, per_loop, running_loop
from statekeeper.stores.base import ClosingStore, Entry, Event
from statekeeper.stores.redis.cluster import ClusterScripts, RedisCluster
from statekeeper.stores.redis.keys import Keys
from statekeeper.stores.redis.scripts import SESSION_INDEX, Script
from statekeeper.stores.redis.wire import (
    CLIENT_ERRORS,
    Replicas,
    ScriptArg,
    ScriptConnections,
    translate,
)
from statekeeper.stores.rules import corrupt_entry, from_micros, to_micros

try:
    import redis.exceptions as rx
    from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
except ImportError:  # pragma: no cover - depends on the environment
    raise MissingExtraError("Redis store", "redis") from None

__all__ = [
    "DEFAULT_SOCKET_TIMEOUT",
    "AnyRedis",
    "Redis",
    "RedisBase",
    "connect",
    "decode_entry",
    "decode_event",
    "dt",
    "encode_entry",
    "run_script",
    "to_bytes",
    "to_text",
    "translate",
    "us",
]

AnyRedis = Redis | RedisCluster
"""A client of one server or of a cluster."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DEFAULT_SOCKET_TIMEOUT = 5.0
MAX_CONNECTIONS = 100
"""Connections a store's client opens at most (per event loop); more commands wait."""
_OWN_POOLS = (ConnectionPool, BlockingConnectionPool)
"""Pools of the kinds `connect` makes (scripts get connections of their own from them)."""


us = to_micros
"""Microseconds since the epoch (exact; what scores and stored times use)."""
dt = from_micros
"""The UTC time of a microsecond count."""


def to_bytes(value: bytes | str) -> bytes:
    """A reply as bytes (clients made with ``decode_responses=True`` return str)."""
    return value.encode() if isinstance(value, str) else value


def to_text(value: bytes | str) -> str:
    """A reply as str."""
    return value.decode() if isinstance(value, bytes) else value


class RedisBase(HomeLoop, ClosingStore):
    """A client, the store's key names, and running scripts with translated errors."""

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
        validate_id(prefix, "key prefix")
        self.prefix = prefix
        self.max_payload_bytes = max_payload_bytes
        self.cluster = isinstance(client, RedisCluster)
        self.keys = Keys(prefix, spread=self.cluster)
        self._given: AnyRedis | None = client
        self._owns_client = owns_client
        # A client belongs to one event loop: a store that made its client (``make``)
        # makes another for the background loop; a caller's client serves its own loop.
        self._make = make if owns_client else None
        self._given_loop = running_loop()  # the loop the given client's connections belong to
        self.movable = self._make is not None
        self.wait = wait
        if isinstance(client, RedisCluster):
            self._where = ",".join(f"{n.host}:{n.port}" for n in client.startup_nodes)
            self.url = f"redis+cluster://{self._where}?prefix={prefix}"
        else:
            info = client.connection_pool.connection_kwargs
            where = info.get("path") or f"{info.get('host', 'localhost')}:{info.get('port', 6379)}"
            self._where = f"{where}/{info.get('db', 0)}"
            self.url = f"redis://{self._where}?prefix={prefix}"

    @per_loop
    def _parts(self) -> _LoopParts:
        """The client and script connections of the running loop."""
        client = self._given
        if client is None:
            raise StoreUnavailableError("the store is closed; open a new one")
        loop = running_loop()
        if self._given_loop is None:
            self._given_loop = loop
        elif self._make is not None and loop is not self._given_loop:
            client = self._make()
        # Own connections for scripts only with a pool of our own making (see the module).
        scripts: ScriptConnections | ClusterScripts | None = None
        if isinstance(client, RedisCluster):
            scripts = ClusterScripts(client, self._where, self.wait)
        elif self._owns_client and type(client.connection_pool) in _OWN_POOLS:
            scripts = ScriptConnections.of_pool(client.connection_pool, self._where, self.wait)
        return _LoopParts(client, scripts)

    @property
    def _client(self) -> AnyRedis | None:
        return None if self._given is None else self._parts.client

    @property
    def _scripts(self) -> ScriptConnections | ClusterScripts | None:
        return self._parts.scripts

    def __del__(self) -> None:
        if getattr(self, "_owns_client", False) and getattr(self, "_given", None) is not None:
            warnings.warn(
                f"{type(self).__name__}({self._where}) was not closed; call await store.close()",
                ResourceWarning,
                stacklevel=1,
            )

    async def close(self) -> None:
        """Close the connection pools if this store opened them (on every loop it has
        connections on). Idempotent."""
        if self._given is None:
            return
        parts = type(self)._parts.items(self)
        type(self)._parts.drop(self)
        self._given = None
        await on_their_loops(parts, self._close_parts)

    async def _close_parts(self, parts: _LoopParts) -> None:
        if parts.scripts is not None:
            await parts.scripts.close()
        if self._owns_client:
            await parts.client.aclose()

    async def _check(self) -> None:
        """PING the server; `StoreUnavailableError` (and the store closed) if it fails."""
        try:
            with self._translated():
                await self._redis.ping()
        except BaseException:
            await self.close()
            raise

    @property
    def client(self) -> AnyRedis:
        """The redis-py client (coordination features share its connection pool)."""
        return self._redis

    @property
    def where(self) -> str:
        """The server, for messages: ``host:port/db`` (never the credentials)."""
        return self._where

    @property
    def _redis(self) -> AnyRedis:
        if self._given is None:
            raise StoreUnavailableError("the store is closed; open a new one")
        return self._parts.client

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """Translate redis-py and socket errors into statekeeper's (see `translate`)."""
        try:
            yield
        except CLIENT_ERRORS as exc:
            raise translate(exc, self._where) from exc

    async def _index(
        self, tenant: str, op: str, session_id: str, active: datetime | None = None
    ) -> None:
        """Keep a cluster's session index (its own slot; see `SESSION_INDEX`)."""
        score = 0 if active is None else us(active)
        await self._run(SESSION_INDEX, [self.keys.sessions(tenant)], [op, score, session_id])

    async def _run(self, script: Script, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
        if self._given is None:
            raise StoreUnavailableError("the store is closed; open a new one")
        parts = self._parts
        if parts.scripts is not None:
            return await parts.scripts.run(script, keys, args)
        return await run_script(parts.client, script, keys, args, self._where)


class _LoopParts(NamedTuple):
    client: AnyRedis
    scripts: ScriptConnections | ClusterScripts | None


async def run_script(
    client: AnyRedis, script: Script, keys: Sequence[str], args: Sequence[Any], where: str
) -> Any:
    """EVALSHA, loading the script first if the server does not know it (after a restart),
    with errors translated (see `translate`)."""
    try:
        try:
            return await client.evalsha(script.sha, len(keys), *keys, *args)
        except rx.NoScriptError:
            await client.script_load(script.source)
            return await client.evalsha(script.sha, len(keys), *keys, *args)
    except CLIENT_ERRORS as exc:
        raise translate(exc, where) from exc


def connect(location: str, *, socket_timeout: float) -> Redis:
    """A client for the URL's unquoted netloc + path: ``[[user]:password@]host[:port][/db]``
    or a unix socket path. Commands are never retried (see the module docstring).

    Its pool holds at most `MAX_CONNECTIONS`; a command that finds them all busy waits
    for one (up to ``socket_timeout``) instead of failing: redis-py's default pool
    raised "Too many connections" past 100 commands in flight."""
    pool = BlockingConnectionPool(
        max_connections=MAX_CONNECTIONS,
        timeout=socket_timeout,
        **_address(location),
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
        protocol=2,
    )
    return Redis.from_pool(pool)


def _address(location: str) -> dict[str, Any]:
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
        settings["db"] = int(db.strip("/") or 0)
    except ValueError:
        # The address, never the credentials, goes into the message.
        raise InvalidInputError(
            f"invalid Redis address {address!r}; use redis://host:port/db"
        ) from None
    return settings


# -- stored forms ------------------------------------------------------------------------
# A transcript entry is one member of the session's entries sorted set, scored by its seq:
# a JSON header [id, parent_seq, kind, created_us], a newline, then the payload's JSON
# text. JSON escapes newlines inside strings, so the first newline ends the header.


def encode_entry(entry: Entry, text: str) -> bytes:
    """An entry as stored (``text`` is its payload's JSON).

    The header is written directly: the id is a checked id (`statekeeper.ids`: nothing
    in it needs escaping), the parent and the time are ints, and the kind's JSON is
    cached (an append has one of a few kinds).
    """
    parent = "null" if entry.parent_seq is None else entry.parent_seq
    header = f'["{entry.id}",{parent},{_kind_json(entry.kind)},{us(entry.created_at)}]'
    return f"{header}\n{text}".encode()


@lru_cache(maxsize=256)
def _kind_json(kind: str) -> str:
    return encode_json(kind, what=f"entry kind {kind!r}")


def decode_entry(member: bytes, seq: int, *, payload: bool = True) -> Entry:
    """A stored entry; undecodable bytes become a "corrupt" entry, never a skip.

    With ``payload=False`` only the header is decoded (the payload is left empty).
    """
    header, _, body = member.partition(b"\n")
    try:
        entry_id, parent, kind, created_us = loads(header)
        created = dt(created_us)
        if not isinstance(entry_id, str) or not isinstance(kind, str):
            raise ValueError("entry header has the wrong types")
    except (ValueError, TypeError) as exc:
        raw = member.decode(errors="replace")
        return corrupt_entry(seq, f"corrupt-{seq}", None, EPOCH, raw, f"bad header: {exc}")
    if not payload:
        return Entry(seq, entry_id, parent, kind, created, {})
    try:
        data = loads(body)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    except ValueError as exc:
        return corrupt_entry(
            seq, entry_id, parent, created, body.decode(errors="replace"), str(exc)
        )
    return Entry(seq, entry_id, parent, kind, created, data)


def decode_event(log_id: str, stream_id: bytes | str, fields: Any) -> Event:
    """An event from its stream entry (id ``<seq>-0``; fields s, k, t, p).

    Undecodable fields give an event of stream "error", kind "corrupt" (never a skip).
    """
    seq = int(to_text(stream_id).partition("-")[0])
    get = {to_text(k): v for k, v in dict(fields or {}).items()}
    try:
        payload = loads(get["p"])
        stream, kind, ts = to_text(get["s"]), to_text(get["k"]), dt(int(get["t"]))
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raw = str(get.get("p", b""))[:200]
        return Event(log_id, seq, "error", "corrupt", EPOCH, {"error": str(exc), "raw": raw})
    return Event(log_id, seq, stream, kind, ts, payload)
