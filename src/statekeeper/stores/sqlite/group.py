"""Group commit for SQLite with durability ``power``: concurrent writers share one fsync.

A commit that fsyncs takes a few hundred microseconds. Run inline on the event loop (the
cheapest way for a lone writer), it stalls every other coroutine for that long, so eight
tasks writing to eight sessions are no faster than one. Once writes come from more than
one task at a time, they go to the worker thread instead: the loop stays free, the
writes that arrive while one transaction is committing are queued, and the next
transaction commits all of them at once, each in a savepoint of its own (one write's
error rolls back that write only). Throughput then grows with the number of writers.

"More than one task at a time" means: writes from two or more tasks (of any threads and
loops) within the last few milliseconds. A lone task never pays the hop to the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from statekeeper.stores.worker import Worker

__all__ = ["GroupCommit", "Queued"]

T = TypeVar("T")
_WINDOW = 0.005  # seconds: writers seen within it count as concurrent


@dataclass(eq=False, slots=True)
class Queued:
    """One write waiting for (or done by) a group transaction."""

    fn: Callable[[Any], Any]
    done: asyncio.Future[None]
    result: Any = None
    error: BaseException | None = None


class GroupCommit:
    """Decides when writes are grouped, queues them, and runs one batch at a time.

    Shared by every thread and event loop using the store: a batch takes the writes of
    all of them (one fsync), and each writer is woken on its own loop.
    """

    def __init__(
        self, worker: Worker, commit: Callable[[list[Queued]], None], *, enabled: bool
    ) -> None:
        self._worker = worker
        self._commit = commit
        self.enabled = enabled
        self._mutex = threading.Lock()
        self._writers: dict[tuple[int, int], float] = {}  # (thread, task) -> last write time
        self._queue: list[Queued] = []
        self._running = False
        self.batches = 0  # transactions committed as groups (for tests and tuning)

    def wanted(self) -> bool:
        """Whether this write should be grouped: others are writing, or a group is open."""
        if not self.enabled:
            return False
        if self._running or self._queue:
            return True
        now = time.monotonic()
        with self._mutex:
            self._writers[_writer()] = now
            if len(self._writers) > 1:
                self._writers = {k: t for k, t in self._writers.items() if now - t < _WINDOW}
            return len(self._writers) > 1

    def wrote(self) -> None:
        """Note that this writer's write (made alone, inline) has just ended.

        The window counts from a writer's last write's end, not its start: a commit
        whose fsync takes longer than the window (a slow disk, exactly where sharing
        fsyncs pays most) must still count its writer as writing when the next one asks.
        """
        if self.enabled:
            now = time.monotonic()
            with self._mutex:
                self._writers[_writer()] = now

    async def submit(self, fn: Callable[[Any], T]) -> T:
        """Queue a write for the next group transaction and wait for its outcome."""
        item = Queued(fn, asyncio.get_running_loop().create_future())
        with self._mutex:
            self._queue.append(item)
            batch = self._take()
        if batch:
            self._start(batch)
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

    def _start(self, batch: list[Queued]) -> None:
        future = self._worker.submit(lambda: self._commit(batch))
        # Runs on the worker thread once the batch is done (or here, if it already is).
        future.add_done_callback(lambda _: self._finish(batch))

    def _finish(self, batch: list[Queued]) -> None:
        for item in batch:
            loop = item.done.get_loop()
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                loop.call_soon_threadsafe(_wake, item.done)
        with self._mutex:
            self._running = False
            self.batches += 1
            following = self._take()
        if following:
            self._start(following)


def _writer() -> tuple[int, int]:
    """Who is writing: the thread, and the task within it."""
    return threading.get_ident(), id(asyncio.current_task())


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
