"""Command lanes: named in-process queues that serialise async work.

A lane is a FIFO queue with a concurrency (1 by default): at most that many of its tasks
run at once, started in the order they were enqueued. Lanes are independent. Typical names
are ``main``, ``cron``, ``subagent``, ``nested`` and ``session:<id>`` (one lane per
conversation, so two messages never race the same session).

Lanes are created on first use and forgotten once idle unless configured, so one-off
``session:<id>`` lanes cost no memory afterwards. Workers start when work arrives and stop
when the queue is empty: nothing polls or sleeps. A task runs in its worker's own empty
`contextvars` context (pass what it needs as arguments), and must not wait for a later
task of its own lane, which could never start: use another lane (``"nested"``) for that.

The errors, callback and stats types are in `statekeeper.runtime.lane_types` (re-exported
here); this module holds the behaviour.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from statekeeper.errors import InvalidInputError, StatekeeperError
from statekeeper.runtime.lane_types import (
    DEFAULT_WARN_AFTER,
    LANES_CLOSED_REASON,
    MAX_LANE_NAME_LENGTH,
    LaneClearedError,
    LanesClosedError,
    LaneStats,
    WaitCallback,
    WaitInfo,
    closed_by_lanes,
    validate_lane,
)

__all__ = [
    "DEFAULT_WARN_AFTER",
    "LANES_CLOSED_REASON",
    "MAX_LANE_NAME_LENGTH",
    "CommandLanes",
    "LaneClearedError",
    "LaneStats",
    "LanesClosedError",
    "WaitCallback",
    "WaitInfo",
    "closed_by_lanes",
    "validate_lane",
]

T = TypeVar("T")

_logger = logging.getLogger(__name__)
_QUEUED, _RUNNING, _DONE = 0, 1, 2  # states of a lane task


class _Lane:
    __slots__ = (
        *("name", "concurrency", "warn_after", "pending", "workers"),
        *("queued", "running", "completed", "failed", "cancelled", "waited", "max_wait"),
    )

    def __init__(self, name: str, concurrency: int, warn_after: float | None) -> None:
        self.name = name
        self.concurrency = concurrency
        self.warn_after = warn_after
        self.pending: deque[_LaneTask[Any]] = deque()  # may hold settled tasks: skipped
        self.workers: dict[asyncio.Task[None], _LaneTask[Any] | None] = {}  # -> its task
        self.queued = self.running = self.completed = self.failed = self.cancelled = 0
        self.waited = 0
        self.max_wait = 0.0

    def stats(self) -> LaneStats:
        return LaneStats(
            *(self.queued, self.running, self.completed, self.failed, self.cancelled),
            *(self.waited, self.max_wait),
        )

    def absorb(self, other: _Lane) -> None:
        """Add the counters of ``other`` to these."""
        self.queued += other.queued
        self.running += other.running
        self.completed += other.completed
        self.failed += other.failed
        self.cancelled += other.cancelled
        self.waited += other.waited
        self.max_wait = max(self.max_wait, other.max_wait)

    def drop_queued(self, error: Callable[[], StatekeeperError] | None) -> int:
        """Fail every queued task with a new ``error()`` (None: cancel them)."""
        count = 0
        for task in self.pending:
            if task.state == _QUEUED:
                task.state = _DONE
                if error is None:
                    task.cancel()
                else:
                    task.set_exception(error())
                count += 1
        self.pending.clear()
        self.queued -= count
        self.cancelled += count
        return count


class _LaneTask(asyncio.Future[T]):
    """An enqueued call and the future its caller awaits; cancelling it withdraws the call
    if queued, or cancels it if running."""

    __slots__ = (
        *("lane", "fn", "enqueued_at", "ahead", "running_then", "warn_after", "on_wait"),
        *("state", "worker", "cancel_requested"),
    )
    lane: _Lane
    fn: Callable[[], Awaitable[T]]
    enqueued_at: float
    ahead: int
    running_then: int
    warn_after: float | None
    on_wait: WaitCallback | None
    state: int
    worker: asyncio.Task[None] | None
    cancel_requested: bool

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        if self.state == _QUEUED:
            self.state = _DONE  # its worker skips it
            self.lane.queued -= 1
            self.lane.cancelled += 1
        elif self.state == _RUNNING:  # the call gets the message (a closing lane's, say)
            self.stop(msg if isinstance(msg, str) else None)
        return True

    def stop(self, msg: str | None = None) -> None:
        """Cancel the running call (with ``msg`` as the cancellation's message); its
        worker is suspended inside it right now."""
        worker = self.worker
        # A call cancelling its own future runs on: cancelling its worker from inside
        # would hit whatever the worker awaits next.
        if not self.cancel_requested and worker not in (None, asyncio.current_task()):
            assert worker is not None
            self.cancel_requested = True
            worker.cancel(msg)


def _closed_error() -> LanesClosedError:
    return LanesClosedError("the lanes were closed before this task finished")


def _positive(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{what} must be an integer of at least 1, got {value!r}")
    return value


def _threshold(value: float | None) -> float | None:
    if value is not None and not value >= 0:
        raise InvalidInputError(f"warn_after must be None or >= 0 seconds, got {value!r}")
    return value


class CommandLanes:
    """Named FIFO lanes with a concurrency each, used from one event loop.

    Args:
        concurrency: concurrency per lane name, e.g. ``{"main": 1, "subagent": 4}``;
            these lanes are configured, so kept (with their counters) when idle.
        default_concurrency: the concurrency of every other lane.
        warn_after: seconds a task may wait before it counts as having waited too long
            (None: never); per lane with `set_warn_after`, per task with ``warn_after``.
        on_wait: called with a `WaitInfo` when a task starts after waiting too long
            (per task with ``on_wait``). Its exceptions are logged, never raised.
        clock: monotonic time in seconds (tests pass a fake clock).
    """

    def __init__(
        self,
        concurrency: Mapping[str, int] | None = None,
        *,
        default_concurrency: int = 1,
        warn_after: float | None = DEFAULT_WARN_AFTER,
        on_wait: WaitCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._default_concurrency = _positive(default_concurrency, "default_concurrency")
        self._default_warn_after = _threshold(warn_after)
        self._on_wait = on_wait
        self._clock = clock
        self._concurrency: dict[str, int] = {}
        self._warn_after: dict[str, float | None] = {}
        self._lanes: dict[str, _Lane] = {}
        self._retired = _Lane("", 1, None)  # counters of forgotten lanes
        self._closed = False
        for name, n in (concurrency or {}).items():
            self.set_concurrency(name, n)

    def set_concurrency(self, lane: str, concurrency: int) -> None:
        """Let up to ``concurrency`` tasks of ``lane`` run at once, from now on."""
        self._concurrency[validate_lane(lane)] = _positive(concurrency, "concurrency")
        state = self._lanes.get(lane)
        if state is not None:
            state.concurrency = concurrency
            self._spawn(state)

    def set_warn_after(self, lane: str, seconds: float | None) -> None:
        """Set the wait threshold of ``lane`` (None: never counts as waiting too long)."""
        self._warn_after[validate_lane(lane)] = _threshold(seconds)
        state = self._lanes.get(lane)
        if state is not None:
            state.warn_after = seconds

    def submit(
        self,
        lane: str,
        fn: Callable[[], Awaitable[T]],
        *,
        warn_after: float | None = None,
        on_wait: WaitCallback | None = None,
    ) -> asyncio.Future[T]:
        """Enqueue ``fn()`` on ``lane``; return a future of its result.

        Cancelling the future withdraws the call if it has not started, or cancels it if
        it is running; other tasks are unaffected. Await the future, or its failure is
        logged as never retrieved.

        Raises:
            LanesClosedError: the lanes are closed.
            InvalidInputError: ``lane`` is not a valid lane name, or ``warn_after`` < 0.
        """
        if self._closed:
            raise LanesClosedError()
        state = self._lanes.get(lane) or self._open(lane)
        task: _LaneTask[T] = _LaneTask(loop=asyncio.get_running_loop())
        task.lane, task.fn, task.enqueued_at = state, fn, self._clock()
        task.ahead, task.running_then = state.queued, state.running
        task.warn_after = warn_after if warn_after is None else _threshold(warn_after)
        task.on_wait, task.state, task.worker, task.cancel_requested = on_wait, 0, None, False
        state.pending.append(task)
        state.queued += 1
        if len(state.workers) < state.concurrency:
            self._spawn(state)
        return task

    async def run(
        self,
        lane: str,
        fn: Callable[[], Awaitable[T]],
        *,
        warn_after: float | None = None,
        on_wait: WaitCallback | None = None,
    ) -> T:
        """Run ``fn()`` on ``lane`` once the tasks ahead of it allow; return its result.

        The call's exception is raised here; cancelling the caller withdraws or cancels it.

        Raises:
            LaneClearedError: the lane was cleared before the call started.
            LanesClosedError: the lanes are closed, or were closed with ``cancel=True``.
        """
        return await self.submit(lane, fn, warn_after=warn_after, on_wait=on_wait)

    def clear(self, lane: str) -> int:
        """Fail every queued task of ``lane`` with `LaneClearedError`; running ones go on.

        Returns the number of tasks failed.
        """
        state = self._lanes.get(validate_lane(lane))
        if state is None:
            return 0
        count = state.drop_queued(lambda: LaneClearedError(lane))
        self._forget_if_idle(state)
        return count

    async def close(self, *, cancel: bool = False) -> None:
        """Refuse new work, then wait until every lane is idle. Safe to call again.

        With ``cancel=False`` queued and running tasks finish first. With ``cancel=True``
        queued tasks fail with `LanesClosedError` and running ones are cancelled (their
        callers get `LanesClosedError`). The call sees a `asyncio.CancelledError` whose
        message is `LANES_CLOSED_REASON` (`closed_by_lanes` tells): it may record that
        it stopped because its lane closed before re-raising it, and this waits for that.
        """
        self._closed = True
        if cancel:
            for state in self._lanes.values():
                state.drop_queued(_closed_error)
                for task in state.workers.values():
                    if task is not None:
                        if not task.done():
                            task.set_exception(_closed_error())
                        task.stop(LANES_CLOSED_REASON)
        while workers := [w for state in self._lanes.values() for w in state.workers]:
            await asyncio.wait(workers)

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    async def __aenter__(self) -> CommandLanes:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close(cancel=exc is not None)

    def stats(self, lane: str | None = None) -> LaneStats:
        """Counters of ``lane``, or of all lanes together when ``lane`` is None.

        A forgotten (idle, unconfigured) lane reads as zeros; its counts stay in the totals.
        """
        if lane is not None:
            state = self._lanes.get(validate_lane(lane))
            return LaneStats() if state is None else state.stats()
        total = _Lane("", 1, None)
        for state in (self._retired, *self._lanes.values()):
            total.absorb(state)
        return total.stats()

    def names(self) -> list[str]:
        """Lanes held in memory: configured lanes and lanes with queued or running work."""
        return list(self._lanes)

    # -- internals --------------------------------------------------------------------------

    def _open(self, lane: str) -> _Lane:
        state = _Lane(
            validate_lane(lane),
            self._concurrency.get(lane, self._default_concurrency),
            self._warn_after.get(lane, self._default_warn_after),
        )
        self._lanes[lane] = state
        return state

    def _spawn(self, state: _Lane) -> None:
        workers = state.workers
        # One worker for each queued task that no idle worker will pick up.
        while len(workers) < state.concurrency and len(workers) - state.running < state.queued:
            worker = asyncio.get_running_loop().create_task(
                self._work(state),
                name=f"statekeeper-lane:{state.name}",
                context=contextvars.Context(),
            )
            workers[worker] = None
            worker.add_done_callback(partial(self._worker_done, state))

    def _worker_done(self, state: _Lane, worker: asyncio.Task[None]) -> None:
        """Clean up after a worker cancelled before its first step (it never ran its own)."""
        if worker in state.workers:
            del state.workers[worker]
            if not state.workers:
                state.drop_queued(None)  # cancelled from outside, as at loop shutdown
            self._forget_if_idle(state)

    def _forget_if_idle(self, state: _Lane) -> None:
        name = state.name
        if (
            not state.workers
            and not state.queued
            and name not in self._concurrency
            and name not in self._warn_after
            and self._lanes.get(name) is state
        ):
            del self._lanes[name]
            self._retired.absorb(state)

    def _started(self, state: _Lane, task: _LaneTask[Any]) -> None:
        waited = self._clock() - task.enqueued_at
        if waited > state.max_wait:
            state.max_wait = waited
        threshold = state.warn_after if task.warn_after is None else task.warn_after
        if threshold is None or waited <= threshold:
            return
        state.waited += 1
        callback = task.on_wait or self._on_wait
        if callback is not None:
            try:
                callback(WaitInfo(state.name, waited, task.ahead, task.running_then))
            except Exception:
                _logger.exception("the wait callback of lane %r failed", state.name)

    async def _work(self, state: _Lane) -> None:
        me = asyncio.current_task()
        assert me is not None
        pending, workers = state.pending, state.workers
        try:
            while pending and len(workers) <= state.concurrency:
                task = pending.popleft()
                if task.state != _QUEUED:  # withdrawn while queued
                    continue
                task.state, task.worker, workers[me] = _RUNNING, me, task
                state.queued -= 1
                state.running += 1
                self._started(state, task)
                try:
                    result = await task.fn()
                except asyncio.CancelledError:
                    state.cancelled += 1
                    if not task.cancel_requested:
                        # Cancelled from outside (event loop shutdown): tear the lane down.
                        asyncio.Future.cancel(task)
                        state.drop_queued(None)
                        raise
                except BaseException as exc:
                    state.failed += 1
                    if not task.done():
                        task.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    state.completed += 1
                    if not task.done():
                        task.set_result(result)
                finally:
                    state.running -= 1
                    task.state, task.worker, workers[me] = _DONE, None, None
                    if task.cancel_requested:
                        me.uncancel()  # that cancellation was for the task, not the worker
        finally:
            del workers[me]
            self._forget_if_idle(state)
