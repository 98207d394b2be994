"""The store behind an adapter: the caller's, or one the adapter opened from a URL.

The rule every adapter follows (``docs/integrations/README.md``):

- a store the caller passes in stays the caller's: closing the adapter leaves it open;
- a store the adapter opens from a URL (``from_url``) is the adapter's: ``close()``,
  ``aclose()`` and leaving ``with`` / ``async with`` close it.

An owned store is opened on statekeeper's background loop (`statekeeper.loops`), never
on the caller's: making the adapter does not wait for the store (so it neither blocks a
running loop nor fails in a plain script), and the store is not tied to a loop that
closes (``asyncio.run`` per call, a thread's own loop, the SDKs' sync runners). Once it
is open, the adapter's calls run on the caller's loop, as with a caller's store: the
store serves any thread and loop itself (`statekeeper.loops`), with no hand-over for
memory, SQLite and files stores.

Closing waits for the calls already running, then closes an owned store; a closed
adapter refuses calls with `AdapterClosedError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Protocol, Self, TypeVar
from urllib.parse import urlsplit

from statekeeper.errors import InvalidInputError, StatekeeperError
from statekeeper.loops import background_loop, running_loop
from statekeeper.stores import BACKENDS, Store, open_store

__all__ = [
    "AdapterClosedError",
    "AdapterStore",
    "Closing",
    "HasStore",
    "StoreLifecycle",
    "on_store",
]

T = TypeVar("T")
P = ParamSpec("P")
_log = logging.getLogger(__name__)


class AdapterClosedError(StatekeeperError, RuntimeError):
    """The adapter was closed; make a new one. Also a ``RuntimeError``, as the OpenAI
    Agents SDK's sessions raise once closed ("SQLiteSession is closed")."""


def _done() -> concurrent.futures.Future[None]:
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.set_result(None)
    return future


class Closing:
    """What an adapter's ``close()`` returns.

    From synchronous code the close has finished when ``close()`` returns (and raised
    its error, if any). Inside a running event loop ``close()`` does not block: the close
    runs on, and ``await adapter.close()`` (ADK's style) or ``await adapter.aclose()``
    waits for it.
    """

    __slots__ = ("_future",)

    def __init__(self, future: concurrent.futures.Future[None]) -> None:
        self._future = future

    def __await__(self) -> Generator[Any, None, None]:
        return asyncio.wrap_future(self._future).__await__()

    def done(self) -> bool:
        """Whether the close has finished."""
        return self._future.done()


class AdapterStore:
    """The store of one adapter, and where the adapter's calls run (see the module doc)."""

    def __init__(
        self,
        store: Store | None,
        opening: concurrent.futures.Future[Store] | None,
        what: str,
    ) -> None:
        self._store = store
        self._opening = opening
        self._what = what
        self._lock = threading.Lock()
        self._closing: concurrent.futures.Future[None] | None = None
        self._active = 0  # owned: calls under way, on any loop (under _lock)
        self._idle: concurrent.futures.Future[None] | None = None  # set when _active is 0
        self._abandon = asyncio.Event()  # owned: closed before the store opened

    @classmethod
    def given(cls, store: Store, what: str) -> AdapterStore:
        """A store the caller opened (and keeps: closing the adapter leaves it open)."""
        if not isinstance(store, Store):
            raise InvalidInputError(
                f"{what} takes a statekeeper store (open one with open_store, or use "
                f"{what}.from_url), got {type(store).__name__}"
            )
        return cls(store, None, what)

    @classmethod
    def open(cls, url: str, options: Mapping[str, Any], what: str) -> AdapterStore:
        """Start opening the store at ``url`` on the background loop (not waiting)."""
        if not isinstance(url, str):
            raise InvalidInputError(f"{what}.from_url takes a URL string, got {type(url).__name__}")
        scheme = urlsplit(url).scheme
        if scheme not in BACKENDS:  # fail here, not at the first call
            raise InvalidInputError(
                f"unknown store URL scheme {scheme!r} in {url!r}; use one of: "
                f"{', '.join(s + '://' for s in sorted(BACKENDS))}"
            )
        made = cls(None, None, what)
        made._opening = asyncio.run_coroutine_threadsafe(
            made._open(url, dict(options)), background_loop()
        )
        return made

    async def _open(self, url: str, options: dict[str, Any]) -> Store:
        """Open the store; or, if the adapter is closed first, stop (a server that never
        answers must not keep ``close`` waiting) and close what opened anyway."""

        async def opening() -> Store:
            return await open_store(url, **options)

        opened = asyncio.ensure_future(opening())
        abandoned = asyncio.ensure_future(self._abandon.wait())
        try:
            await asyncio.wait([opened, abandoned], return_when=asyncio.FIRST_COMPLETED)
        finally:
            abandoned.cancel()
            if not opened.done():
                opened.cancel()
                await asyncio.wait([opened])
        if self._abandon.is_set():
            if not opened.cancelled() and opened.exception() is None:
                await opened.result().close()
            raise AdapterClosedError(f"this {self._what} was closed before its store opened")
        return opened.result()

    @property
    def owned(self) -> bool:
        """Whether the adapter opened the store (and closes it)."""
        return self._opening is not None

    @property
    def closed(self) -> bool:
        """Whether the adapter was closed."""
        return self._closing is not None

    def store(self) -> Store:
        """The store; an owned one is waited for if it is still opening (from a running
        loop too: the open runs on the background loop, which never waits for it)."""
        if self._store is None:
            assert self._opening is not None
            if not self._opening.done() and running_loop() is background_loop():
                raise StatekeeperError(
                    f"the {self._what}'s store is still opening; await one of its calls first"
                )
            self._store = self._opening.result()
        return self._store

    def check_open(self) -> None:
        """Raise `AdapterClosedError` once the adapter was closed."""
        if self._closing is not None:
            raise AdapterClosedError(f"this {self._what} was closed; make a new one")

    # -- calls -----------------------------------------------------------------------

    async def call(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work()`` on the running loop (an owned store once it has opened); a
        call of an owned store counts as under way until it ends (`close` waits)."""
        if self._opening is None:
            self.check_open()
            return await work()
        with self._lock:
            self.check_open()  # under the lock: no call starts once close has begun
            self._active += 1
        try:
            await self.opened()
            return await work()
        finally:
            with self._lock:
                self._active -= 1
                idle = self._idle if not self._active else None
            if idle is not None and not idle.done():
                idle.set_result(None)

    def call_blocking(self, work: Callable[[], Awaitable[T]]) -> T:
        """`call` from synchronous code, for an owned store (blocks until it is done)."""
        self.check_open()
        loop = background_loop()
        if running_loop() is loop:
            raise StatekeeperError(
                f"a blocking {self._what} call was made on statekeeper's background loop, "
                "which it would block; await the async API instead"
            )
        return asyncio.run_coroutine_threadsafe(self.call(work), loop).result()

    async def opened(self) -> Store:
        """The store, once opened (awaits an owned store's open from any loop)."""
        if self._store is None:
            assert self._opening is not None
            self._store = await asyncio.wrap_future(self._opening)
        return self._store

    # -- closing ---------------------------------------------------------------------

    def close(self) -> Closing:
        """Close the adapter (an owned store too, after the calls already running);
        idempotent. See `Closing` for when it has finished."""
        with self._lock:
            if self._closing is None:
                if self._opening is None:
                    self._closing = _done()
                else:
                    self._closing = asyncio.run_coroutine_threadsafe(
                        self._close_owned(), background_loop()
                    )
            closing = self._closing
        if running_loop() is None:
            closing.result()
        else:  # it may never be awaited: a failure is logged at least
            closing.add_done_callback(self._report)
        return Closing(closing)

    async def aclose(self) -> None:
        """Close, and wait until closed (from any loop)."""
        await self.close()

    async def _close_owned(self) -> None:
        assert self._opening is not None
        opening = self._opening
        if not opening.done():
            self._abandon.set()  # calls waiting for the open fail (AdapterClosedError)
        with self._lock:
            idle = self._idle = concurrent.futures.Future() if self._active else None
        if idle is not None:
            await asyncio.wrap_future(idle)
        if not opening.done():
            waiting = asyncio.wrap_future(opening)
            await asyncio.wait([waiting])
            if not waiting.cancelled():
                waiting.exception()  # seen here, so never reported as unretrieved
        if opening.cancelled() or opening.exception() is not None:
            return  # never opened (or closed as it opened): nothing to close
        await opening.result().close()

    def _report(self, closing: concurrent.futures.Future[None]) -> None:
        if not closing.cancelled() and closing.exception() is not None:
            _log.warning("closing the %s's store failed", self._what, exc_info=closing.exception())


class StoreLifecycle:
    """``close`` / ``aclose`` / ``with`` / ``async with`` of an adapter whose store is an
    `AdapterStore` (``_stores``): what every adapter does alike."""

    _stores: AdapterStore

    @property
    def owns_store(self) -> bool:
        """Whether the adapter opened its store (``from_url``), and so closes it."""
        return self._stores.owned

    def close(self) -> Closing:
        """Close the adapter (idempotent); later calls raise `AdapterClosedError`. A store
        it opened (``from_url``) is closed once the calls already running end; a store
        passed in is left open.

        From synchronous code it has finished when it returns. Inside a running event
        loop it does not block: ``await adapter.close()`` or `aclose` waits for it."""
        return self._stores.close()

    async def aclose(self) -> None:
        """Close the adapter and wait until its store (if its own) is closed."""
        await self._stores.aclose()

    def __enter__(self) -> Self:
        if self._stores.owned and running_loop() is None:
            self._stores.store()  # a store that cannot open fails here
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        self._stores.check_open()
        await self._stores.opened()  # a store that cannot open fails here
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class HasStore(Protocol):
    """An adapter whose calls go through an `AdapterStore`."""

    @property
    def _stores(self) -> AdapterStore: ...


S = TypeVar("S", bound=HasStore)


def on_store(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """Decorate an adapter's async method to run through its `AdapterStore` (`call`)."""

    @functools.wraps(method)
    async def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._stores.call(lambda: method(self, *args, **kwargs))

    return call
