"""Conformance registration of the postgres backend.

Connects to ``STATEKEEPER_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``). Each store gets a PostgreSQL schema of
its own, named by ``ctx.unique`` and dropped when the store is done with.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from statekeeper.stores import Store, open_store

from .backends import SHARED, BackendContext, backend, require_service, tcp_reachable

__all__ = ["POSTGRES_URL", "drop_schema", "postgres_reachable"]

POSTGRES_URL = os.environ.get(
    "STATEKEEPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
"""The server the postgres tests use."""


async def postgres_reachable() -> bool:
    """Whether the test server answers on its TCP port."""
    parts = urlsplit(POSTGRES_URL)
    return await tcp_reachable(parts.hostname or "127.0.0.1", parts.port or 5432)


async def skip_unless_reachable() -> None:
    """Skip (or fail under CI) the current test when the test server is not reachable."""
    if not await postgres_reachable():
        require_service("postgres", f"no PostgreSQL server reachable at {_shown(POSTGRES_URL)}")


async def drop_schema(schema: str) -> None:
    """Drop a test schema and everything in it."""
    import psycopg
    from psycopg import sql

    conninfo = POSTGRES_URL.split("?", 1)[0]
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


def _shown(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}:{parts.port or 5432}{parts.path}"


@backend("postgres", capabilities={SHARED})
async def postgres_store(ctx: BackendContext) -> AsyncIterator[Store]:
    """PostgreSQL, one schema per store (named by ``ctx.unique``)."""
    await skip_unless_reachable()
    store = await open_store(POSTGRES_URL, schema=ctx.unique, **ctx.options)
    try:
        yield store
    finally:
        await store.close()
        if not ctx.reopen:
            await drop_schema(ctx.unique)
