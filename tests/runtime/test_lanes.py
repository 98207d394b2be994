"""Command lanes: order, concurrency, isolation, clearing, closing, cancellation, waits, stats."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.errors import InvalidInputError, StatekeeperError
from statekeeper.runtime import (
    CommandLanes,
    LaneClearedError,
    LanesClosedError,
    LaneStats,
    WaitInfo,
)
from statekeeper.runtime.lanes import LANES_CLOSED_REASON, closed_by_lanes


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Blocker:
    """A lane task that signals when it starts and finishes only when released."""

    def __init__(self, result: object = None) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False
        self.result = result

    async def __call__(self) -> object:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return self.result


def value(x: object) -> Callable[[], Awaitable[object]]:
    async def task() -> object:
        return x

    return task


def recorder(log: list[object], x: object) -> Callable[[], Awaitable[object]]:
    async def task() -> object:
        log.append(x)
        return x

    return task


async def test_tasks_of_a_lane_run_in_fifo_order() -> None:
    lanes = CommandLanes()
    log: list[object] = []
    results = await asyncio.gather(*(lanes.run("main", recorder(log, i)) for i in range(50)))
    assert log == list(range(50))
    assert results == list(range(50))


async def test_concurrency_n_runs_at_most_n_at_once() -> None:
    lanes = CommandLanes({"subagent": 3}, clock=FakeClock())
    running = peak = 0
    reached = asyncio.Event()
    gate = asyncio.Event()

    async def task() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 3:
            reached.set()
        await gate.wait()
        running -= 1

    futures = [lanes.submit("subagent", task) for _ in range(10)]
    await reached.wait()
    assert lanes.stats("subagent") == LaneStats(queued=7, running=3)
    gate.set()
    await asyncio.gather(*futures)
    assert peak == 3
    assert lanes.stats("subagent").completed == 10


async def test_default_concurrency_is_one_and_configurable() -> None:
    lanes = CommandLanes(default_concurrency=2)
    running = peak = 0

    async def task() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1

    await asyncio.gather(*(lanes.run("any", task) for _ in range(6)))
    assert peak == 2
    with pytest.raises(InvalidInputError, match="at least 1"):
        CommandLanes(default_concurrency=0)
    with pytest.raises(InvalidInputError, match="at least 1"):
        lanes.set_concurrency("main", 0)


async def test_raising_concurrency_starts_queued_tasks_at_once() -> None:
    lanes = CommandLanes()
    first, second = Blocker(1), Blocker(2)
    futures = [lanes.submit("main", first), lanes.submit("main", second)]
    await first.started.wait()
    assert lanes.stats("main").queued == 1
    lanes.set_concurrency("main", 2)
    await second.started.wait()
    assert lanes.stats("main").running == 2
    first.release.set()
    second.release.set()
    assert await asyncio.gather(*futures) == [1, 2]


async def test_a_blocked_lane_does_not_block_another() -> None:
    lanes = CommandLanes()
    blocker = Blocker("cron done")
    cron = lanes.submit("cron", blocker)
    await blocker.started.wait()
    assert await lanes.run("main", value("main done")) == "main done"
    assert not cron.done()
    blocker.release.set()
    assert await cron == "cron done"


async def test_results_and_exceptions_reach_callers_and_the_lane_goes_on() -> None:
    lanes = CommandLanes()

    async def boom() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        await lanes.run("main", boom)
    assert await lanes.run("main", value(42)) == 42
    failing = lanes.submit("main", boom)
    after = lanes.submit("main", value("next"))
    with pytest.raises(ValueError, match="bad input"):
        await failing
    assert await after == "next"
    stats = lanes.stats()
    assert (stats.completed, stats.failed) == (2, 2)


async def test_clear_fails_queued_tasks_and_spares_the_running_one() -> None:
    lanes = CommandLanes(clock=FakeClock())
    blocker = Blocker("kept")
    running = lanes.submit("session:a", blocker)
    log: list[object] = []
    queued = [lanes.submit("session:a", recorder(log, i)) for i in range(3)]
    await blocker.started.wait()
    assert lanes.clear("session:a") == 3
    for future in queued:
        with pytest.raises(LaneClearedError) as info:
            await future
        assert info.value.lane == "session:a"
        assert isinstance(info.value, StatekeeperError)
    assert lanes.stats("session:a") == LaneStats(running=1, cancelled=3)
    blocker.release.set()
    assert await running == "kept"
    assert log == []
    assert lanes.clear("session:a") == 0
    assert lanes.clear("never-used") == 0
    assert await lanes.run("session:a", value("again")) == "again"


async def test_closed_lanes_reject_new_work() -> None:
    lanes = CommandLanes()
    assert await lanes.run("main", value(1)) == 1
    await lanes.close()
    assert lanes.closed
    with pytest.raises(LanesClosedError, match="closed"):
        lanes.submit("main", value(2))
    with pytest.raises(LanesClosedError):
        await lanes.run("other", value(2))
    await lanes.close()  # again: no error


async def test_close_lets_queued_and_running_tasks_finish() -> None:
    lanes = CommandLanes()
    blocker = Blocker("first")
    futures = [lanes.submit("main", blocker), lanes.submit("main", value("second"))]
    await blocker.started.wait()
    closing = asyncio.create_task(lanes.close())
    await asyncio.sleep(0)
    assert not closing.done()
    with pytest.raises(LanesClosedError):
        lanes.submit("main", value("late"))
    blocker.release.set()
    await closing
    assert [f.result() for f in futures] == ["first", "second"]
    assert lanes.names() == []


async def test_close_with_cancel_fails_queued_and_cancels_running_tasks() -> None:
    lanes = CommandLanes()
    blocker = Blocker()
    running = lanes.submit("main", blocker)
    queued = lanes.submit("main", value("never"))
    await blocker.started.wait()
    await lanes.close(cancel=True)
    assert blocker.cancelled
    for future in (running, queued):
        with pytest.raises(LanesClosedError):
            await future
    assert lanes.stats().cancelled == 2
    assert lanes.names() == []


async def test_a_task_cancelled_by_close_knows_why_and_may_record_it_first() -> None:
    lanes = CommandLanes()
    started, recorded = asyncio.Event(), []

    async def nested() -> None:  # a call of another lane, awaited by the first one
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            recorded.append(("nested", closed_by_lanes(exc), exc.args))
            raise

    async def outer() -> None:
        try:
            await lanes.run("nested", nested)
        except asyncio.CancelledError as exc:
            await asyncio.sleep(0)  # a write, say: close waits for it
            recorded.append(("outer", closed_by_lanes(exc), exc.args))
            raise

    future = lanes.submit("main", outer)
    await started.wait()
    await lanes.close(cancel=True)
    with pytest.raises(LanesClosedError):
        await future
    assert sorted(recorded) == [
        ("nested", True, (LANES_CLOSED_REASON,)),
        ("outer", True, (LANES_CLOSED_REASON,)),
    ]
    assert LANES_CLOSED_REASON == "lane closed"
    assert not closed_by_lanes(asyncio.CancelledError())
    assert not closed_by_lanes(LanesClosedError())


async def test_a_task_its_caller_cancels_is_not_closed_by_lanes() -> None:
    lanes = CommandLanes()
    started, seen = asyncio.Event(), []

    async def call() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            seen.append(closed_by_lanes(exc))
            raise

    future = lanes.submit("main", call)
    await started.wait()
    future.cancel()
    await lanes.close()
    assert seen == [False]


async def test_async_with_closes_the_lanes() -> None:
    async with CommandLanes() as lanes:
        assert await lanes.run("main", value("x")) == "x"
    assert lanes.closed


async def test_cancelling_a_queued_caller_withdraws_its_task() -> None:
    lanes = CommandLanes()
    blocker = Blocker()
    first = lanes.submit("main", blocker)
    log: list[object] = []
    waiting = asyncio.create_task(lanes.run("main", recorder(log, "withdrawn")))
    last = lanes.submit("main", recorder(log, "last"))
    await blocker.started.wait()
    await asyncio.sleep(0)  # let `waiting` enqueue
    assert lanes.stats("main").queued == 2
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert lanes.stats("main").queued == 1
    blocker.release.set()
    await first
    assert await last == "last"
    assert log == ["last"]
    assert lanes.stats().cancelled == 1


async def test_cancelling_a_running_task_cancels_it_and_the_lane_goes_on() -> None:
    lanes = CommandLanes()
    blocker = Blocker()
    caller = asyncio.create_task(lanes.run("main", blocker))
    after = lanes.submit("main", value("after"))
    await blocker.started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await after == "after"
    assert blocker.cancelled
    worker_free = await lanes.run("main", value("still works"))
    assert worker_free == "still works"
    stats = lanes.stats()
    assert (stats.cancelled, stats.completed, stats.running) == (1, 2, 0)


async def test_a_task_that_ignores_cancellation_does_not_poison_the_next_one() -> None:
    lanes = CommandLanes()
    started = asyncio.Event()
    proceed = asyncio.Event()

    async def stubborn() -> str:
        started.set()
        try:
            await proceed.wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # swallow it and do more work
        return "ignored"

    async def next_task() -> str:
        await asyncio.sleep(0)  # an await that would raise if the worker kept a cancel
        return "fine"

    handle = lanes.submit("main", stubborn)
    after = lanes.submit("main", next_task)
    await started.wait()
    assert handle.cancel()
    assert await after == "fine"
    assert handle.cancelled()


async def test_a_task_cancelling_its_own_future_finishes_without_harm() -> None:
    lanes = CommandLanes()
    holder: list[asyncio.Future[str]] = []

    async def self_cancel() -> str:
        holder[0].cancel()
        return "done"

    holder.append(lanes.submit("main", self_cancel))
    assert await lanes.run("main", value("next")) == "next"
    assert holder[0].cancelled()


async def test_wait_callback_reports_the_wait_and_the_tasks_ahead() -> None:
    clock = FakeClock()
    infos: list[WaitInfo] = []
    lanes = CommandLanes(warn_after=1.0, on_wait=infos.append, clock=clock)
    blocker = Blocker()
    first = lanes.submit("main", blocker)
    await blocker.started.wait()
    second = lanes.submit("main", value(2))
    third = lanes.submit("main", value(3))
    clock.now += 5.0
    blocker.release.set()
    await asyncio.gather(first, second, third)
    assert infos == [WaitInfo("main", 5.0, 0, 1), WaitInfo("main", 5.0, 1, 1)]
    stats = lanes.stats("main")
    assert (stats.waited, stats.max_wait) == (0, 0.0)  # forgotten once idle
    assert (lanes.stats().waited, lanes.stats().max_wait) == (2, 5.0)


async def test_wait_threshold_per_call_per_lane_and_callback_per_call() -> None:
    clock = FakeClock()
    default: list[WaitInfo] = []
    own: list[WaitInfo] = []
    lanes = CommandLanes(warn_after=10.0, on_wait=default.append, clock=clock)
    lanes.set_warn_after("cron", 0.5)
    blockers = {lane: Blocker() for lane in ("main", "cron")}
    for lane, blocker in blockers.items():
        lanes.submit(lane, blocker)
        await blocker.started.wait()
    futures = [
        lanes.submit("main", value("short"), warn_after=1.0, on_wait=own.append),
        lanes.submit("main", value("lane default")),
        lanes.submit("cron", value("cron")),
    ]
    clock.now += 2.0
    for blocker in blockers.values():
        blocker.release.set()
    await asyncio.gather(*futures)
    assert [(i.lane, i.waited) for i in own] == [("main", 2.0)]
    assert [(i.lane, i.waited) for i in default] == [("cron", 2.0)]
    assert lanes.stats("cron").waited == 1
    assert lanes.stats("cron").max_wait == 2.0
    assert lanes.stats().waited == 2
    with pytest.raises(InvalidInputError):
        lanes.submit("main", value(0), warn_after=-1)


async def test_a_failing_wait_callback_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()

    def broken(info: WaitInfo) -> None:
        raise RuntimeError("callback bug")

    lanes = CommandLanes(warn_after=0.0, on_wait=broken, clock=clock)
    blocker = Blocker()
    first = lanes.submit("main", blocker)
    await blocker.started.wait()
    second = lanes.submit("main", value("ok"))
    clock.now += 1
    blocker.release.set()
    with caplog.at_level(logging.ERROR, logger="statekeeper.runtime.lanes"):
        assert await second == "ok"
    await first
    assert "wait callback" in caplog.text


async def test_stats_per_lane_and_in_total() -> None:
    lanes = CommandLanes({"main": 1}, clock=FakeClock())
    blocker = Blocker()
    running = lanes.submit("main", blocker)
    queued = lanes.submit("main", value(1))
    await blocker.started.wait()
    assert lanes.stats("main") == LaneStats(queued=1, running=1)
    assert lanes.stats() == LaneStats(queued=1, running=1)
    blocker.release.set()
    await asyncio.gather(running, queued)
    assert lanes.stats("main") == LaneStats(completed=2)
    assert lanes.names() == ["main"]  # configured lanes stay
    assert lanes.stats("unknown") == LaneStats()


async def test_one_off_lanes_are_forgotten_once_idle() -> None:
    lanes = CommandLanes()

    async def boom() -> None:
        raise KeyError("x")

    futures = [lanes.submit(f"session:{i}", value(i)) for i in range(2000)]
    futures += [lanes.submit(f"session:f{i}", boom) for i in range(50)]
    assert len(lanes.names()) == 2050
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert results[:2000] == list(range(2000))
    assert lanes.names() == []
    assert lanes._lanes == {}
    stats = lanes.stats()
    assert (stats.completed, stats.failed, stats.queued, stats.running) == (2000, 50, 0, 0)
    # Withdrawn and cleared tasks leave nothing behind either.
    blocker = Blocker()
    first = lanes.submit("session:x", blocker)
    withdrawn = lanes.submit("session:x", value(0))
    cleared = lanes.submit("session:x", value(0))
    await blocker.started.wait()
    withdrawn.cancel()
    lanes.clear("session:x")
    blocker.release.set()
    await first
    with pytest.raises(LaneClearedError):
        await cleared
    assert lanes.names() == []


@pytest.mark.parametrize("name", ["", "x" * 201, "bad\nname", "tab\there", 7])
async def test_invalid_lane_names_are_refused(name: object) -> None:
    lanes = CommandLanes()
    with pytest.raises(InvalidInputError):
        lanes.submit(name, value(1))  # type: ignore[arg-type]
    assert lanes.names() == []


async def test_long_and_unusual_printable_names_are_fine() -> None:
    lanes = CommandLanes()
    for name in ("x" * 200, "session:ünï çødé", "cron job #1"):
        assert await lanes.run(name, value(name)) == name


async def test_tasks_do_not_see_the_callers_context_vars() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    lanes = CommandLanes()
    var.set("caller")

    async def read() -> str:
        var.set("task")  # must not leak into the next task
        return "seen"

    async def read_again() -> str:
        return var.get()

    assert await lanes.run("main", read) == "seen"
    assert await lanes.run("main", read_again) == "unset"
    assert var.get() == "caller"


# -- properties -------------------------------------------------------------------------------

operations = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans(), st.booleans()),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(operations, st.integers(min_value=1, max_value=3))
def test_any_interleaving_keeps_per_lane_fifo_order(
    ops: list[tuple[str, bool, bool]], concurrency: int
) -> None:
    """Tasks start in submission order per lane, whatever is cancelled or yields."""

    async def scenario() -> None:
        lanes = CommandLanes(default_concurrency=concurrency)
        started: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        expected: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        running: dict[str, int] = {"a": 0, "b": 0, "c": 0}
        peak: dict[str, int] = {"a": 0, "b": 0, "c": 0}
        futures = []

        def make(lane: str, n: int) -> Callable[[], Awaitable[int]]:
            async def task() -> int:
                started[lane].append(n)
                running[lane] += 1
                peak[lane] = max(peak[lane], running[lane])
                await asyncio.sleep(0)
                running[lane] -= 1
                return n

            return task

        for n, (lane, cancel, pause) in enumerate(ops):
            future = lanes.submit(lane, make(lane, n))
            if cancel:
                future.cancel()
            else:
                expected[lane].append(n)
                futures.append(future)
            if pause:
                await asyncio.sleep(0)
        results = await asyncio.gather(*futures, return_exceptions=True)
        for lane in started:
            # A task cancelled after it started is in `started` but not in `expected`.
            assert [n for n in started[lane] if n in expected[lane]] == expected[lane]
            assert started[lane] == sorted(started[lane])
            assert peak[lane] <= concurrency
        assert all(isinstance(r, int) for r in results)
        await lanes.close()
        assert lanes.names() == []
        total = lanes.stats()
        assert total.completed + total.cancelled == len(ops)

    asyncio.run(scenario())


async def test_a_worker_cancelled_from_outside_tears_its_lane_down() -> None:
    """As at event loop shutdown: callers are cancelled, nothing hangs, nothing leaks."""
    lanes = CommandLanes()
    queued = [lanes.submit("main", value(i)) for i in range(3)]
    (worker,) = [t for t in asyncio.all_tasks() if t.get_name() == "statekeeper-lane:main"]
    worker.cancel()  # before its first step
    await asyncio.gather(*queued, return_exceptions=True)
    assert all(f.cancelled() for f in queued)
    assert lanes.names() == []
    blocker = Blocker()
    running = lanes.submit("main", blocker)
    behind = lanes.submit("main", value("behind"))
    await blocker.started.wait()
    (worker,) = [t for t in asyncio.all_tasks() if t.get_name() == "statekeeper-lane:main"]
    worker.cancel()  # while a task runs
    await asyncio.gather(running, behind, return_exceptions=True)
    assert running.cancelled()
    assert behind.cancelled()
    assert blocker.cancelled
    await lanes.close()
    assert lanes.names() == []
    assert lanes.stats().cancelled == 5
