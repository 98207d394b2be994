"""`feed_bus` with scripted feeds (no server): what each notice does to the bus, when
entering returns, how failures surface, and that a feed which swallows a cancellation is
still stopped. Two buses on one memory store stand for two processes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from statekeeper.errors import StatekeeperError, StoreUnavailableError
from statekeeper.runtime import EventBus, EventFeed, EventNotice, feed_bus
from statekeeper.stores.memory import MemoryStore
from statekeeper.tasks import cancel_and_wait


class ScriptedFeed:
    """Yields the notices put in its queue; raises an exception put there."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[EventNotice | BaseException] = asyncio.Queue()
        self.closed = False

    async def notices(self, tenant: str) -> AsyncIterator[EventNotice]:
        try:
            while True:
                item = await self.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.closed = True


async def settle() -> None:
    """Let every ready task run until it waits."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def test_the_scripted_feed_is_an_event_feed() -> None:
    assert isinstance(ScriptedFeed(), EventFeed)


async def test_entering_waits_for_the_feed_to_listen(store: MemoryStore) -> None:
    feed = ScriptedFeed()
    context = feed_bus(EventBus(store, "t"), feed)
    entering = asyncio.ensure_future(context.__aenter__())
    await settle()
    assert not entering.done()  # no resync yet: the feed does not listen
    feed.queue.put_nowait(EventNotice("t"))
    await asyncio.wait_for(entering, 5)
    await context.__aexit__(None, None, None)
    assert feed.closed


async def test_notices_wake_the_subscribers_of_their_run_only(store: MemoryStore) -> None:
    feed = ScriptedFeed()
    publisher, reader = EventBus(store, "t"), EventBus(store, "t")
    feed.queue.put_nowait(EventNotice("t"))
    async with feed_bus(reader, feed):
        one, two = reader.subscribe("run-1"), reader.subscribe("run-2")
        await publisher.publish("run-1", "lifecycle", "start")
        await publisher.publish("run-2", "lifecycle", "start")
        feed.queue.put_nowait(EventNotice("other", "run-2", 1))  # another tenant's: ignored
        feed.queue.put_nowait(EventNotice("t", "run-1", 1))
        assert (await asyncio.wait_for(anext(one), 5)).run_id == "run-1"
        waiting = asyncio.ensure_future(anext(two))
        await settle()
        assert not waiting.done()  # its event came from the other bus, and no notice yet
        feed.queue.put_nowait(EventNotice("t"))  # a resync wakes every run
        assert (await asyncio.wait_for(waiting, 5)).run_id == "run-2"
    assert feed.closed


async def test_a_feed_that_fails_to_start_fails_entry(store: MemoryStore) -> None:
    feed = ScriptedFeed()
    feed.queue.put_nowait(StoreUnavailableError("no server"))
    with pytest.raises(StoreUnavailableError, match="no server"):
        async with feed_bus(EventBus(store, "t"), feed):
            pytest.fail("entered without a feed")


async def test_a_feed_that_ends_before_listening_fails_entry(store: MemoryStore) -> None:
    class Empty:
        async def notices(self, tenant: str) -> AsyncIterator[EventNotice]:
            return
            yield  # an async generator that yields nothing

    with pytest.raises(StatekeeperError, match="ended before it listened"):
        async with feed_bus(EventBus(store, "t"), Empty()):
            pass


async def test_a_feed_failure_later_is_raised_on_exit(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    feed = ScriptedFeed()
    feed.queue.put_nowait(EventNotice("t"))

    async def run() -> None:
        async with feed_bus(EventBus(store, "t"), feed):
            feed.queue.put_nowait(StoreUnavailableError("lost"))
            await settle()

    with pytest.raises(StoreUnavailableError, match="lost"):
        await run()
    assert "the bus is not live" in caplog.text  # logged when it happened


async def test_a_task_that_swallows_a_cancellation_is_stopped_anyway() -> None:
    """As redis-py's calls on Python 3.11 may (asyncio.wait_for, CPython gh-86296)."""
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # dropped, as the race in wait_for drops it

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, every=0.01), 5)
    assert (task.cancelled(), swallowed) == (True, 1)

    async def failing() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        raise RuntimeError("failed while stopping")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="while stopping"):
        await cancel_and_wait(task)
