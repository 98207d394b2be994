"""Conformance registration of the redis backend.

Runs against ``STATEKEEPER_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). Each
store gets its own key prefix (``ctx.unique``), so tests share the server with anything
else on it; the prefix's keys are deleted afterwards (SCAN + UNLINK of that prefix only,
never FLUSHDB).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from statekeeper.stores import Store, open_store

from .backends import SHARED, BackendContext, backend, require_service, tcp_reachable

REDIS_URL = os.environ.get("STATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


async def delete_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix/`` (and nothing else)."""
    from redis.asyncio import Redis

    client = Redis.from_url(url)
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


@backend("redis", capabilities={SHARED})
async def redis_store(ctx: BackendContext) -> AsyncIterator[Store]:
    """Redis, with a key prefix of its own per store."""
    parts = urlsplit(REDIS_URL)
    host, port = parts.hostname or "localhost", parts.port or 6379
    if not await tcp_reachable(host, port):
        require_service("redis", f"no Redis server reachable at {host}:{port}")
    store = await open_store(REDIS_URL, prefix=ctx.unique, **ctx.options)
    try:
        yield store
    finally:
        await store.close()
        if not ctx.reopen:
            await delete_prefix(REDIS_URL, ctx.unique)
