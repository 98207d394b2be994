"""Event loops and threads: how one statekeeper object serves every thread and loop.

asyncio objects belong to the loop that made them: a future completed from another
thread never wakes its loop, and a database connection opened on one loop cannot be
used on another. statekeeper's rule (see ``docs/stores.md``, "Threads and event loops"):

- what a store keeps per loop (its append engine: locks, group commit) is made per loop
  on first use (`per_loop`); what the loops share is guarded by thread locks held only
  in code that never waits. Memory, SQLite and files stores run every call on the
  caller's own loop this way, with no hand-over;
- a store whose connections belong to a loop (PostgreSQL, Redis: `HomeLoop`) runs on its
  **home loop**, the loop that opened it; a call from any other loop or thread is
  handed to statekeeper's **background loop** (one daemon thread per process, also the
  loop of `statekeeper.sync`), where the store keeps a second pool made with the same
  settings. Once the home loop has closed, the background loop is home.

Per-loop parts share the backend's storage, which orders them as it orders two processes
(compare-and-set on the head's version). A call handed over runs to its end there
whatever happens to its caller: a caller that is cancelled waits until the call has
ended (done whole, or not at all); a caller whose loop closed is simply not told.

This module holds the background loop (`background_loop`), the hand-over (`hand_off`),
blocking calls from synchronous code (`run_blocking`), per-loop parts (`per_loop`) and
the `HomeLoop` mixin that routes a store's coroutine methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar, overload

from statekeeper.errors import StatekeeperError, StoreUnavailableError

__all__ = [
    "HomeLoop",
    "background_loop",
    "hand_off",
    "on_their_loops",
    "per_loop",
    "run_blocking",
    "running_loop",
]

T = TypeVar("T")

_start_lock = threading.Lock()
_make_lock = threading.RLock()  # a factory may read another per-loop value
_background: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """statekeeper's background event loop (a daemon thread), started on first use.

    One per process: a child made by ``fork`` starts its own on first use.
    """
    global _background
    current = _background
    if current is not None and current[0] == os.getpid():
        return current[1]
    with _start_lock:
        current = _background
        if current is not None and current[0] == os.getpid():
            return current[1]
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="statekeeper-loop", daemon=True)
        thread.start()
        _background = (os.getpid(), loop, thread)
        return loop


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop of this thread, or None outside one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the background loop and wait for its result, from synchronous code.

    Refused with `StatekeeperError` inside a running event loop (waiting there would
    block that loop): await the coroutine instead.
    """
    if running_loop() is not None:
        coro.close()
        raise StatekeeperError(
            "a blocking statekeeper call was made from inside a running event loop, which "
            "it would block; await the async API instead"
        )
    future = asyncio.run_coroutine_threadsafe(coro, background_loop())
    try:
        return future.result()
    except BaseException:
        if not future.done():  # KeyboardInterrupt while waiting: stop the call too
            future.cancel()
        raise


async def hand_off(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """Run ``coro`` on ``loop`` (another thread's) and await its outcome here.

    The call runs to its end on ``loop`` whatever happens to this caller. Cancelling the
    caller cancels the call there, and the caller waits until it has ended, so a
    cancelled caller knows a write was done whole or not at all (as a call on its own
    loop would). If this caller's loop closes meanwhile, the outcome is dropped.
    """
    caller = asyncio.get_running_loop()
    call = _Call(caller.create_future())
    try:
        loop.call_soon_threadsafe(call.start, coro, loop)
    except RuntimeError:  # the target loop has closed
        coro.close()
        raise _closed_loop() from None
    watch = loop is not background_loop()  # ours never closes; another loop may
    try:
        while True:
            done, _ = await asyncio.wait([call.landed], timeout=1.0 if watch else None)
            if done:
                break
            if loop.is_closed():  # closed before it ran the call: nobody ever will
                raise _closed_loop()
    except asyncio.CancelledError:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(call.cancel)
        while not call.landed.done() and not loop.is_closed():
            await asyncio.wait([call.landed], timeout=1.0)
        raise
    if call.task is None:  # cancelled before it started
        raise asyncio.CancelledError()
    result: T = call.task.result()
    return result


def _closed_loop() -> StoreUnavailableError:
    return StoreUnavailableError(
        "the event loop this store's connections belong to has closed; open the store "
        "from a URL so that it manages its own connections, or use it on that loop"
    )


class _Call:
    """One handed-over call: its task on the target loop, and the caller's wake-up.

    ``start`` and ``cancel`` run on the target loop, in the order they were sent."""

    __slots__ = ("cancelled", "landed", "task")

    def __init__(self, landed: asyncio.Future[None]) -> None:
        self.landed = landed
        self.task: asyncio.Task[Any] | None = None
        self.cancelled = False

    def start(self, coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> None:
        if self.cancelled:
            coro.close()
            self._wake()
            return
        self.task = loop.create_task(coro)
        self.task.add_done_callback(self._finished)

    def cancel(self) -> None:
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()

    def _finished(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: read by the caller, or by nobody if it is gone
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop closed: nobody waits
            self.landed.get_loop().call_soon_threadsafe(_settle, self.landed)


async def on_their_loops(
    parts: list[tuple[asyncio.AbstractEventLoop | None, T]],
    close: Callable[[T], Coroutine[Any, Any, None]],
    *,
    wait: float = 5.0,
) -> None:
    """Run ``close(part)`` for each (loop, part) on that part's loop: here when it is the
    running loop (or None), else handed over. A loop that has closed took its parts
    with it; one that does not answer within ``wait`` seconds (blocked, or stopped for
    good) keeps them until the process ends."""
    here = asyncio.get_running_loop()
    for loop, part in parts:
        if loop is None or loop is here:
            await close(part)
        elif not loop.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(hand_off(close(part), loop), wait)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# -- stores: per-loop parts and routed calls ---------------------------------------------

# Not routed: closing (it reaches every loop itself) and the engine's primitives (only the
# engine calls them, already on the right loop).
_NOT_ROUTED = frozenset({"close", "aclose", "load_head", "commit_head"})


class HomeLoop:
    """Mixin for stores: every public coroutine method runs on the store's home loop or
    on the background loop (see the module docstring); per-loop parts via `per_loop`.

    A store whose connections were given by the caller (a pool, a connection, a client)
    sets ``movable = False``: calls from other loops are then handed to its home loop,
    which must keep running (`StoreUnavailableError` once it has closed).
    """

    movable: bool = True
    _home: asyncio.AbstractEventLoop | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            if name.startswith("_") or name in _NOT_ROUTED:
                continue
            value = inspect.getattr_static(cls, name)
            if inspect.iscoroutinefunction(value) and not getattr(value, "_routed", False):
                setattr(cls, name, _routed(value))

    def _claim_home(self) -> asyncio.AbstractEventLoop:
        """The loop a call from the running loop must run on (claiming a home if none)."""
        loop = asyncio.get_running_loop()
        home = self._home
        if home is None:
            self._home = home = loop
        elif home.is_closed() and self.movable:
            # Not the caller's loop: it may be as short-lived as the last one (a thread's
            # asyncio.run), and every new home means new connections.
            self._home = home = background_loop()
        if loop is home:
            return loop
        if not self.movable:
            return home
        return background_loop()

    async def _elsewhere(
        self, target: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]
    ) -> T:
        return await hand_off(coro, target)


def _routed(method: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(self: HomeLoop, *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        if loop is self._home:
            return await method(self, *args, **kwargs)
        target = self._claim_home()
        if target is loop:
            return await method(self, *args, **kwargs)
        return await self._elsewhere(target, method(self, *args, **kwargs))

    call._routed = True  # type: ignore[attr-defined]
    return call


class per_loop(Generic[T]):
    """A store attribute with one value per event loop it runs on, made on first use by
    the decorated factory (``def _engine(self) -> AppendEngine``).

    A loop's value goes with the loop (held weakly: a loop left open by a thread that
    ended is collected, and its value with it), and values of loops that have closed
    are dropped when a new one is made. Outside a running loop, the home loop's value is
    given (for code that runs on a worker thread on the home loop's behalf).
    """

    def __init__(self, factory: Callable[[Any], T]) -> None:
        self.factory = factory
        self.key = f"_per_loop_{factory.__name__}"
        self.__doc__ = factory.__doc__

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> per_loop[T]: ...
    @overload
    def __get__(self, obj: object, owner: type[Any]) -> T: ...
    def __get__(self, obj: object | None, owner: type[Any]) -> T | per_loop[T]:
        if obj is None:
            return self
        values: _Values[T] | None = obj.__dict__.get(self.key)
        if values is None:
            values = obj.__dict__.setdefault(self.key, _Values())
        loop = running_loop()
        if loop is None:
            loop = getattr(obj, "_home", None)
        value = values.get(loop)
        if value is None:
            with _make_lock:  # rare (a loop's first use): one thread changes the values
                values.drop_closed()
                value = values.get(loop)
                if value is None:
                    value = self.factory(obj)
                    values.put(loop, value)
        return value

    def items(self, obj: object) -> list[tuple[asyncio.AbstractEventLoop | None, T]]:
        """(loop, value) of every value made so far for ``obj`` (to close them)."""
        made: _Values[T] | None = obj.__dict__.get(self.key)
        return [] if made is None else made.items()

    def drop(self, obj: object) -> None:
        """Forget every value of ``obj`` (after closing them)."""
        obj.__dict__.pop(self.key, None)


class _Values(Generic[T]):
    """The values of a `per_loop` attribute of one object: by loop (weakly), and one for
    no loop."""

    __slots__ = ("__weakref__", "by_loop", "last", "no_loop")

    def __init__(self) -> None:
        self.by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )
        self.no_loop: T | None = None
        # The loop asked for last and its value: most calls come from one loop, and a
        # weak reference's call costs less than a weak dictionary's lookup. Cleared
        # when that loop goes, so that its value goes with it.
        self.last: tuple[weakref.ref[asyncio.AbstractEventLoop], T] | None = None

    def get(self, loop: asyncio.AbstractEventLoop | None) -> T | None:
        if loop is None:
            return self.no_loop
        last = self.last
        if last is not None and last[0]() is loop:
            return last[1]
        value = self.by_loop.get(loop)
        if value is not None:
            self.last = (weakref.ref(loop, self._forget_last), value)
        return value

    def _forget_last(self, gone: weakref.ref[asyncio.AbstractEventLoop]) -> None:
        last = self.last
        if last is not None and last[0] is gone:
            self.last = None

    def put(self, loop: asyncio.AbstractEventLoop | None, value: T) -> None:
        if loop is None:
            self.no_loop = value
        else:
            self.by_loop[loop] = value

    def drop_closed(self) -> None:
        for loop in [k for k in list(self.by_loop.keys()) if k.is_closed()]:
            self.by_loop.pop(loop, None)
        if self.last is not None:
            gone = self.last[0]()
            if gone is None or gone.is_closed():
                self.last = None

    def items(self) -> list[tuple[asyncio.AbstractEventLoop | None, T]]:
        found: list[tuple[asyncio.AbstractEventLoop | None, T]] = list(self.by_loop.items())
        if self.no_loop is not None:
            found.append((None, self.no_loop))
        return found
