"""`EventBus.publish_ahead`: an event reaches this process's subscribers at once, with the
seq it will have, and is logged by the run's next write through the bus; when that write
does not log it so, subscribers read the log again from there and miss nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from statekeeper.errors import StoreUnavailableError
from statekeeper.runtime.events import BusEvent, EventBus, Subscription
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import EntryDraft, Event, EventBatch, SessionRecord

TENANT = "alice"
RUN = "run-1"


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = f"sqlite:///{tmp_path / 's.db'}" if request.param == "sqlite" else "memory://"
    async with open_store(url) as opened:
        await opened.create_session(SessionRecord(id="s1", tenant=TENANT))
        yield opened


async def appended(store: Store, entry_id: str, batch: EventBatch | None) -> Sequence[Event]:
    result = await store.append_entries(
        TENANT, "s1", [EntryDraft(id=entry_id, payload={"n": entry_id})], events=batch
    )
    return result.events


async def take(sub: Subscription, count: int) -> list[tuple[int, str]]:
    return [(e.seq, e.kind) for e in [await anext(sub) for _ in range(count)]]


async def kinds(store: Store) -> list[tuple[int, str]]:
    return [(e.seq, e.kind) for e in await store.read_events(TENANT, RUN)]


async def test_an_event_ahead_is_seen_at_once_and_logged_by_the_next_write(store: Store) -> None:
    bus = EventBus(store, TENANT)
    sub = bus.subscribe(RUN)
    await bus.publish(RUN, "lifecycle", "start", {})
    early = await bus.publish_ahead(RUN, "tool", "call_start", {"tool": "t"})
    assert (early.seq, await take(sub, 2)) == (2, [(1, "start"), (2, "call_start")])
    assert await kinds(store) == [(1, "start")]  # not logged yet
    await bus.publish_ahead(RUN, "tool", "result", {"tool": "t"})

    batches: list[list[str]] = []

    async def write(batch: EventBatch | None) -> Sequence[Event]:
        batches.append([d.kind for d in batch.events] if batch else [])
        return await appended(store, "e1", batch)

    logged = await bus.publish_with(RUN, [("lifecycle", "status", {"status": "x"})], write)
    assert batches == [["call_start", "result", "status"]]  # one write, the early ones first
    assert [e.seq for e in logged] == [4]
    assert await take(sub, 2) == [(3, "result"), (4, "status")]  # each once, in order
    assert await kinds(store) == [(1, "start"), (2, "call_start"), (3, "result"), (4, "status")]
    await bus.aclose()


async def test_before_the_bus_knows_the_run_an_event_ahead_is_written_at_once(
    store: Store,
) -> None:
    bus = EventBus(store, TENANT)
    event = await bus.publish_ahead(RUN, "tool", "call_start", {"tool": "t"})
    assert event.seq == 1
    assert await kinds(store) == [(1, "call_start")]


async def test_a_publish_logs_the_events_ahead_first_in_the_same_batch(store: Store) -> None:
    bus = EventBus(store, TENANT)
    await bus.publish(RUN, "lifecycle", "start", {})
    await bus.publish_ahead(RUN, "tool", "call_start", {"tool": "t"})
    assert (await bus.publish(RUN, "error", "error", {"message": "m"})).seq == 3
    assert await kinds(store) == [(1, "start"), (2, "call_start"), (3, "error")]


async def test_closing_the_bus_logs_the_events_ahead(store: Store) -> None:
    bus = EventBus(store, TENANT)
    await bus.publish(RUN, "lifecycle", "start", {})
    await bus.publish_ahead(RUN, "tool", "call_start", {"tool": "t"})
    await bus.aclose()
    assert await kinds(store) == [(1, "start"), (2, "call_start")]


async def test_when_another_process_logged_in_between_subscribers_read_the_log_again(
    store: Store,
) -> None:
    here, there = EventBus(store, TENANT), EventBus(store, TENANT)
    sub = here.subscribe(RUN)
    await here.publish(RUN, "lifecycle", "start", {})
    await here.publish_ahead(RUN, "tool", "call_start", {"tool": "t"})  # announced as 2
    assert await take(sub, 2) == [(1, "start"), (2, "call_start")]
    await there.publish(RUN, "approval", "approved", {})  # logged as 2

    await here.publish_with(RUN, [], lambda batch: appended(store, "e1", batch))
    assert await kinds(store) == [(1, "start"), (2, "approved"), (3, "call_start")]
    # What took seq 2 in the log, then the early event again with its logged seq.
    assert await take(sub, 2) == [(2, "approved"), (3, "call_start")]


async def test_when_the_write_fails_the_events_ahead_are_not_logged_and_the_seqs_reused(
    store: Store,
) -> None:
    bus = EventBus(store, TENANT)
    sub = bus.subscribe(RUN)
    await bus.publish(RUN, "lifecycle", "start", {})
    await bus.publish_ahead(RUN, "tool", "call_start", {"tool": "t"})
    assert await take(sub, 2) == [(1, "start"), (2, "call_start")]

    async def failing(batch: EventBatch | None) -> Sequence[Event]:
        raise StoreUnavailableError("the disk went away")

    with pytest.raises(StoreUnavailableError):
        await bus.publish_with(RUN, [("lifecycle", "status", {"status": "x"})], failing)
    assert await kinds(store) == [(1, "start")]
    await bus.publish(RUN, "error", "error", {"message": "failed"})
    assert await kinds(store) == [(1, "start"), (2, "error")]
    assert await take(sub, 1) == [(2, "error")]  # seq 2 again: what the log holds there


async def test_a_subscriber_holding_an_event_ahead_that_was_not_logged_drops_it(
    store: Store,
) -> None:
    bus = EventBus(store, TENANT)
    sub = bus.subscribe(RUN)
    await bus.publish(RUN, "lifecycle", "start", {})
    await bus.publish_ahead(RUN, "tool", "call_start", {"tool": "t"})  # not taken yet

    async def failing(batch: EventBatch | None) -> Sequence[Event]:
        raise StoreUnavailableError("the disk went away")

    with pytest.raises(StoreUnavailableError):
        await bus.publish_with(RUN, [], failing)
    await bus.publish(RUN, "error", "error", {"message": "failed"})
    got: list[BusEvent] = [await anext(sub) for _ in range(2)]
    assert [(e.seq, e.kind) for e in got] == [(1, "start"), (2, "error")]
