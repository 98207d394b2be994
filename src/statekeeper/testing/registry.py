"""The backends the conformance suite runs against, their capabilities, and how one joins.

A backend is a name, a way to open a fresh, empty store, and the capabilities it has.
The simplest joins by URL, when the URL's scheme knows how to make a fresh store per
test (the built-in schemes do; see `register_scheme`)::

    url_backend("sqlite-process", "sqlite:///state.db?durability=process")

Any other backend registers an async generator that yields a fresh store and cleans up::

    @backend("mydb", capabilities={SHARED})
    async def mydb_store(ctx: BackendContext) -> AsyncIterator[Store]:
        store = await open_store(f"mydb://localhost/{ctx.unique}", **ctx.options)
        try:
            yield store
        finally:
            await store.close()
            if not ctx.reopen:
                ...  # drop what ctx.unique named

Every test taking the ``store`` fixture then runs once per backend, with its name as the
test id (``test_x[mydb]``). Capabilities: every backend must pass the `BASE` tests;
`SHARED`, `PROCESSES`, `DAMAGE`, `REWRITE` and `THREADS` tests run on backends that declare
them and are skipped, with the reason, on the others.

Nothing here imports pytest until a pytest mark is asked for.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from statekeeper.stores import Store, open_store

if TYPE_CHECKING:
    import pytest

__all__ = [
    "BACKENDS",
    "BASE",
    "CAPABILITIES",
    "DAMAGE",
    "EXTENDED",
    "JOINT",
    "PROCESSES",
    "REWRITE",
    "SCHEMES",
    "SHARED",
    "THREADS",
    "Backend",
    "BackendContext",
    "Scheme",
    "backend",
    "backend_bug",
    "needs",
    "open_backend",
    "register_scheme",
    "url_backend",
]

BASE = "base"
"""Capability: the behaviour every store must have. Its tests run on every backend."""
SHARED = "shared"
"""Capability: two handles can be open on the same data, as two processes would be (a
database file or server); a write through one is seen and respected by the other."""
PROCESSES = "processes"
"""Capability: other OS processes can open the same data by URL and write to it
concurrently (the backend gives the suite that URL)."""
DAMAGE = "damage"
"""Capability: the suite can damage stored rows below the API (`statekeeper.testing.damage`
has a `Damager` for the backend's store), to prove damaged rows never hide the rest."""
REWRITE = "rewrite"
"""Capability: stored entry and event payloads can be rewritten in place
(``rewrite_entry_payloads``, ``rewrite_event_payloads``: what `statekeeper reseal` uses;
see ``docs/stores.md``)."""
THREADS = "threads"
"""Capability: one store object serves any thread and any event loop at once (a loop of
each thread, ``asyncio.run`` per call, the blocking facade), its callers cancelled or
their loops closed mid-write: no call hangs, no write is lost, torn or interleaved."""
JOINT = "joint"
"""Capability: an append's events (``append_entries(events=...)``) are written in the
same atomic step as its entries, so a crash leaves both or neither. Without it a crash
may leave the entries of the last append without their events (never the reverse): the
files backend (two files) and Redis Cluster (two slots)."""
CAPABILITIES: Mapping[str, str] = {
    BASE: "the store protocol every backend must implement",
    SHARED: "a second handle on the same data, as another process would hold",
    PROCESSES: "other OS processes writing to the same data, opened by URL",
    DAMAGE: "stored rows the suite can damage below the API (statekeeper.testing.damage)",
    REWRITE: "entry and event payloads rewritten in place (what statekeeper reseal uses)",
    THREADS: "one store object used from many threads and event loops at once",
    JOINT: "an append's events written in the same atomic step as its entries",
}
"""Every capability the suite knows, with a one-line description."""
EXTENDED = frozenset(CAPABILITIES) - {BASE}
"""The optional capabilities: tests of one a backend lacks are skipped on it."""


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
    context (backends with `SHARED` only): open that data without creating or wiping it,
    and on exit only close the handle."""


Factory = Callable[[BackendContext], AsyncIterator[Store]]
"""An async generator function yielding a fresh store for a context, cleaning up after."""


@dataclass(frozen=True)
class Backend:
    """A backend the suite can run against."""

    name: str
    open: Callable[[BackendContext], AbstractAsyncContextManager[Store]]
    """Opens the store of a context (a fresh one unless ``ctx.reopen``); closes it on exit."""
    capabilities: frozenset[str] = frozenset()
    """The extended capabilities it has (`BASE` is implied)."""
    url: Callable[[BackendContext], str] | None = None
    """The URL another process opens the store of a context with (needed for `PROCESSES`)."""
    imports: tuple[str, ...] = ()
    """Modules another process imports before opening that URL (e.g. one that calls
    ``register_backend`` for a third-party scheme)."""

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_" for c in self.name):
            raise ValueError(f"backend name {self.name!r} must be letters, digits, - and _")
        if not self.capabilities <= EXTENDED:
            unknown = sorted(self.capabilities - EXTENDED)
            raise ValueError(f"unknown capabilities {unknown}; known: {sorted(EXTENDED)}")
        if PROCESSES in self.capabilities and self.url is None:
            raise ValueError(f"backend {self.name!r} has {PROCESSES!r} but no url function")

    def has(self, capability: str) -> bool:
        """Whether this backend has ``capability`` (every backend has `BASE`)."""
        return capability == BASE or capability in self.capabilities


BACKENDS: dict[str, Backend] = {}
"""Registered backends by name, in registration order (the order tests run in)."""


def _register(made: Backend) -> Backend:
    if made.name in BACKENDS:
        raise ValueError(f"a conformance backend named {made.name!r} is already registered")
    BACKENDS[made.name] = made
    return made


def backend(
    name: str,
    *,
    capabilities: Iterable[str] = (),
    url: Callable[[BackendContext], str] | None = None,
    imports: Iterable[str] = (),
) -> Callable[[Factory], Factory]:
    """Register an async generator yielding a fresh, empty store as backend ``name``.

    ``capabilities`` names the extended capabilities it has; ``url`` (required with
    `PROCESSES`) gives the URL of a context's store, and ``imports`` the modules another
    process must import before opening it.
    """

    def register(factory: Factory) -> Factory:
        _register(
            Backend(
                name,
                asynccontextmanager(factory),
                frozenset(capabilities),
                url,
                tuple(imports),
            )
        )
        return factory

    return register


@dataclass(frozen=True)
class Scheme:
    """How the suite makes fresh, separate stores from a base URL of one scheme."""

    fresh: Callable[[str, BackendContext], str]
    """The URL of the store of a context: empty at first, shared by its reopens only."""
    capabilities: frozenset[str] = frozenset()
    """The extended capabilities stores of this scheme have."""
    prepare: Callable[[str], Awaitable[None]] | None = None
    """Runs before each store opens (e.g. `require_service` when the server is down)."""
    drop: Callable[[str, BackendContext], Awaitable[None]] | None = None
    """Deletes a context's data after its store closed (e.g. a schema or key prefix)."""


SCHEMES: dict[str, Scheme] = {}
"""URL scheme -> how to make fresh stores of it (the built-in schemes are registered by
``statekeeper.testing``)."""


def register_scheme(
    scheme: str,
    fresh: Callable[[str, BackendContext], str],
    *,
    capabilities: Iterable[str] = (),
    prepare: Callable[[str], Awaitable[None]] | None = None,
    drop: Callable[[str, BackendContext], Awaitable[None]] | None = None,
) -> None:
    """Let `url_backend` and ``validate(url)`` run the suite on URLs of ``scheme``."""
    SCHEMES[scheme] = Scheme(fresh, frozenset(capabilities), prepare, drop)


def url_backend(
    name: str,
    url: str,
    *,
    capabilities: Iterable[str] | None = None,
    imports: Iterable[str] = (),
    register: bool = True,
) -> Backend:
    """A backend opening fresh stores derived from ``url`` by its scheme (`SCHEMES`).

    ``capabilities`` defaults to the scheme's. Registered as ``name`` unless
    ``register=False``.
    """
    scheme_name = urlsplit(url).scheme
    scheme = SCHEMES.get(scheme_name)
    if scheme is None:
        raise ValueError(
            f"no conformance scheme for {scheme_name!r} URLs (known: {sorted(SCHEMES)}); "
            "register one with statekeeper.testing.register_scheme, or a factory with "
            "@statekeeper.testing.backend"
        )

    @asynccontextmanager
    async def open_url(ctx: BackendContext) -> AsyncIterator[Store]:
        if scheme.prepare is not None:
            await scheme.prepare(url)
        store = await open_store(scheme.fresh(url, ctx), **ctx.options)
        try:
            yield store
        finally:
            await store.close()
            if scheme.drop is not None and not ctx.reopen:
                await scheme.drop(url, ctx)

    def url_of(ctx: BackendContext) -> str:
        return scheme.fresh(url, ctx)

    features = scheme.capabilities if capabilities is None else frozenset(capabilities)
    made = Backend(name, open_url, features, url_of, tuple(imports))
    return _register(made) if register else made


def new_context(made: Backend, tmp_path: Path, **options: Any) -> BackendContext:
    """A context for a fresh store of ``made`` in ``tmp_path`` (which must exist)."""
    return BackendContext(made.name, tmp_path, f"sk{uuid.uuid4().hex[:16]}", options)


def open_backend(
    made: Backend | str, tmp_path: Path, **options: Any
) -> AbstractAsyncContextManager[Store]:
    """``async with open_backend("sqlite", tmp_path) as store:`` a fresh store of a backend."""
    chosen = BACKENDS[made] if isinstance(made, str) else made
    return chosen.open(new_context(chosen, tmp_path, **options))


def backend_bug(*names: str, reason: str) -> pytest.MarkDecorator:
    """Mark a test as failing on the named backends because of a known bug.

    On those backends the test is a strict xfail (it must fail; when the bug is fixed
    the test passes, turns into XPASS(strict) and the mark has to be removed). On every
    other backend it runs as a normal test.
    """
    import pytest

    if not names:
        raise ValueError("backend_bug needs at least one backend name")
    return pytest.mark.backend_bug(*names, reason=reason)


def needs(*capabilities: str) -> pytest.MarkDecorator:
    """Mark a test as testing extended capabilities: it is skipped on backends lacking one."""
    import pytest

    unknown = set(capabilities) - EXTENDED
    if unknown or not capabilities:
        raise ValueError(f"needs() takes capabilities among {sorted(EXTENDED)}, not {unknown}")
    return pytest.mark.needs_capability(*capabilities)
