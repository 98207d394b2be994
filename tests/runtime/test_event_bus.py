"""The event bus: gap-free seqs, replay + live without gap or repeat, filters, slow
subscribers, refused payloads, waits and snapshots, on the memory and SQLite stores
and in-process (persist=False)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from store_slices import EventLogOnly

from statekeeper.errors import InvalidInputError, InvalidPayloadError, PayloadTooLargeError
from statekeeper.runtime import events as events_module
from statekeeper.runtime.events import (
    BusEvent,
    EventBus,
    SubscriberLaggedError,
    Subscription,
    UnknownEventKindError,
    WaitTimeoutError,
)
from statekeeper.stores import open_store
from statekeeper.stores.base import EventLogStore

TENANT = "alice"
RUN = "run-1"


@pytest.fixture(params=["memory", "sqlite", "inprocess", "log-only"])
def bus_kind(request: pytest.FixtureRequest) -> str:
    """ "log-only": a store with nothing but an `EventLogStore`'s methods (all a bus needs)."""
    return str(request.param)


@pytest.fixture
async def bus_store(bus_kind: str, tmp_path: Path) -> AsyncIterator[EventLogStore]:
    url = f"sqlite:///{tmp_path / 's.db'}" if bus_kind == "sqlite" else "memory://"
    store = await open_store(url)
    try:
        yield EventLogOnly(store) if bus_kind == "log-only" else store
    finally:
        await store.close()


@pytest.fixture
async def bus(bus_store: EventLogStore, bus_kind: str) -> AsyncIterator[EventBus]:
    opened = EventBus(bus_store, TENANT, persist=bus_kind != "inprocess")
    try:
        yield opened
    finally:
        await opened.aclose()


async def take(sub: Subscription, count: int) -> list[BusEvent]:
    return [await anext(sub) for _ in range(count)]


def seqs(events: list[BusEvent]) -> list[int]:
    return [e.seq for e in events]


async def test_seqs_start_at_1_and_events_carry_run_stream_kind_ts_payload(bus: EventBus) -> None:
    first = await bus.publish(RUN, "lifecycle", "start", {"task": "t"})
    second = await bus.publish(RUN, "tool", "call_start", {"tool": "search", "args": [1]})
    other = await bus.publish("run-2", "assistant", "partial", {"text": "hi"})
    assert (first.seq, second.seq, other.seq) == (1, 2, 1)
    assert (second.run_id, second.stream, second.kind) == (RUN, "tool", "call_start")
    assert second.payload == {"tool": "search", "args": [1]}
    assert second.ts.tzinfo is not None
    assert second.to_json()["seq"] == 2


async def test_concurrent_publishes_get_unique_contiguous_seqs(bus: EventBus) -> None:
    sub = bus.subscribe(RUN)

    async def publisher(worker: int) -> list[int]:
        return [
            (await bus.publish(RUN, "tool", "result", {"tool": "t", "w": worker, "n": n})).seq
            for n in range(10)
        ]

    results = await asyncio.gather(*(publisher(w) for w in range(20)))
    returned = sorted(s for seq_list in results for s in seq_list)
    assert returned == list(range(1, 201))
    for seq_list in results:  # each task's own events keep their order
        assert seq_list == sorted(seq_list)
    live = await take(sub, 200)
    assert seqs(live) == list(range(1, 201))
    replayed = [e async for e in _until(bus.subscribe(RUN, from_seq=0), 200)]
    assert replayed == live


async def _until(sub: Subscription, last_seq: int) -> AsyncIterator[BusEvent]:
    async with sub:
        async for event in sub:
            yield event
            if event.seq >= last_seq:
                return


@pytest.mark.parametrize("page", [3, 256])
async def test_resume_after_a_disconnect_has_no_gap_and_no_repeat(
    bus: EventBus, monkeypatch: pytest.MonkeyPatch, page: int
) -> None:
    monkeypatch.setattr(events_module, "_PAGE", page)
    for n in range(30):
        await bus.publish(RUN, "assistant", "partial", {"text": str(n)})
    first = bus.subscribe(RUN, from_seq=0)
    seen = await take(first, 12)
    first.close()  # the "disconnect"
    assert [e async for e in first] == []

    async def racing() -> None:
        for n in range(60):
            await bus.publish(RUN, "assistant", "partial", {"text": f"late {n}"})
            if n % 5 == 0:
                await asyncio.sleep(0)  # let the replay interleave with the publishes

    read_events = bus._read
    replayed: list[int] = []

    async def yielding_read(run_id: str, after: int, limit: int | None = None) -> list[BusEvent]:
        await asyncio.sleep(0)  # a store that answers later: publishes happen meanwhile
        page = await read_events(run_id, after, limit)
        replayed.extend(seqs(page))
        return page

    monkeypatch.setattr(bus, "_read", yielding_read)
    task = asyncio.create_task(racing())
    resumed = [e async for e in _until(bus.subscribe(RUN, from_seq=seen[-1].seq), 90)]
    await task
    assert seqs(seen + resumed) == list(range(1, 91))
    assert resumed[-1].payload == {"text": "late 59"}
    if page == 3:  # the replay read events that were also delivered live: the race happened
        assert max(replayed) > 30


async def test_from_seq_past_the_end_waits_for_new_events(bus: EventBus) -> None:
    await bus.publish(RUN, "lifecycle", "start")
    sub = bus.subscribe(RUN, from_seq=1)
    await bus.publish(RUN, "lifecycle", "end")
    assert seqs(await take(sub, 1)) == [2]


async def test_stream_and_run_filters(bus: EventBus) -> None:
    tools = bus.subscribe(RUN, streams=["tool"])
    everything = bus.subscribe()
    lifecycle_all_runs = bus.subscribe(streams={"lifecycle"})
    await bus.publish(RUN, "lifecycle", "start")
    await bus.publish(RUN, "tool", "call_start", {"tool": "a"})
    await bus.publish("run-2", "tool", "call_start", {"tool": "b"})
    await bus.publish("run-2", "lifecycle", "start")
    await bus.publish(RUN, "tool", "result", {"tool": "a"})
    assert [(e.run_id, e.seq) for e in await take(tools, 2)] == [(RUN, 2), (RUN, 3)]
    assert [(e.run_id, e.seq) for e in await take(everything, 5)] == [
        (RUN, 1),
        (RUN, 2),
        ("run-2", 1),
        ("run-2", 2),
        (RUN, 3),
    ]
    assert [(e.run_id, e.kind) for e in await take(lifecycle_all_runs, 2)] == [
        (RUN, "start"),
        ("run-2", "start"),
    ]
    replay_tools = bus.subscribe(RUN, streams=["tool"], from_seq=0)
    assert seqs(await take(replay_tools, 2)) == [2, 3]


async def test_an_all_runs_subscriber_cannot_replay(bus: EventBus) -> None:
    with pytest.raises(InvalidInputError, match="live only"):
        bus.subscribe(None, from_seq=0)


async def test_a_slow_subscriber_catches_up_from_the_log_with_bounded_memory(
    bus: EventBus,
) -> None:
    slow = bus.subscribe(RUN, buffer=5)
    for n in range(100):
        await bus.publish(RUN, "tool", "result", {"tool": "t", "n": n})
        assert len(slow._live) <= 5  # publishers never wait, memory stays bounded
    got = await take(slow, 100)
    assert seqs(got) == list(range(1, 101))
    await bus.publish(RUN, "tool", "result", {"tool": "t", "n": 100})
    assert seqs(await take(slow, 1)) == [101]


async def test_a_lagged_subscriber_without_catch_up_raises_and_can_resume(bus: EventBus) -> None:
    slow = bus.subscribe(RUN, buffer=5, catch_up=False)
    for n in range(20):
        await bus.publish(RUN, "tool", "result", {"tool": "t", "n": n})
    assert len(slow._live) == 5
    got = await take(slow, 5)
    with pytest.raises(SubscriberLaggedError) as caught:
        await anext(slow)
    assert caught.value.last_seq == 5
    assert [e async for e in slow] == []  # closed after the error
    rest = await take(bus.subscribe(RUN, from_seq=caught.value.last_seq), 15)
    assert seqs(got + rest) == list(range(1, 21))


async def test_a_lagged_all_runs_subscriber_says_what_it_dropped(bus: EventBus) -> None:
    slow = bus.subscribe(buffer=3)
    await bus.publish("a", "lifecycle", "start")
    await bus.publish("b", "lifecycle", "start")
    await bus.publish("a", "lifecycle", "status", {"status": "running"})
    await bus.publish("b", "lifecycle", "end")  # dropped: the buffer is full
    await bus.publish("c", "lifecycle", "start")  # detached: not even seen
    assert len(slow._live) == 3
    assert [(e.run_id, e.seq) for e in await take(slow, 3)] == [("a", 1), ("b", 1), ("a", 2)]
    with pytest.raises(SubscriberLaggedError) as caught:
        await anext(slow)
    assert caught.value.positions == {"b": 1}
    resumed = await take(bus.subscribe("b", from_seq=caught.value.positions["b"]), 1)
    assert (resumed[0].run_id, resumed[0].kind) == ("b", "end")


@pytest.mark.parametrize(
    "payload",
    [{"x": float("nan")}, {"x": b"bytes"}, {"x": object()}, {"x": {1, 2}}, ["not", "a", "dict"]],
    ids=["nan", "bytes", "object", "set", "list"],
)
async def test_a_non_json_payload_is_refused_and_uses_no_seq(
    bus: EventBus, bus_store: EventLogStore, bus_kind: str, payload: Any
) -> None:
    sub = bus.subscribe(RUN)
    await bus.publish(RUN, "lifecycle", "start")
    with pytest.raises(InvalidPayloadError):
        await bus.publish(RUN, "tool", "result", payload)
    after = await bus.publish(RUN, "lifecycle", "end")
    assert after.seq == 2
    assert seqs(await take(sub, 2)) == [1, 2]
    if bus_kind != "inprocess":
        assert [e.seq for e in await bus_store.read_events(TENANT, RUN)] == [1, 2]


@pytest.mark.parametrize(
    ("stream", "kind", "payload", "error"),
    [
        ("lifecycle", "restart", {}, UnknownEventKindError),
        ("tool", "called", {"tool": "t"}, UnknownEventKindError),
        ("Bad Stream", "x", {}, UnknownEventKindError),
        ("custom", "Bad Kind", {}, UnknownEventKindError),
        ("tool", "call_start", {}, InvalidPayloadError),
        ("lifecycle", "status", {"status": 3}, InvalidPayloadError),
        ("assistant", "complete", {"content": "x"}, InvalidPayloadError),
        ("error", "error", {}, InvalidPayloadError),
    ],
)
async def test_unknown_kinds_and_missing_fields_are_refused(
    bus: EventBus, stream: str, kind: str, payload: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        await bus.publish(RUN, stream, kind, payload)
    assert (await bus.publish(RUN, "custom", "anything.goes")).seq == 1


async def test_an_invalid_run_id_is_refused(bus: EventBus) -> None:
    with pytest.raises(InvalidInputError):
        await bus.publish("../etc", "lifecycle", "start")


async def test_an_oversized_event_in_a_concurrent_batch_fails_alone(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'small.db'}", max_payload_bytes=200)
    bus = EventBus(store, TENANT)
    try:
        outcomes = await asyncio.gather(
            *(
                bus.publish(RUN, "tool", "result", {"tool": "t", "blob": "x" * (500 * (n == 3))})
                for n in range(6)
            ),
            return_exceptions=True,
        )
        assert isinstance(outcomes[3], PayloadTooLargeError)
        fine = [o for o in outcomes if isinstance(o, BusEvent)]
        assert sorted(e.seq for e in fine) == [1, 2, 3, 4, 5]
    finally:
        await bus.aclose()
        await store.close()


class SlowAppends:
    """A store whose first append writes, then answers only when released."""

    def __init__(self, inner: EventLogStore) -> None:
        self.inner = inner
        self.written = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append_events(self, *args: Any) -> Any:
        events = await self.inner.append_events(*args)
        if not self.written.is_set():
            self.written.set()
            await self.release.wait()
        return events


async def test_a_publish_cancelled_after_its_write_still_reaches_subscribers(
    bus_store: EventLogStore, bus_kind: str
) -> None:
    if bus_kind == "inprocess":
        pytest.skip("an in-process publish never waits")
    slow = SlowAppends(bus_store)
    bus = EventBus(cast(EventLogStore, slow), TENANT)
    sub = bus.subscribe(RUN)
    leader = asyncio.create_task(bus.publish(RUN, "lifecycle", "start"))
    await slow.written.wait()
    follower = asyncio.create_task(bus.publish(RUN, "custom", "queued"))
    await asyncio.sleep(0)  # the follower joins the batch behind the write under way
    leader.cancel()
    slow.release.set()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert (await follower).seq == 2
    assert [(e.seq, e.kind) for e in await take(sub, 2)] == [(1, "start"), (2, "queued")]
    await bus.aclose()


async def test_wait_for_finds_stored_and_future_events(bus: EventBus) -> None:
    await bus.publish(RUN, "tool", "call_start", {"tool": "search"})
    found = await bus.wait_for(RUN, lambda e: e.stream == "tool")
    assert found.seq == 1
    waiting = asyncio.create_task(bus.wait_for(RUN, lambda e: e.payload.get("text") == "done"))
    await bus.publish(RUN, "assistant", "partial", {"text": "do"})
    await bus.publish(RUN, "assistant", "complete", {"text": "done"})
    assert (await waiting).seq == 3


async def test_wait_for_times_out_with_a_typed_error(bus: EventBus) -> None:
    with pytest.raises(WaitTimeoutError, match="run-1"):
        await bus.wait_for(RUN, lambda e: False, timeout=0.01)
    with pytest.raises(TimeoutError):
        await bus.wait_for_completion(RUN, timeout=0.01)


async def test_wait_for_completion_and_the_run_snapshot(bus: EventBus) -> None:
    waiting = asyncio.create_task(bus.wait_for_completion(RUN))
    await bus.publish(RUN, "lifecycle", "start")
    await bus.publish(RUN, "assistant", "complete", {"text": "answer"})
    snap = await bus.snapshot(RUN)
    assert (snap.status, snap.ended, snap.last_seq, snap.last_assistant) == (
        "running",
        False,
        2,
        "answer",
    )
    await bus.publish(RUN, "error", "error", {"message": "tool failed"})
    await bus.publish(RUN, "lifecycle", "end", {"status": "completed"})
    done = await waiting
    assert (done.kind, done.seq, done.terminal) == ("end", 4, True)
    snap = await bus.snapshot(RUN)
    assert (snap.status, snap.ended, snap.last_error) == ("completed", True, "tool failed")
    assert (await bus.latest(RUN)) == done
    latest_assistant = await bus.latest(RUN, "assistant")
    assert latest_assistant is not None
    assert latest_assistant.seq == 2
    assert await bus.latest("never-ran") is None
    assert (await bus.wait_for_completion(RUN)).seq == 4  # already over: from the cache


async def test_an_aborted_run_completes_too(bus: EventBus) -> None:
    await bus.publish(RUN, "lifecycle", "start")
    await bus.publish(RUN, "lifecycle", "abort", {"reason": "killed"})
    assert (await bus.wait_for_completion(RUN)).kind == "abort"
    assert (await bus.snapshot(RUN)).status == "aborted"


async def test_a_new_bus_rebuilds_snapshots_and_waits_from_the_log(
    bus_store: EventLogStore, bus_kind: str
) -> None:
    if bus_kind == "inprocess":
        pytest.skip("an in-process log does not outlive its bus")
    first = EventBus(bus_store, TENANT)
    await first.publish(RUN, "lifecycle", "start")
    await first.publish(RUN, "lifecycle", "end", {"status": "error"})
    restarted = EventBus(bus_store, TENANT)
    assert (await restarted.wait_for_completion(RUN)).seq == 2
    assert (await restarted.snapshot(RUN)).status == "error"
    assert (await restarted.publish(RUN, "custom", "note")).seq == 3


async def test_two_buses_sharing_a_store_number_one_log(
    bus_store: EventLogStore, bus_kind: str, tmp_path: Path
) -> None:
    if bus_kind == "inprocess":
        pytest.skip("in-process logs are not shared")
    other_store = bus_store
    if bus_kind == "sqlite":  # a second handle on the file, as another process has
        other_store = await open_store(f"sqlite:///{tmp_path / 's.db'}")
    here, there = EventBus(bus_store, TENANT), EventBus(other_store, TENANT)
    try:
        live_here = here.subscribe(RUN)
        tools_here = here.subscribe(RUN, streams=["tool"])
        await here.publish(RUN, "lifecycle", "start")
        outcomes = await asyncio.gather(
            *(b.publish(RUN, "custom", "tick", {"n": n}) for n in range(10) for b in (here, there))
        )
        assert sorted(e.seq for e in outcomes) == list(range(2, 22))
        # Events "there" logged reach subscribers "here": the next seq seen here shows the
        # gap, and the subscriber reads the missing ones from the log.
        await there.publish(RUN, "tool", "result", {"tool": "from-there"})
        await here.publish(RUN, "tool", "result", {"tool": "from-here"})
        assert seqs(await take(live_here, 23)) == list(range(1, 24))
        assert [e.payload["tool"] for e in await take(tools_here, 2)] == ["from-there", "from-here"]
        # Without a publish here, refresh (or poll) makes them read the log.
        await there.publish(RUN, "tool", "result", {"tool": "later"})
        here.refresh(RUN)
        assert seqs(await take(live_here, 1)) == [24]
        assert (await here.snapshot(RUN)).last_seq == 24
        waiting = asyncio.create_task(here.wait_for_completion(RUN, 10, poll_interval=0.001))
        await there.publish(RUN, "lifecycle", "end")
        assert (await waiting).seq == 25
    finally:
        await there.aclose()
        if other_store is not bus_store:
            await other_store.close()


async def test_closing_a_subscription_ends_a_waiting_iteration(bus: EventBus) -> None:
    sub = bus.subscribe(RUN)
    waiting = asyncio.create_task(anext(sub, None))
    await asyncio.sleep(0)
    sub.close()
    assert await waiting is None
    await bus.publish(RUN, "lifecycle", "start")
    assert sub._live == type(sub._live)()


async def test_delete_run_forgets_its_log_and_closes_its_subscribers(bus: EventBus) -> None:
    sub = bus.subscribe(RUN)
    await bus.publish(RUN, "lifecycle", "start")
    await bus.delete_run(RUN)
    assert [e async for e in sub] == []
    assert await bus.latest(RUN) is None
    assert (await bus.publish(RUN, "lifecycle", "start")).seq == 1


async def test_a_persistent_bus_needs_a_store() -> None:
    with pytest.raises(InvalidInputError):
        EventBus(None, TENANT)
    with pytest.raises(InvalidInputError):
        EventBus(None, TENANT, persist=False, buffer=0)


class _SlowReads:
    """An event log whose reads take their answer, then wait for ``release`` before they
    return it: the answer a read gives when another process logs meanwhile."""

    def __init__(self, inner: EventLogStore) -> None:
        self.inner = inner
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read_events(self, *args: Any, **kwargs: Any) -> Any:
        answer = await self.inner.read_events(*args, **kwargs)
        self.reading.set()
        await self.release.wait()
        return answer


async def test_a_poll_during_a_read_is_not_lost(tmp_path: Path) -> None:
    async with open_store(f"sqlite:///{tmp_path / 'bus.db'}") as store:
        slow = _SlowReads(store)
        reader = EventBus(cast(EventLogStore, slow), "t")
        publisher = EventBus(store, "t")  # "another process": the reader learns by a poll
        with reader.subscribe("run-1", from_seq=0) as sub:
            first = asyncio.ensure_future(anext(sub))
            await slow.reading.wait()  # the replay's read has its (empty) answer
            await publisher.publish("run-1", "assistant", "partial", {"text": "hi"})
            reader.refresh("run-1")  # what a feed's notice does
            slow.release.set()
            event = await asyncio.wait_for(first, 5)
        assert (event.seq, event.payload["text"]) == (1, "hi")
        await publisher.aclose()
        await reader.aclose()
