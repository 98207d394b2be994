"""Stores: the protocol, and opening a backend from a URL.

    memory://                         in-process, for tests and demos
    sqlite:///relative/path.db        embedded SQLite file (the default backend)
    sqlite:////absolute/path.db       ... with an absolute path
    postgresql://user@host/db         PostgreSQL (extra: postgres)
    redis://host:6379/0               Redis (extra: redis)
    files:///path/to/dir              plain JSON / JSONL files a person can read

SQLite options go in the query string: ``durability=power|process``,
``busy_timeout=<seconds>``, ``mode=ro`` (read-only), ``max_payload_bytes=<n>``.
Backends load lazily, so an optional backend's driver is imported only when used.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from statekeeper.errors import InvalidInputError
from statekeeper.stores.base import Durability, Store

__all__ = ["BACKENDS", "Durability", "Store", "open_store", "register_backend"]

Opener = Callable[[str, dict[str, str]], Awaitable[Store]]

BACKENDS: dict[str, str] = {
    "memory": "statekeeper.stores.opening:open_memory",
    "sqlite": "statekeeper.stores.opening:open_sqlite",
    "postgresql": "statekeeper.stores.postgres:open_postgres",
    "postgres": "statekeeper.stores.postgres:open_postgres",
    "redis": "statekeeper.stores.redis:open_redis",
    "files": "statekeeper.stores.files:open_files",
}
"""URL scheme -> ``module:function`` that opens it (imported on first use)."""


def register_backend(scheme: str, target: str) -> None:
    """Make ``open_store`` open URLs of ``scheme`` with ``module:function``."""
    BACKENDS[scheme] = target


async def open_store(url: str = "sqlite:///.statekeeper/state.db", **options: Any) -> Store:
    """Open the store a URL names. Keyword options override the URL's query string."""
    parts = urlsplit(url)
    target = BACKENDS.get(parts.scheme)
    if target is None:
        raise InvalidInputError(
            f"unknown store URL scheme {parts.scheme!r} in {url!r}; "
            f"use one of: {', '.join(s + '://' for s in sorted(BACKENDS))}"
        )
    module_name, _, function = target.partition(":")
    opener: Opener = getattr(importlib.import_module(module_name), function)
    query = dict(parse_qsl(parts.query))
    query.update({k: str(v) for k, v in options.items()})
    location = unquote(parts.netloc + parts.path)
    return await opener(location, query)
