"""The backends the conformance suite runs against, and how a backend joins.

A backend registers an async generator that yields a fresh, empty store and cleans up
after it::

    @backend("postgres", capabilities={SHARED})
    async def postgres_store(ctx: BackendContext) -> AsyncIterator[Store]:
        url = os.environ.get("STATEKEEPER_TEST_POSTGRES_URL", "postgresql://localhost/sk_test")
        if not await tcp_reachable("localhost", 5432):
            require_service("postgres", f"no PostgreSQL server reachable for {url}")
        store = await open_store(url, schema=ctx.unique, **ctx.options)
        try:
            yield store
        finally:
            await store.close()
            if not ctx.reopen:
                ...  # drop the schema named ctx.unique

Every test taking the ``store`` fixture then runs once more, with the backend's name as
its test id (``test_x[postgres]``). ``ctx.options`` are store options a test asks for
(for example ``max_payload_bytes``): pass them on to ``open_store``.

A backend that can open a second handle on the same data (a file, a server) declares
``capabilities={SHARED}``: the factory is then also called with ``ctx.reopen=True`` and
the context of an existing store, and must open that store's data without wiping it.

A server backend whose server is not running declares itself skipped with
`require_service`; when ``CI=true`` or ``STATEKEEPER_REQUIRE_SERVICES=1`` is set that
skip becomes a failure, so CI cannot go green without having tested the backend.

A test that fails because of a known backend bug is marked
``@backend_bug("sqlite", reason="...")``: it becomes a strict xfail on those backends
only, and keeps running normally everywhere else.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

import pytest

from statekeeper.stores import Store, open_store

__all__ = [
    "BACKENDS",
    "CAPABILITIES",
    "SHARED",
    "Backend",
    "BackendContext",
    "backend",
    "backend_bug",
    "require_service",
    "services_required",
    "tcp_reachable",
]


@dataclass(frozen=True)
class BackendContext:
    """What a backend factory gets for one store."""

    name: str
    """The registered backend name."""
    tmp_path: Path
    """An empty directory of its own, for file-based backends (removed by pytest)."""
    unique: str
    """A short token unique to this store, for naming a database, schema or key prefix."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Store options the test asks for (e.g. ``max_payload_bytes``); pass to open_store."""
    reopen: bool = False
    """True when asked for another handle on the data of an earlier store with the same
    context (backends with the `SHARED` capability only): open that data without creating
    or wiping it, and on exit only close the handle."""


Factory = Callable[[BackendContext], AsyncIterator[Store]]

SHARED = "shared"
"""Capability: two handles can be open on the same data, as two processes would be (a
database file or server). Tests that need a second handle run on these backends only."""
CAPABILITIES = frozenset({SHARED})


@dataclass(frozen=True)
class Backend:
    """A registered backend: a name and the factory that opens a fresh store."""

    name: str
    open: Callable[[BackendContext], AbstractAsyncContextManager[Store]]
    capabilities: frozenset[str] = frozenset()


BACKENDS: dict[str, Backend] = {}
"""Registered backends by name, in registration order (the order tests run in)."""


def backend(name: str, *, capabilities: Iterable[str] = ()) -> Callable[[Factory], Factory]:
    """Register an async generator yielding a fresh, empty store as backend ``name``.

    ``capabilities`` names optional behaviour the backend has (`SHARED`); the tests that
    need one are only generated for backends that have it.
    """
    features = frozenset(capabilities)

    def register(factory: Factory) -> Factory:
        if name in BACKENDS:
            raise ValueError(f"a conformance backend named {name!r} is already registered")
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise ValueError(f"backend name {name!r} must be letters, digits, - and _")
        if not features <= CAPABILITIES:
            raise ValueError(f"unknown capabilities {sorted(features - CAPABILITIES)}")
        BACKENDS[name] = Backend(name, asynccontextmanager(factory), features)
        return factory

    return register


def backend_bug(*names: str, reason: str) -> pytest.MarkDecorator:
    """Mark a test as failing on the named backends because of a known bug.

    On those backends the test is a strict xfail (it must fail; when the bug is fixed
    the test passes, turns into XPASS(strict) and the mark has to be removed). On every
    other backend it runs as a normal test.
    """
    if not names:
        raise ValueError("backend_bug needs at least one backend name")
    return pytest.mark.backend_bug(*names, reason=reason)


# -- services -------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}


def services_required(environ: Mapping[str, str] | None = None) -> bool:
    """True when a missing backend service must fail the run instead of skipping."""
    env = os.environ if environ is None else environ
    return (
        env.get("CI", "").strip().lower() in _TRUE
        or env.get("STATEKEEPER_REQUIRE_SERVICES", "").strip().lower() in _TRUE
    )


def require_service(name: str, reason: str) -> NoReturn:
    """Stop the current test because backend ``name``'s service is unavailable.

    Skips with ``reason`` normally; fails when ``CI=true`` or
    ``STATEKEEPER_REQUIRE_SERVICES=1`` is set, so a CI run cannot silently miss it.
    """
    message = f"{name} backend unavailable: {reason}"
    if services_required():
        pytest.fail(
            f"{message} (required because CI=true or STATEKEEPER_REQUIRE_SERVICES=1 is set)",
            pytrace=False,
        )
    pytest.skip(f"{message} (set STATEKEEPER_REQUIRE_SERVICES=1 to make this an error)")


_reachable: dict[tuple[str, int], bool] = {}


async def tcp_reachable(host: str, port: int, *, seconds: float = 1.0) -> bool:
    """Whether a TCP server answers at host:port. Cached, so only the first test waits."""
    if (host, port) not in _reachable:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), seconds)
        except (OSError, TimeoutError):
            _reachable[host, port] = False
        else:
            writer.close()
            await writer.wait_closed()
            _reachable[host, port] = True
    return _reachable[host, port]


# -- the built-in backends ---------------------------------------------------------------


@backend("memory")
async def memory_store(ctx: BackendContext) -> AsyncIterator[Store]:
    """The in-memory reference backend."""
    store = await open_store("memory://", **ctx.options)
    try:
        yield store
    finally:
        await store.close()


def _sqlite_url(path: Path, query: str = "") -> str:
    url = f"sqlite:///{quote(str(path))}"
    return f"{url}?{query}" if query else url


@backend("sqlite", capabilities={SHARED})
async def sqlite_store(ctx: BackendContext) -> AsyncIterator[Store]:
    """SQLite with the default durability (power: fsync on every commit)."""
    store = await open_store(_sqlite_url(ctx.tmp_path / "state.db"), **ctx.options)
    try:
        yield store
    finally:
        await store.close()


@backend("sqlite-worker", capabilities={SHARED})
async def sqlite_worker_store(ctx: BackendContext) -> AsyncIterator[Store]:
    """SQLite with every transaction on the worker thread (``inline_writes=false``)."""
    url = _sqlite_url(ctx.tmp_path / "state.db", "inline_writes=false")
    store = await open_store(url, **ctx.options)
    try:
        yield store
    finally:
        await store.close()


@backend("sqlite-process", capabilities={SHARED})
async def sqlite_process_store(ctx: BackendContext) -> AsyncIterator[Store]:
    """SQLite with ``durability=process`` (synchronous=NORMAL)."""
    url = _sqlite_url(ctx.tmp_path / "state.db", "durability=process")
    store = await open_store(url, **ctx.options)
    try:
        yield store
    finally:
        await store.close()


# Optional backends register themselves in their own modules (imported last: they use
# the decorators above).
from . import backend_files, backend_postgres, backend_redis  # noqa: E402, F401
