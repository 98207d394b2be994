"""The coordination protocols, one suite for every implementation: session locks (Redis
leases, PostgreSQL advisory locks) and event feeds (Redis streams, LISTEN/NOTIFY).

Two handles on one server stand for two processes; the tests use only the protocols
(`SessionLocks`, `HeldLock`, `EventFeed`, `feed_bus`), so a new backend joins by adding a
fixture branch. Backend-specific behaviour (fencing tokens, dead processes, reconnection)
is tested in ``test_redis_coordination.py`` and ``test_pg_coordination.py``."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from services import (
    POSTGRES_URL,
    REDIS_URL,
    drop_postgres_schema,
    drop_redis_prefix,
    require,
)

from statekeeper.errors import InvalidIdError, InvalidInputError
from statekeeper.runs import Finish, Runner, StepInput
from statekeeper.runtime import (
    EventBus,
    EventFeed,
    EventNotice,
    HeldLock,
    SessionLockLostError,
    SessionLocks,
    SessionLockTimeoutError,
    feed_bus,
)
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import EventDraft

BACKENDS = ["redis", "postgres"]


# -- session locks -------------------------------------------------------------------------


@dataclass
class LockHandles:
    """Two handles on one lock server (as two processes have), and a way to take a held
    lock away behind its holder's back (an expiry, a dropped connection)."""

    first: SessionLocks
    second: SessionLocks
    take_away: Callable[[HeldLock], Awaitable[None]]


@pytest.fixture(params=BACKENDS)
async def handles(request: pytest.FixtureRequest) -> AsyncIterator[LockHandles]:
    if request.param == "redis":
        from statekeeper.stores.redis import RedisLeases, RedisStore

        await require(REDIS_URL)
        prefix = f"sklock{uuid.uuid4().hex[:12]}"
        stores = [await open_store(REDIS_URL, prefix=prefix) for _ in range(2)]
        a, b = stores
        assert isinstance(a, RedisStore)
        assert isinstance(b, RedisStore)

        async def expire(held: HeldLock) -> None:  # as if the lease had expired
            await a.client.delete(a.keys.lease(held.tenant, held.session_id))

        try:
            # A short ttl, so that renewal (every ttl / 3) notices a lease taken away soon.
            yield LockHandles(RedisLeases(a, ttl=2.0), RedisLeases(b, ttl=2.0), expire)
        finally:
            for store in stores:
                await store.close()
            await drop_redis_prefix(prefix)
    else:
        import psycopg

        from statekeeper.stores.postgres import PgSessionLocks

        await require(POSTGRES_URL)
        namespace = f"t{uuid.uuid4().hex}"

        async def disconnect(held: HeldLock) -> None:  # as if its network had failed
            pid = held._conn.info.backend_pid  # type: ignore[attr-defined]
            async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as c:
                await c.execute("SELECT pg_terminate_backend(%s)", (pid,))

        async with (
            PgSessionLocks.from_url(POSTGRES_URL, namespace=namespace) as first,
            PgSessionLocks.from_url(POSTGRES_URL, namespace=namespace) as second,
        ):
            yield LockHandles(first, second, disconnect)


async def test_one_holder_at_a_time_across_handles(handles: LockHandles) -> None:
    async with handles.first.hold("t", "s1") as held:
        assert (held.tenant, held.session_id) == ("t", "s1")
        await held.check()
        for wait in (0, 0.2):
            with pytest.raises(SessionLockTimeoutError) as caught:
                async with handles.second.hold("t", "s1", wait=wait):
                    pytest.fail("two holders at once")
            assert isinstance(caught.value, TimeoutError)
            assert caught.value.session_id == "s1"
        # Other sessions, and the same session id of another tenant, are other locks.
        async with handles.second.hold("t", "s2", wait=0), handles.second.hold("u", "s1", wait=0):
            pass
    async with handles.second.hold("t", "s1", wait=0):  # released at the block's end
        pass


async def test_a_lock_is_not_reentrant(handles: LockHandles) -> None:
    async with handles.first.hold("t", "s1"):
        with pytest.raises(SessionLockTimeoutError):
            async with handles.first.hold("t", "s1", wait=0):
                pass


async def test_a_block_that_raises_releases_the_lock(handles: LockHandles) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with handles.first.hold("t", "s1"):
            raise RuntimeError("boom")
    async with handles.second.hold("t", "s1", wait=0):
        pass


async def test_many_holders_take_turns(handles: LockHandles) -> None:
    inside = most = rounds = 0

    async def worker(locks: SessionLocks) -> None:
        nonlocal inside, most, rounds
        for _ in range(3):
            async with locks.hold("t", "busy", wait=60):
                inside += 1
                most = max(most, inside)
                for _ in range(3):
                    await asyncio.sleep(0)  # give every other holder the chance to overlap
                inside -= 1
                rounds += 1

    await asyncio.gather(*(worker(h) for h in [handles.first, handles.second] * 3))
    assert (most, rounds) == (1, 18)


async def test_a_waiter_cancelled_while_waiting_leaves_nothing_locked(
    handles: LockHandles,
) -> None:
    async with handles.first.hold("t", "s1"):
        waiter = asyncio.ensure_future(handles.second.hold("t", "s1").__aenter__())
        for _ in range(20):
            await asyncio.sleep(0)  # let it start waiting
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    async with handles.first.hold("t", "s1", wait=10), handles.second.hold("t", "s2", wait=0):
        pass
    async with handles.second.hold("t", "s1", wait=10):
        pass


async def test_a_lock_taken_away_is_reported_lost_and_can_be_taken_again(
    handles: LockHandles,
) -> None:
    async with handles.first.hold("t", "s1") as held:
        await held.check()
        await handles.take_away(held)
        async with asyncio.timeout(30):  # Redis notices at its next renewal (ttl / 3)
            while not await is_lost(held):  # noqa: ASYNC110  (no event to await: ask)
                await asyncio.sleep(0.05)
        with pytest.raises(SessionLockLostError) as caught:
            await held.check()
        assert caught.value.session_id == "s1"
        async with handles.second.hold("t", "s1", wait=10) as successor:
            await successor.check()
    # The lost holder's exit released nothing of its successor's, and raised nothing.
    async with handles.second.hold("t", "s1", wait=0):
        pass


async def is_lost(held: HeldLock) -> bool:
    try:
        await held.check()
    except SessionLockLostError:
        return True
    return False


@pytest.mark.parametrize(
    ("session_id", "wait", "error"),
    [("s1", -1, InvalidInputError), ("../x", None, InvalidIdError), ("", 0, InvalidIdError)],
    ids=["negative-wait", "path", "empty"],
)
async def test_bad_input_is_refused(
    handles: LockHandles, session_id: str, wait: float | None, error: type[Exception]
) -> None:
    with pytest.raises(error):
        async with handles.first.hold("t", session_id, wait=wait):
            pass


async def test_a_runner_takes_any_session_locks(handles: LockHandles) -> None:
    """Two runners (each with its own handle, as in two processes) never drive one
    session at the same time."""
    active = most = 0

    class Counting:
        name = "a"

        async def step(self, run: StepInput) -> Any:
            nonlocal active, most
            active += 1
            most = max(most, active)
            for _ in range(3):
                await asyncio.sleep(0)  # give the other runner every chance to overlap
            active -= 1
            return Finish("ok")

    async with open_store("memory://") as store:
        runners = [
            Runner(store, "alice", [Counting()], session_locks=locks)
            for locks in (handles.first, handles.second)
        ]
        session_id = (await runners[0].start("a", "hi")).state.session_id
        results = await asyncio.gather(
            *(runners[i % 2].start("a", f"m{i}", session_id=session_id) for i in range(6))
        )
    assert [r.status for r in results] == ["completed"] * 6
    assert most == 1


# -- event feeds ---------------------------------------------------------------------------


@dataclass
class FeedSetup:
    """A feed, a store that appends (and notifies), and a second handle on the same data
    for a bus in "another process"."""

    feed: EventFeed
    writer: Store
    reader: Store


@pytest.fixture(params=BACKENDS)
async def setup(request: pytest.FixtureRequest) -> AsyncIterator[FeedSetup]:
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "redis":
            from statekeeper.stores.redis import RedisEventFeed, RedisStore

            await require(REDIS_URL)
            prefix = f"skfeed{uuid.uuid4().hex[:12]}"
            stack.push_async_callback(drop_redis_prefix, prefix)
            writer, reader, own = [
                await stack.enter_async_context(open_store(REDIS_URL, prefix=prefix))
                for _ in range(3)
            ]
            assert isinstance(own, RedisStore)  # the feed's blocking reads get their own
            yield FeedSetup(RedisEventFeed(own, block=0.2), writer, reader)
        else:
            from statekeeper.stores.postgres import PgEventFeed

            await require(POSTGRES_URL)
            schema, channel = f"skfeed_{uuid.uuid4().hex[:12]}", f"sk_{uuid.uuid4().hex[:16]}"
            stack.push_async_callback(drop_postgres_schema, schema)
            writer = await stack.enter_async_context(
                open_store(POSTGRES_URL, schema=schema, notify_channel=channel)
            )
            reader = await stack.enter_async_context(open_store(POSTGRES_URL, schema=schema))
            feed = PgEventFeed.from_url(POSTGRES_URL, channel=channel, schema=schema)
            yield FeedSetup(feed, writer, reader)


async def append(store: Store, tenant: str, log_id: str, count: int) -> None:
    drafts = [EventDraft(stream="tool", kind="result", payload={"i": i}) for i in range(count)]
    await store.append_events(tenant, log_id, drafts)


async def test_a_resync_first_then_each_append_in_commit_order(setup: FeedSetup) -> None:
    async with contextlib.aclosing(setup.feed.notices("t")) as notices:  # type: ignore[type-var]
        first = await asyncio.wait_for(anext(notices), 15)
        assert first.resync
        assert (first.tenant, first.log_id, first.last_seq) == ("t", None, None)
        await append(setup.writer, "t", "run-1", 3)
        await append(setup.writer, "t", "run-2", 1)
        await append(setup.writer, "t", "run-1", 1)
        got: list[EventNotice] = [await asyncio.wait_for(anext(notices), 15) for _ in range(3)]
    assert [(n.tenant, n.log_id, n.last_seq) for n in got] == [
        ("t", "run-1", 3),
        ("t", "run-2", 1),
        ("t", "run-1", 4),
    ]
    assert not any(n.resync for n in got)
    for notice, first_seq in zip(got, [1, 1, 4], strict=True):
        assert notice.first_seq in (None, first_seq)  # a feed that gives it gives it right


async def test_notices_of_other_tenants_are_not_delivered(setup: FeedSetup) -> None:
    async with contextlib.aclosing(setup.feed.notices("t")) as notices:  # type: ignore[type-var]
        assert (await asyncio.wait_for(anext(notices), 15)).resync
        await append(setup.writer, "other", "run-1", 2)
        await append(setup.writer, "t", "run-9", 1)
        notice = await asyncio.wait_for(anext(notices), 15)
    assert (notice.tenant, notice.log_id, notice.last_seq) == ("t", "run-9", 1)


async def test_feed_bus_makes_another_process_events_reach_subscribers(
    setup: FeedSetup,
) -> None:
    publisher, reader = EventBus(setup.writer, "t"), EventBus(setup.reader, "t")
    async with feed_bus(reader, setup.feed) as live:
        assert live is reader
        # Live only (no replay): only a notice can tell this subscriber about new events.
        with reader.subscribe("run-x") as sub:
            for i in range(5):
                await publisher.publish("run-x", "assistant", "partial", {"text": str(i)})
            got = [await asyncio.wait_for(anext(sub), 15) for _ in range(5)]
        assert [(e.seq, e.payload["text"]) for e in got] == [(i + 1, str(i)) for i in range(5)]
        # Waits see them too, with no poll_interval.
        waiting = asyncio.ensure_future(reader.wait_for_completion("run-x", timeout=15))
        await publisher.publish("run-x", "lifecycle", "end", {"status": "completed"})
        assert (await waiting).seq == 6
    await publisher.aclose()
    await reader.aclose()
