"""Stores: the protocol, and opening a backend from a URL.

    memory://                         in-process, for tests and demos
    sqlite:///relative/path.db        embedded SQLite file (the default backend)
    sqlite:////absolute/path.db       ... with an absolute path
    postgresql://user@host/db         PostgreSQL (extra: postgres)
    redis://host:6379/0               Redis (extra: redis)
    redis+cluster://host:7000[,...]   Redis Cluster (extra: redis)
    files:///path/to/dir              plain JSON / JSONL files a person can read

SQLite options go in the query string: ``durability=power|process``,
``busy_timeout=<seconds>``, ``mode=ro`` (read-only), ``max_payload_bytes=<n>``,
``inline_writes=true|false``, ``page_size=<bytes>`` (new files only).

Every backend takes the encryption options of `statekeeper.stores.sealed`: ``keyring=``
(a `Keyring`, or in a URL only where it lives: ``env:VARIABLE`` or ``file:PATH``, never a
key), ``clear_metadata=`` (metadata keys listings may filter on; a URL takes them comma
separated) and ``allow_plain=`` (see ``docs/encryption.md``). A store once opened with a
keyring is marked sealed, and opening it without one raises `WrongKeyError`
(`statekeeper.stores.sealed.marker`).
Backends load lazily, so an optional backend's driver is imported only when used.
Every name here is described in ``docs/stores.md``.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Coroutine, Generator
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from statekeeper.errors import InvalidInputError
from statekeeper.stores.base import Durability, Store
from statekeeper.stores.options import StoreOptions

__all__ = [
    "BACKENDS",
    "Durability",
    "Store",
    "StoreOpening",
    "StoreOptions",
    "open_store",
    "register_backend",
]

Opener = Callable[[str, StoreOptions], Awaitable[Store]]

BACKENDS: dict[str, str] = {
    "memory": "statekeeper.stores.memory:open_memory",
    "sqlite": "statekeeper.stores.sqlite:open_sqlite",
    "postgresql": "statekeeper.stores.postgres:open_postgres",
    "postgres": "statekeeper.stores.postgres:open_postgres",
    "redis": "statekeeper.stores.redis:open_redis",
    "redis+cluster": "statekeeper.stores.redis:open_redis_cluster",
    "files": "statekeeper.stores.files:open_files",
}
"""URL scheme -> ``module:function`` that opens it (imported on first use)."""


def register_backend(scheme: str, target: str) -> None:
    """Make ``open_store`` open URLs of ``scheme`` with ``module:function``.

    The function is ``async def open_x(location: str, options: StoreOptions) -> Store``:
    ``location`` is the URL after ``scheme://`` (query removed), and it takes its options
    from `StoreOptions` and ends with ``options.done()``.
    """
    BACKENDS[scheme] = target


class StoreOpening(Coroutine[Any, Any, Store]):
    """What `open_store` returns: await it for the store, or use it with ``async with``.

    It is a coroutine (so ``asyncio.run(open_store(url))`` works too); the opening
    starts only when it is awaited or entered.
    """

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self._url = url
        self._options = options
        self._running: Coroutine[Any, Any, Store] | None = None
        self._store: Store | None = None

    def _coroutine(self) -> Coroutine[Any, Any, Store]:
        if self._running is None:
            self._running = _open(self._url, self._options)
        return self._running

    def __await__(self) -> Generator[Any, None, Store]:
        return self._coroutine().__await__()

    def send(self, value: Any) -> Any:
        return self._coroutine().send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._coroutine().throw(typ)
        return self._coroutine().throw(typ, val, tb)

    def close(self) -> None:
        if self._running is not None:
            self._running.close()

    async def __aenter__(self) -> Store:
        self._store = await self
        return self._store

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            await store.close()


def open_store(url: str = "sqlite:///.statekeeper/state.db", **options: Any) -> StoreOpening:
    """Open the store a URL names. Keyword options override the URL's query string.

    ``store = await open_store(url)`` (close it with ``await store.close()``), or
    ``async with open_store(url) as store:``, which closes it on the way out.
    """
    return StoreOpening(url, options)


async def _open(url: str, options: dict[str, Any]) -> Store:
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
    sealing = _sealing(query, options)
    query.update({k: str(v) for k, v in options.items()})
    location = unquote(parts.netloc + parts.path)
    limit = None
    if sealing is not None and target in _BUILT_IN:
        # The limit a user sets is on what they store; the backend stores it sealed.
        limit = StoreOptions(parts.scheme, query).max_payload_bytes()
        query["max_payload_bytes"] = str(limit * 4 // 3 + _SEALING_OVERHEAD)
    store = await opener(location, StoreOptions(parts.scheme, query))
    if sealing is None and parts.scheme in _UNSEALED_SCHEMES:
        return store
    from statekeeper.stores.sealed.marker import check_opening

    try:
        await check_opening(store, parts.scheme, url, None if sealing is None else sealing[0])
    except BaseException:
        await store.close()
        raise
    if sealing is None:
        return store
    from statekeeper.stores.sealed import SealedStore

    keyring, clear, allow_plain = sealing
    return SealedStore(
        store, keyring, clear_metadata=clear, allow_plain=allow_plain, max_payload_bytes=limit
    )


_BUILT_IN = frozenset(BACKENDS.values())
_UNSEALED_SCHEMES = frozenset({"memory"})
"""Schemes whose stores live in one process: never sealed by another, so not checked."""
_SEALING_OVERHEAD = 4096
"""Bytes a sealed row may take beyond 4/3 of its JSON (base64): envelope headers."""


_SEALING = ("keyring", "clear_metadata", "allow_plain")
_SECRET_NAMES = ("key", "keys", "codec", "secret", "password")


def _sealing(query: dict[str, str], options: dict[str, Any]) -> tuple[Any, list[str], bool] | None:
    """Take the encryption options out of the URL query and keyword options (or None)."""
    for name in _SECRET_NAMES:
        if name in query:
            # Never echo the value: it may be a key, and messages end up in logs.
            raise InvalidInputError(
                f"store URL option {name!r} is refused: a key must never be written in a URL "
                "(it ends up in logs); pass keyring=Keyring(...) to open_store, or name where "
                "the keyring lives with ?keyring=env:VARIABLE or ?keyring=file:PATH"
            )
    if "codec" in options:
        raise InvalidInputError(
            "open_store takes keyring=Keyring(...) for encryption at rest, not codec= "
            "(a StateCodec seals run states and exports; see docs/encryption.md)"
        )
    taken = {n: options.pop(n) for n in _SEALING if n in options}
    for name in _SEALING:
        if name in query and name not in taken:
            taken[name] = query[name]
        query.pop(name, None)
    if not taken:
        return None
    from statekeeper.stores.sealed import Keyring

    keyring = taken.get("keyring")
    if isinstance(keyring, str):
        keyring = Keyring.from_source(keyring)
    if keyring is None:
        raise InvalidInputError(
            "clear_metadata and allow_plain are options of encryption at rest: pass "
            "keyring= as well"
        )
    clear = taken.get("clear_metadata", ())
    if isinstance(clear, str):
        clear = [k for k in clear.split(",") if k]
    allow = taken.get("allow_plain", False)
    if isinstance(allow, str):
        allow = StoreOptions("store", {"allow_plain": allow}).take("allow_plain", bool, False)
    return keyring, list(clear), bool(allow)
