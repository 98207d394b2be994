"""Group commit for SQLite with durability ``power``: concurrent writers share one fsync.

A commit that fsyncs takes a few hundred microseconds. Every write of a ``power`` store is
queued here, and the writer's loop is asked to flush the queue once the tasks already
ready to run have had their turn (``call_soon``): writes that tasks make at about the
same time are queued by then, and one transaction commits all of them, each in a
savepoint of its own (one write's error rolls back that write only), with one fsync.
The flush runs right there on the loop, as a lone write always did (the hop to a thread
costs more than a whole non-fsync commit); a lone writer pays one turn of its loop.

An inline commit never suspends, so without the turn, tasks writing at once on one loop
would each run all their writes before the next task wrote one, and never share an
fsync. Writes of other threads' loops join the same queue; while a transaction commits
(inline on one loop, or on the worker thread when the connection is busy elsewhere), the
writes that arrive meanwhile go to the worker as the next batch, and each writer is
woken on its own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from statekeeper.stores.worker import Worker

__all__ = ["GroupCommit", "Queued"]

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Queued:
    """One write waiting for (or done by) a group transaction."""

    fn: Callable[[Any], Any]
    done: asyncio.Future[None]
    result: Any = None
    error: BaseException | None = None


class GroupCommit:
    """Queues writes and commits them in batches, one batch at a time.

    ``commit_inline(batch)`` commits a batch on the calling thread if it can do so
    without waiting (False: nothing was done); ``commit(batch)`` commits it on the
    worker, waiting for the database as long as it takes. Both fill each write's result
    or error. Shared by every thread and event loop using the store.
    """

    def __init__(
        self,
        worker: Worker,
        commit: Callable[[list[Queued]], None],
        commit_inline: Callable[[list[Queued]], bool],
        *,
        enabled: bool,
    ) -> None:
        self._worker = worker
        self._commit = commit
        self._commit_inline = commit_inline
        self.enabled = enabled
        self._mutex = threading.Lock()
        self._queue: list[Queued] = []
        self._running = False
        self.batches = 0  # transactions committed (for tests and tuning)
        self.grouped = 0  # writes committed in a transaction with others

    async def submit(self, fn: Callable[[Any], T]) -> T:
        """Queue a write for the next transaction and wait for its outcome."""
        loop = asyncio.get_running_loop()
        item = Queued(fn, loop.create_future())
        with self._mutex:
            self._queue.append(item)
            idle = not self._running
        if idle:
            # Each writer that finds no transaction running asks its own loop: a flush
            # that finds the queue already taken does nothing, and one lost with a loop
            # that closed leaves the queue to the next writer's.
            loop.call_soon(self._flush)
        try:
            await asyncio.shield(item.done)
        except asyncio.CancelledError:
            with self._mutex:
                queued = item in self._queue
                if queued:  # not started: it never will be
                    self._queue.remove(item)
            if queued:
                raise
            await asyncio.wait([item.done])  # started: the caller learns once it has ended
            raise
        if item.error is not None:
            raise item.error
        result: T = item.result
        return result

    def _take(self) -> list[Queued]:
        """The next batch, if none is running (the caller holds the mutex)."""
        if self._running or not self._queue:
            return []
        batch, self._queue = self._queue, []
        self._running = True
        return batch

    def _flush(self) -> None:
        """Commit what is queued, here on the loop if the connection is free."""
        with self._mutex:
            batch = self._take()
        if not batch:
            return
        if self._commit_inline(batch):
            self._finish(batch)
        else:
            self._start(batch)

    def _start(self, batch: list[Queued]) -> None:
        future = self._worker.submit(lambda: self._commit(batch))
        # Runs on the worker thread once the batch is done (or here, if it already is).
        future.add_done_callback(lambda _: self._finish(batch))

    def _finish(self, batch: list[Queued]) -> None:
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # the worker thread
            here = None
        for item in batch:
            loop = item.done.get_loop()
            if loop is here:
                _wake(item.done)
            else:
                with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                    loop.call_soon_threadsafe(_wake, item.done)
        with self._mutex:
            self._running = False
            self.batches += 1
            if len(batch) > 1:
                self.grouped += len(batch)
            following = self._take()
        if following:  # written meanwhile by other threads: the worker takes them
            self._start(following)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
