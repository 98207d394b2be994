"""A dedicated worker thread for blocking store I/O (SQLite, files).

Blocking calls run on one thread owned by the store, so the event loop never waits on
a disk or a lock. Results return through the loop's thread-safe callback.

Cancelling a caller does not cancel a write that already started: the caller waits for
it to finish (a few milliseconds) and then sees the cancellation, so a cancelled caller
can rely on "the write is either fully done or was never started" and retry
idempotently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from statekeeper.errors import StoreUnavailableError

__all__ = ["Worker"]

T = TypeVar("T")


class Worker:
    """Runs callables one at a time on a private thread."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._closed = False

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker thread and return its result (or raise its error)."""
        if self._closed:
            raise StoreUnavailableError("the store is closed; open a new one")
        loop = asyncio.get_running_loop()

        future = loop.run_in_executor(self._executor, fn)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # Let a write that already started finish before the caller sees the cancel.
            if not future.done():
                await asyncio.wait([future])
            if not future.cancelled():
                future.exception()  # retrieved, so asyncio does not log it as lost
            raise

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Start ``fn`` on the worker thread now, without waiting (fire and track)."""
        if self._closed:
            raise StoreUnavailableError("the store is closed; open a new one")

        return self._executor.submit(fn)

    def run_blocking(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker thread and wait for it (for use outside an event loop)."""
        if self._closed:
            raise StoreUnavailableError("the store is closed; open a new one")

        return self._executor.submit(fn).result()

    def shutdown(self) -> None:
        """Finish queued work and stop the thread. Idempotent."""
        self._closed = True
        self._executor.shutdown(wait=True)
