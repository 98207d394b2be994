"""`EventBus.publish_with`: a run's events logged in another write of the store (an append
of entries), fanned out in seq order once it lands, never ahead of a write under way,
and published on their own when the write is refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from statekeeper.errors import ConflictError, PayloadTooLargeError
from statekeeper.runtime.events import BusEvent, EventBus, Subscription
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import EntryDraft, Event, EventBatch, SessionRecord

TENANT = "alice"
RUN = "run-1"
SAID = [("assistant", "complete", {"text": "hi"}), ("lifecycle", "status", {"status": "x"})]
Write = Callable[[EventBatch | None], Awaitable[Sequence[Event]]]


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = f"sqlite:///{tmp_path / 's.db'}" if request.param == "sqlite" else "memory://"
    async with open_store(url) as opened:
        await opened.create_session(SessionRecord(id="s1", tenant=TENANT))
        yield opened


def appending(store: Store, entry_id: str, expected_version: int | None = None) -> Write:
    """A write that appends one entry, logging the batch it is given with it."""

    async def write(batch: EventBatch | None) -> Sequence[Event]:
        draft = EntryDraft(id=entry_id, payload={"n": entry_id})
        result = await store.append_entries(
            TENANT, "s1", [draft], events=batch, expected_version=expected_version
        )
        return result.events

    return write


async def take(sub: Subscription, count: int) -> list[BusEvent]:
    return [await anext(sub) for _ in range(count)]


async def test_events_are_logged_by_the_write_and_reach_subscribers_in_order(
    store: Store,
) -> None:
    bus = EventBus(store, TENANT)
    sub = bus.subscribe(RUN)
    await bus.publish(RUN, "lifecycle", "start", {})
    published = await bus.publish_with(RUN, SAID, appending(store, "e1"))
    assert [(e.seq, e.kind) for e in published] == [(2, "complete"), (3, "status")]
    assert [e.seq for e in await take(sub, 3)] == [1, 2, 3]
    assert [e.seq for e in await store.read_events(TENANT, RUN)] == [1, 2, 3]
    assert [e.id for e in await store.read_entries(TENANT, "s1")] == ["e1"]
    assert (await bus.snapshot(RUN)).last_seq == 3


async def test_a_publish_during_the_write_comes_after_its_events(store: Store) -> None:
    bus = EventBus(store, TENANT)
    sub = bus.subscribe(RUN)
    entered, release = asyncio.Event(), asyncio.Event()
    inner = appending(store, "e1")

    async def slow(batch: EventBatch | None) -> Sequence[Event]:
        entered.set()
        await release.wait()
        return await inner(batch)

    joint = asyncio.create_task(bus.publish_with(RUN, SAID, slow))
    await entered.wait()
    later = asyncio.create_task(bus.publish(RUN, "tool", "call_start", {"tool": "search"}))
    await asyncio.sleep(0)  # the publish is queued behind the write, not written
    assert await store.read_events(TENANT, RUN) == []
    release.set()
    await joint
    assert (await later).seq == 3
    assert [(e.seq, e.stream) for e in await take(sub, 3)] == [
        (1, "assistant"),
        (2, "lifecycle"),
        (3, "tool"),
    ]
    await bus.aclose()


async def test_events_of_a_run_with_a_write_under_way_are_published_before_the_next(
    store: Store,
) -> None:
    bus = EventBus(store, TENANT)
    entered, release = asyncio.Event(), asyncio.Event()
    inner = appending(store, "e1")
    given: list[EventBatch | None] = []

    async def slow(batch: EventBatch | None) -> Sequence[Event]:
        entered.set()
        await release.wait()
        return await inner(batch)

    async def plain(batch: EventBatch | None) -> Sequence[Event]:
        given.append(batch)
        return await appending(store, "e2")(batch)

    first = asyncio.create_task(bus.publish_with(RUN, SAID[:1], slow))
    await entered.wait()
    second = asyncio.create_task(bus.publish_with(RUN, SAID[1:], plain))
    await asyncio.sleep(0)
    release.set()
    assert [e.seq for e in await first] == [1]
    assert [e.seq for e in await second] == [2]
    assert given == [None]  # not joined: its event was published first, on its own
    assert [e.id for e in await store.read_entries(TENANT, "s1")] == ["e1", "e2"]
    await bus.aclose()


async def test_a_refused_write_publishes_the_events_on_their_own_and_raises(
    store: Store,
) -> None:
    bus = EventBus(store, TENANT)
    sub = bus.subscribe(RUN)
    stale = appending(store, "e1", expected_version=99)
    with pytest.raises(ConflictError):
        await bus.publish_with(RUN, SAID, stale)
    assert [e.kind for e in await store.read_events(TENANT, RUN)] == ["complete", "status"]
    assert [e.seq for e in await take(sub, 2)] == [1, 2]
    assert await store.read_entries(TENANT, "s1") == []


async def test_an_event_the_store_refuses_raises_its_own_error_and_logs_nothing(
    tmp_path: Path,
) -> None:
    async with open_store(f"sqlite:///{tmp_path / 'small.db'}?max_payload_bytes=500") as small:
        await small.create_session(SessionRecord(id="s1", tenant=TENANT))
        bus = EventBus(small, TENANT)
        big = [("assistant", "complete", {"text": "x" * 1000})]
        with pytest.raises(PayloadTooLargeError):
            await bus.publish_with(RUN, big, appending(small, "e1"))
        assert await small.read_events(TENANT, RUN) == []
        assert await small.read_entries(TENANT, "s1") == []


async def test_a_bus_without_a_log_publishes_first_and_writes_without_events(
    store: Store,
) -> None:
    bus = EventBus(None, TENANT, persist=False)
    given: list[EventBatch | None] = []

    async def write(batch: EventBatch | None) -> Sequence[Event]:
        given.append(batch)
        return []

    published = await bus.publish_with(RUN, SAID, write)
    assert given == [None]
    assert [e.seq for e in published] == [1, 2]
    assert bus.store is None
