"""A synchronous facade for scripts and REPLs: the async API, run on a private loop.

    from statekeeper.sync import blocking
    store = blocking.open_store("sqlite:///state.db")
    sessions = blocking.wrap(SessionManager(store.unwrap(), tenant="alice"))
    s = sessions.create(title="hello")
    s.append(Message.user("hi"))

Each coroutine method of a wrapped object runs on one background event loop thread;
objects it returns that have coroutine methods come back wrapped too. Calling it from
inside a running event loop is refused (it would deadlock): use the async API there.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from statekeeper.errors import StatekeeperError

__all__ = ["Blocking", "BlockingRunner", "blocking"]

T = TypeVar("T")


class BlockingRunner:
    """One event loop on a daemon thread, shared by every wrapped object."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="statekeeper-sync", daemon=True
                ).start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to completion from synchronous code."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise StatekeeperError(
                "statekeeper.sync was called from inside a running event loop, which would "
                "block it; await the async API instead"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._ensure()).result()

    def wrap(self, obj: Any) -> Any:
        """``obj`` with its coroutine methods made blocking."""
        return Blocking(obj, self)

    def open_store(self, url: str = "sqlite:///.statekeeper/state.db", **options: Any) -> Any:
        """`statekeeper.open_store`, blocking; returns a wrapped store."""
        from statekeeper.stores import Store, open_store

        async def opened() -> Store:
            return await open_store(url, **options)

        return self.wrap(self.run(opened()))


def _has_coroutines(obj: Any) -> bool:
    return any(
        inspect.iscoroutinefunction(getattr(type(obj), name, None))
        for name in dir(type(obj))
        if not name.startswith("_")
    )


class Blocking:
    """A proxy that runs its target's coroutine methods to completion."""

    def __init__(self, target: Any, runner: BlockingRunner) -> None:
        self._target = target
        self._runner = runner

    def unwrap(self) -> Any:
        """The wrapped async object."""
        return self._target

    def __repr__(self) -> str:
        return f"Blocking({self._target!r})"

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not inspect.iscoroutinefunction(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            result = self._runner.run(value(*args, **kwargs))
            return self._runner.wrap(result) if _has_coroutines(result) else result

        return call


blocking = BlockingRunner()
"""The default runner."""
