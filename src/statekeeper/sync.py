"""A synchronous facade for scripts and REPLs: the async API, run on a private loop.

    from statekeeper.sync import blocking
    store = blocking.open_store("sqlite:///state.db")
    sessions = blocking.wrap(SessionManager(store.unwrap(), tenant="alice"))
    s = sessions.create(title="hello")
    s.append(Message.user("hi"))

Each coroutine method of a wrapped object runs on statekeeper's background event loop
(`statekeeper.loops`), from any number of threads at once; objects it returns that have
coroutine methods come back wrapped too. Calling it from inside a running event loop is
refused with `StatekeeperError` (it would block that loop): use the async API there.
"""

from __future__ import annotations

import inspect
from collections.abc import Coroutine
from typing import Any, TypeVar

from statekeeper.loops import run_blocking

__all__ = ["Blocking", "BlockingRunner", "blocking"]

T = TypeVar("T")


class BlockingRunner:
    """Runs coroutines on statekeeper's background loop (`statekeeper.loops`), one daemon
    thread shared by every wrapped object and by stores called from other loops."""

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to completion from synchronous code (any thread).

        Refused with `StatekeeperError` inside a running event loop (it would block it).
        """
        return run_blocking(coro)

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
