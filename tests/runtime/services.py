"""The Redis and PostgreSQL test servers of the coordination tests: where they are, a skip
when one is missing (a failure under ``CI=true`` or ``STATEKEEPER_REQUIRE_SERVICES=1``), and
clean-up of what a test wrote."""

from __future__ import annotations

import asyncio
import os
from urllib.parse import urlsplit

import pytest

REDIS_URL = os.environ.get("STATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "STATEKEEPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


async def require(url: str) -> None:
    """Skip the test (fail it when services are required) unless ``url``'s server answers."""
    parts = urlsplit(url)
    port = parts.port or (6379 if parts.scheme == "redis" else 5432)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname or "127.0.0.1", port), 1.0
        )
    except (OSError, TimeoutError):
        reason = f"no {parts.scheme} server at {parts.hostname}:{port}"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"} or os.environ.get(
            "STATEKEEPER_REQUIRE_SERVICES"
        ):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    writer.close()
    await writer.wait_closed()


async def drop_redis_prefix(prefix: str) -> None:
    """Delete every key under ``prefix`` (a test's own key space)."""
    from redis.asyncio import Redis

    client = Redis.from_url(REDIS_URL)
    try:
        async for key in client.scan_iter(match=f"{prefix}/*", count=1000):
            await client.unlink(key)
    finally:
        await client.aclose()


async def drop_postgres_schema(schema: str) -> None:
    """Drop a test schema and everything in it."""
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )
