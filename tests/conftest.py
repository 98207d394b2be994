"""A ``store`` fixture for the feature suites (sessions, runs): every test runs on each
backend. Backends that need a server skip when it is missing, and fail under ``CI=true``
or ``STATEKEEPER_REQUIRE_SERVICES=1``. (The conformance suite has its own registry.)"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from statekeeper.stores import Store, open_store

REDIS_URL = os.environ.get("STATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "STATEKEEPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
FEATURE_BACKENDS = ["memory", "sqlite", "files", "redis", "postgres"]


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _need(name: str, host: str, port: int) -> None:
    if _reachable(host, port):
        return
    reason = f"no {name} server at {host}:{port}"
    if os.environ.get("CI") == "true" or os.environ.get("STATEKEEPER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (required: CI=true or STATEKEEPER_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


@pytest.fixture(params=FEATURE_BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    name = request.param
    prefix = f"sk-test-{uuid.uuid4().hex[:12]}"
    if name == "memory":
        url = "memory://"
    elif name == "sqlite":
        url = f"sqlite:///{tmp_path / 'state.db'}"
    elif name == "files":
        url = f"files:///{tmp_path / 'files'}"
    elif name == "redis":
        _need("Redis", "127.0.0.1", 6379)
        url = f"{REDIS_URL}?prefix={prefix}"
    else:
        _need("PostgreSQL", "127.0.0.1", 5432)
        schema = prefix.replace("-", "_")
        url = f"{POSTGRES_URL}?schema={schema}"
    opened = await open_store(url)
    try:
        yield opened
    finally:
        await opened.close()
        if name == "redis":
            await _drop_redis_prefix(prefix)
        elif name == "postgres":
            await _drop_postgres_schema(prefix.replace("-", "_"))


async def _drop_redis_prefix(prefix: str) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}/*", count=1000)]
        if keys:
            await client.unlink(*keys)
    finally:
        await client.aclose()


async def _drop_postgres_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )
