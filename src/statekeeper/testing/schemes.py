"""The built-in URL schemes and the backends statekeeper's own suite runs against.

How each scheme gives every test a fresh store of its own, from a base URL:

- ``memory://``: every open is a new, empty store (so no second handle, no processes);
- ``sqlite:///<dir>/<name>`` and ``files:///<dir>``: a new temporary folder per store,
  keeping the URL's last path part (``state.db``, ``root``) and its query options;
- ``postgresql://`` (or ``postgres://``): a schema per store (``schema=``), dropped after;
- ``redis://``: a key prefix per store (``prefix=``), whose keys are deleted after;
- ``redis+cluster://``: the same on every master of a cluster. The suite's cluster
  (``STATEKEEPER_TEST_REDIS_CLUSTER_URL``, default ``redis+cluster://127.0.0.1:7101``)
  is started by `start_local_cluster` when nothing answers there.

Each backend also runs sealed (``<name>-sealed``): the same URL with
``keyring=env:STATEKEEPER_TEST_KEYRING``, a keyring of one random key made for the test
run (and inherited by the writer processes the suite starts).

The server backends skip (or fail under CI, see `require_service`) when their server
does not answer. Their servers are ``STATEKEEPER_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and ``STATEKEEPER_TEST_REDIS_URL``
(default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import PurePosixPath
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from statekeeper.testing.registry import (
    DAMAGE,
    JOINT,
    PROCESSES,
    REWRITE,
    SHARED,
    THREADS,
    BackendContext,
    register_scheme,
    url_backend,
)
from statekeeper.testing.services import require_service, start_local_cluster, tcp_reachable

__all__ = [
    "POSTGRES_URL",
    "REDIS_CLUSTER_URL",
    "REDIS_URL",
    "TEST_KEYRING_VAR",
    "delete_cluster_prefix",
    "delete_prefix",
    "drop_schema",
    "postgres_reachable",
    "skip_unless_reachable",
]

POSTGRES_URL = os.environ.get(
    "STATEKEEPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
"""The PostgreSQL server statekeeper's own tests use."""
REDIS_URL = os.environ.get("STATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
"""The Redis server statekeeper's own tests use."""
REDIS_CLUSTER_URL = os.environ.get(
    "STATEKEEPER_TEST_REDIS_CLUSTER_URL", "redis+cluster://127.0.0.1:7101"
)
"""A node of the Redis Cluster statekeeper's own tests use (started if it does not answer)."""


def _in_folder(url: str, ctx: BackendContext, default: str) -> str:
    """The URL's last path part and query, moved into the context's own folder."""
    parts = urlsplit(url)
    name = PurePosixPath(unquote(parts.path)).name or default
    location = f"{parts.scheme}:///{quote(str(ctx.tmp_path / name))}"
    return f"{location}?{parts.query}" if parts.query else location


def _with_option(url: str, name: str, value: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query[name] = value
    return parts._replace(query=urlencode(query)).geturl()


def _shown(url: str, default_port: int) -> str:
    """The URL without credentials or options, for messages."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}:{parts.port or default_port}{parts.path}"


async def _require_server(backend: str, server: str, url: str, default_port: int) -> None:
    parts = urlsplit(url)
    if not await tcp_reachable(parts.hostname or "127.0.0.1", parts.port or default_port):
        shown = _shown(url, default_port)
        require_service(backend, f"no {server} server reachable at {shown}")


# -- PostgreSQL ---------------------------------------------------------------------------


async def postgres_reachable(url: str = POSTGRES_URL) -> bool:
    """Whether the PostgreSQL server of ``url`` answers on its TCP port."""
    parts = urlsplit(url)
    return await tcp_reachable(parts.hostname or "127.0.0.1", parts.port or 5432)


async def skip_unless_reachable(url: str = POSTGRES_URL) -> None:
    """Skip (or fail under CI) the current test when the PostgreSQL server is down."""
    await _require_server("postgres", "PostgreSQL", url, 5432)


_require_postgres = skip_unless_reachable


async def drop_schema(schema: str, url: str = POSTGRES_URL) -> None:
    """Drop a PostgreSQL schema and everything in it."""
    import psycopg
    from psycopg import sql

    conninfo = url.split("?", 1)[0]  # statekeeper's own options mean nothing to libpq
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


async def _drop_postgres(url: str, ctx: BackendContext) -> None:
    await drop_schema(ctx.unique, url)


# -- Redis --------------------------------------------------------------------------------


async def delete_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix/`` (SCAN + UNLINK of that prefix only, never FLUSHDB)."""
    from redis.asyncio import Redis

    client = Redis.from_url(url.split("?", 1)[0])
    try:
        batch: list[bytes] = []
        async for key in client.scan_iter(match=f"{prefix}/*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                await client.unlink(*batch)
                batch.clear()
        if batch:
            await client.unlink(*batch)
    finally:
        await client.aclose()


async def _require_redis(url: str) -> None:
    await _require_server("redis", "Redis", url, 6379)


async def _require_redis_cluster(url: str) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 7101
    if not await tcp_reachable(host, port) and await start_local_cluster(port):
        return
    await _require_server("redis-cluster", "Redis Cluster", url, 7101)


async def _drop_redis_cluster(url: str, ctx: BackendContext) -> None:
    await delete_cluster_prefix(url, ctx.unique)


async def delete_cluster_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix/`` on every master of the cluster a node of which
    ``url`` names (one key per UNLINK: keys of different slots never share a command).
    The masters are looked up once per URL, and again when one of them fails."""
    parts = urlsplit(url)
    seed = (parts.hostname or "127.0.0.1", parts.port or 7101)
    for attempt in range(2):
        masters = _cluster_masters.get(seed) if not attempt else None
        if masters is None:
            masters = _cluster_masters[seed] = await _masters_of(*seed)
        try:
            await asyncio.gather(*(_delete_on(host, port, prefix) for host, port in masters))
            return
        except Exception:  # a master gone or moved (a failover): look again, once
            _cluster_masters.pop(seed, None)
            if attempt:
                raise


_cluster_masters: dict[tuple[str, int], list[tuple[str, int]]] = {}


async def _masters_of(host: str, port: int) -> list[tuple[str, int]]:
    from redis.asyncio.cluster import RedisCluster

    cluster = RedisCluster(host=host, port=port)
    try:
        await cluster.initialize()
        return [(node.host, int(node.port)) for node in cluster.get_primaries()]
    finally:
        await cluster.aclose()


async def _delete_on(host: str, port: int, prefix: str) -> None:
    from redis.asyncio import Redis

    client = Redis(host=host, port=port)
    try:
        async with client.pipeline(transaction=False) as pipe:
            async for key in client.scan_iter(match=f"{prefix}/*", count=1000):
                pipe.unlink(key)
            await pipe.execute()
    finally:
        await client.aclose()


async def _drop_redis(url: str, ctx: BackendContext) -> None:
    await delete_prefix(url, ctx.unique)


# -- registration -------------------------------------------------------------------------

OUTSIDE = (SHARED, PROCESSES, DAMAGE, REWRITE, THREADS)
"""What every built-in backend that keeps its data outside the process can do (the suite
damages its stored rows with `statekeeper.testing.damage`)."""
SERVED = (*OUTSIDE, JOINT)
"""... and, but for the files backend and Redis Cluster, entries and events in one step."""

register_scheme("memory", lambda url, ctx: url, capabilities=(REWRITE, THREADS, JOINT))
register_scheme("sqlite", lambda url, ctx: _in_folder(url, ctx, "state.db"), capabilities=SERVED)
register_scheme("files", lambda url, ctx: _in_folder(url, ctx, "root"), capabilities=OUTSIDE)
for _name in ("postgresql", "postgres"):
    register_scheme(
        _name,
        lambda url, ctx: _with_option(url, "schema", ctx.unique),
        capabilities=SERVED,
        prepare=_require_postgres,
        drop=_drop_postgres,
    )
register_scheme(
    "redis",
    lambda url, ctx: _with_option(url, "prefix", ctx.unique),
    capabilities=SERVED,
    prepare=_require_redis,
    drop=_drop_redis,
)
register_scheme(
    "redis+cluster",
    lambda url, ctx: _with_option(url, "prefix", ctx.unique),
    capabilities=OUTSIDE,
    prepare=_require_redis_cluster,
    drop=_drop_redis_cluster,
)

# statekeeper's own matrix, in the order its tests run.
url_backend("memory", "memory://")
url_backend("sqlite", "sqlite:///state.db")  # default durability: fsync on every commit
url_backend("sqlite-worker", "sqlite:///state.db?inline_writes=false")  # all on the worker
url_backend("sqlite-process", "sqlite:///state.db?durability=process")  # synchronous=NORMAL
url_backend("files", "files:///root")
url_backend("postgres", POSTGRES_URL)
url_backend("redis", REDIS_URL)
url_backend("redis-cluster", REDIS_CLUSTER_URL)

# The same matrix with encryption at rest. The keyring is named in the URL, never written
# in it: other processes the suite starts inherit the variable.
TEST_KEYRING_VAR = "STATEKEEPER_TEST_KEYRING"
"""The environment variable holding the keyring the ``-sealed`` backends use."""
os.environ.setdefault(
    TEST_KEYRING_VAR,
    json.dumps(
        {"current": "test-1", "keys": {"test-1": base64.b64encode(os.urandom(32)).decode()}}
    ),
)
_SEALED = f"keyring=env:{TEST_KEYRING_VAR}"
# Rewriting payloads is a primitive of the plain backend under the wrapper (reseal calls
# it on `SealedStore.wrapped`, tests/sealed test it there): the sealed ones lack `REWRITE`.
_SEALED_SERVED = (SHARED, PROCESSES, DAMAGE, THREADS, JOINT)
url_backend("memory-sealed", f"memory://?{_SEALED}", capabilities=(THREADS, JOINT))
url_backend("sqlite-sealed", f"sqlite:///state.db?{_SEALED}", capabilities=_SEALED_SERVED)
url_backend("files-sealed", f"files:///root?{_SEALED}", capabilities=_SEALED_SERVED[:-1])
url_backend(
    "postgres-sealed",
    f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}{_SEALED}",
    capabilities=_SEALED_SERVED,
)
url_backend(
    "redis-sealed",
    f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}{_SEALED}",
    capabilities=_SEALED_SERVED,
)
url_backend(
    "redis-cluster-sealed",
    f"{REDIS_CLUSTER_URL}{'&' if '?' in REDIS_CLUSTER_URL else '?'}{_SEALED}",
    capabilities=_SEALED_SERVED[:-1],  # an append's events come after it, as on files
)
