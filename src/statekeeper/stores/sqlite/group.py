"""Group commit for SQLite with durability ``power``: concurrent writers share one fsync.

A commit that fsyncs takes a few hundred microseconds. Run inline on the event loop (the
cheapest way for a lone writer), it stalls every other coroutine for that long, so eight
tasks writing to eight sessions are no faster than one. Once writes come from more than
one task at a time, they go to the worker thread instead: the loop stays free, the
writes that arrive while one transaction is committing are queued, and the next
transaction commits all of them at once, each in a savepoint of its own (one write's
error rolls back that write only). Throughput then grows with the number of writers.

"More than one task at a time" means: writes from two or more tasks within the last few
milliseconds. A lone task never pays the hop to the worker.
"""

from __future__ import annotations

import asyncio
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
    """Decides when writes are grouped, queues them, and runs one batch at a time."""

    def __init__(
        self, worker: Worker, commit: Callable[[list[Queued]], None], *, enabled: bool
    ) -> None:
        self._worker = worker
        self._commit = commit
        self.enabled = enabled
        self._writers: dict[int, float] = {}  # id(task) -> last write time
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
        task = asyncio.current_task()
        self._writers[id(task)] = now
        if len(self._writers) > 1:
            self._writers = {k: t for k, t in self._writers.items() if now - t < _WINDOW}
        return len(self._writers) > 1

    async def submit(self, fn: Callable[[Any], T]) -> T:
        """Queue a write for the next group transaction and wait for its outcome."""
        item = Queued(fn, asyncio.get_running_loop().create_future())
        self._queue.append(item)
        if not self._running:
            self._start()
        try:
            await asyncio.shield(item.done)
        except asyncio.CancelledError:
            if item in self._queue:  # not started: it never will be
                self._queue.remove(item)
                raise
            await asyncio.wait([item.done])  # started: the caller learns once it has ended
            raise
        if item.error is not None:
            raise item.error
        result: T = item.result
        return result

    def _start(self) -> None:
        batch, self._queue = self._queue, []
        self._running = True
        loop = asyncio.get_running_loop()
        future = self._worker.submit(lambda: self._commit(batch))

        def finished(_: object) -> None:
            loop.call_soon_threadsafe(self._finish, batch)

        future.add_done_callback(finished)

    def _finish(self, batch: list[Queued]) -> None:
        self._running = False
        self.batches += 1
        for item in batch:
            if not item.done.done():
                item.done.set_result(None)
        if self._queue:
            self._start()
