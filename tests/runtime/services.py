"""The Redis and PostgreSQL servers of the coordination tests, through the conformance kit
(`statekeeper.testing`): a skip when one is missing (a failure under ``CI=true`` or
``STATEKEEPER_REQUIRE_SERVICES=1``), and clean-up of what a test wrote."""

from __future__ import annotations

from urllib.parse import urlsplit

from statekeeper.testing.schemes import POSTGRES_URL, REDIS_URL, delete_prefix, drop_schema
from statekeeper.testing.services import require_service, tcp_reachable

__all__ = ["POSTGRES_URL", "REDIS_URL", "drop_postgres_schema", "drop_redis_prefix", "require"]


async def require(url: str) -> None:
    """Skip the test (fail it when services are required) unless ``url``'s server answers."""
    parts = urlsplit(url)
    name = "redis" if parts.scheme == "redis" else "postgres"
    port = parts.port or (6379 if name == "redis" else 5432)
    if not await tcp_reachable(parts.hostname or "127.0.0.1", port):
        require_service(name, f"no server at {parts.hostname}:{port}")


async def drop_redis_prefix(prefix: str) -> None:
    """Delete every key under ``prefix`` (a test's own key space)."""
    await delete_prefix(REDIS_URL, prefix)


async def drop_postgres_schema(schema: str) -> None:
    """Drop a test schema and everything in it."""
    await drop_schema(schema)
