"""Leases and event feeds on Redis, across real processes (shared server, own key prefix)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.exceptions as rx
from redis.asyncio import Redis

from statekeeper.errors import InvalidInputError
from statekeeper.stores import open_store
from statekeeper.stores.base import EventDraft
from statekeeper.stores.redis import RedisStore
from statekeeper.stores.redis.coordination import (
    LeaseBusyError,
    LeaseLostError,
    RedisEventFeed,
    RedisLeases,
)

REDIS_URL = os.environ.get("STATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


async def reachable() -> bool:
    parts = urlsplit(REDIS_URL)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname or "localhost", parts.port or 6379), 1.0
        )
    except (OSError, TimeoutError):
        return False
    writer.close()
    await writer.wait_closed()
    return True


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    if not await reachable():
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"} or os.environ.get(
            "STATEKEEPER_REQUIRE_SERVICES"
        ):
            pytest.fail(f"no Redis server at {REDIS_URL}", pytrace=False)
        pytest.skip(f"no Redis server at {REDIS_URL}")
    name = f"skc{uuid.uuid4().hex[:12]}"
    yield name
    client = Redis.from_url(REDIS_URL)
    try:
        async for key in client.scan_iter(match=f"{name}/*", count=1000):
            await client.unlink(key)
        await client.unlink(f"{name}:sync:ready", f"{name}:sync:go")
    finally:
        await client.aclose()


@pytest.fixture
async def store(prefix: str) -> AsyncIterator[RedisStore]:
    opened = await open_store(REDIS_URL, prefix=prefix)
    assert isinstance(opened, RedisStore)
    try:
        yield opened
    finally:
        await opened.close()


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from redis.asyncio import Redis
    from statekeeper.errors import NotFoundError
    from statekeeper.stores.redis.coordination import RedisLeases
    from statekeeper.stores import open_store
    from statekeeper.stores.base import EventDraft

    url, prefix, mode, count = sys.argv[1:5]

    async def main():
        store = await open_store(url, prefix=prefix)
        leases = RedisLeases(store)
        sync = Redis.from_url(url)
        out = []
        try:
            await sync.rpush(prefix + ":sync:ready", "1")
            await sync.blpop([prefix + ":sync:go"], timeout=60)
            if mode == "counter":
                for _ in range(int(count)):
                    async with leases.hold("t", "s1", ttl=5, wait=60) as lease:
                        try:
                            value = (await store.get_record("t", "ns", "counter")).value
                        except NotFoundError:
                            value = 0
                        await asyncio.sleep(0.002)  # widen the window a race would need
                        await store.put_record("t", "ns", "counter", value + 1)
                        out.append(lease.fence)
            elif mode == "die":
                async with leases.hold("t", "s1", ttl=1.0) as lease:
                    print(lease.fence, flush=True)
                    await asyncio.sleep(3600)
            elif mode == "events":
                n = 0
                for size in [1, 3, 2, 5, 4] * (int(count) // 15):
                    drafts = [
                        EventDraft(stream="tool", kind="result", payload={"n": n + i})
                        for i in range(size)
                    ]
                    await store.append_events("t", "run-1", drafts)
                    n += size
                    await asyncio.sleep(0.001)
                out.append(n)
        finally:
            await sync.aclose()
            await store.close()
        print(json.dumps(out), flush=True)

    asyncio.run(main())
    """
)


async def spawn(prefix: str, mode: str, count: int = 0) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        REDIS_URL,
        prefix,
        mode,
        str(count),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def release(prefix: str, children: int) -> None:
    client = Redis.from_url(REDIS_URL)
    try:
        for _ in range(children):
            assert await client.blpop([f"{prefix}:sync:ready"], timeout=60) is not None
        await client.rpush(f"{prefix}:sync:go", *["go"] * children)
    finally:
        await client.aclose()


async def result(proc: asyncio.subprocess.Process) -> list[int]:
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    parsed: list[int] = json.loads(out.decode().splitlines()[-1])
    return parsed


# -- leases --------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_lease_lets_one_process_at_a_time_in(store: RedisStore, prefix: str) -> None:
    children, rounds = 4, 12
    procs = [await spawn(prefix, "counter", rounds) for _ in range(children)]
    await release(prefix, children)
    fences = [await result(proc) for proc in procs]
    # Unprotected read-modify-writes: only mutual exclusion keeps every increment.
    assert (await store.get_record("t", "ns", "counter")).value == children * rounds
    every = sorted(f for mine in fences for f in mine)
    assert every == list(range(every[0], every[0] + children * rounds))  # one per grant
    for mine in fences:
        assert mine == sorted(mine)
    assert await RedisLeases(store).holder_fence("t", "s1") is None


@pytest.mark.slow
async def test_a_dead_workers_lease_expires_and_its_successor_gets_a_larger_fence(
    store: RedisStore, prefix: str
) -> None:
    leases = RedisLeases(store)
    proc = await spawn(prefix, "die")
    await release(prefix, 1)
    assert proc.stdout is not None
    dead_fence = int(await asyncio.wait_for(proc.stdout.readline(), 60))
    with pytest.raises(LeaseBusyError):
        await leases.acquire("t", "s1", wait=0)
    await asyncio.sleep(1.5)  # renewed by the living worker
    assert await leases.holder_fence("t", "s1") == dead_fence
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    killed = time.monotonic()
    async with leases.hold("t", "s1", ttl=2, wait=10) as lease:
        assert time.monotonic() - killed < 3.0  # its ttl (1s), plus slack for a busy box
        assert lease.fence == dead_fence + 1
        assert await leases.holder_fence("t", "s1") == lease.fence


async def test_only_the_holder_can_release_a_lease(store: RedisStore) -> None:
    leases = RedisLeases(store)
    first = await leases.acquire("t", "s1", ttl=0.2)  # not renewed: expires
    await asyncio.sleep(0.4)
    second = await leases.acquire("t", "s1", ttl=5, wait=0)
    assert second.fence == first.fence + 1
    assert not await leases.release(first)
    assert await leases.holder_fence("t", "s1") == second.fence
    assert await leases.release(second)
    assert await leases.holder_fence("t", "s1") is None


async def test_a_held_lease_is_renewed_beyond_its_ttl(store: RedisStore) -> None:
    leases = RedisLeases(store)
    async with leases.hold("t", "s1", ttl=0.6) as lease:
        await asyncio.sleep(1.5)
        with pytest.raises(LeaseBusyError):
            await leases.acquire("t", "s1", wait=0.1)
        assert not lease.lost
        await lease.check()
    assert lease.lost  # released
    assert await leases.holder_fence("t", "s1") is None


async def test_a_lease_taken_away_is_reported_lost(store: RedisStore) -> None:
    leases = RedisLeases(store)
    async with leases.hold("t", "s1", ttl=0.3) as lease:
        await store.client.delete(store.keys.lease("t", "s1"))  # as if it had expired
        successor = await leases.acquire("t", "s1", ttl=5, wait=0)
        await asyncio.sleep(0.4)
        assert lease.lost
        with pytest.raises(LeaseLostError):
            await lease.check()
    assert await leases.holder_fence("t", "s1") == successor.fence  # not released by us


async def test_leases_of_sessions_and_tenants_are_independent(store: RedisStore) -> None:
    leases = RedisLeases(store)
    async with (
        leases.hold("t", "s1", ttl=5) as a,
        leases.hold("t", "s2", ttl=5, wait=0) as b,
        leases.hold("u", "s1", ttl=5, wait=0) as c,
    ):
        assert (a.fence, b.fence, c.fence) == (1, 1, 1)


@pytest.mark.parametrize(
    "options", [{"ttl": 0}, {"ttl": -1}, {"wait": -1}], ids=["zero-ttl", "negative", "wait"]
)
async def test_bad_lease_options_are_refused(store: RedisStore, options: dict[str, float]) -> None:
    with pytest.raises(InvalidInputError):
        await RedisLeases(store).acquire("t", "s1", **options)


# -- event feeds ---------------------------------------------------------------------------


async def collect(feed: RedisEventFeed, after: int, until: int) -> list[int]:
    seqs: list[int] = []
    async with contextlib.aclosing(feed.follow("t", "run-1", after_seq=after)) as events:
        async for event in events:
            assert event.payload == {"n": event.seq - 1}
            seqs.append(event.seq)
            if event.seq == until:
                return seqs
    return seqs


@pytest.mark.slow
async def test_events_from_another_process_arrive_in_order_and_resume_without_gaps(
    store: RedisStore, prefix: str
) -> None:
    feed = RedisEventFeed(store, block=0.2)
    total = 150
    # after="0": every notice of this test's fresh prefix, so the follower cannot miss
    # the first batches however late it starts (a pinned "$" would race the child).
    notices = feed.notices("t", after="0")
    assert (await asyncio.wait_for(anext(notices), 10)).resync  # listening from here
    first_notice = asyncio.ensure_future(anext(notices))
    proc = await spawn(prefix, "events", total)
    live = asyncio.create_task(collect(feed, 0, total))
    await release(prefix, 1)
    assert await result(proc) == [total]
    assert await asyncio.wait_for(live, 60) == list(range(1, total + 1))
    assert await asyncio.wait_for(collect(feed, 73, total), 60) == list(range(74, total + 1))

    notice = await asyncio.wait_for(first_notice, 10)
    assert notice.first_seq is not None
    assert notice.last_seq is not None
    covered = set(range(notice.first_seq, notice.last_seq + 1))
    assert notice.position is not None
    async with contextlib.aclosing(feed.notices("t", after=notice.position)) as rest:
        assert (await anext(rest)).resync
        async for later in rest:
            assert later.log_id == "run-1"
            assert later.first_seq is not None
            assert later.last_seq is not None
            covered |= set(range(later.first_seq, later.last_seq + 1))
            if later.last_seq == total:
                break
    assert covered == set(range(1, total + 1))
    await notices.aclose()


async def test_a_follower_waits_for_the_first_event_of_a_new_log(store: RedisStore) -> None:
    feed = RedisEventFeed(store, block=0.1)
    waiting = asyncio.create_task(collect(feed, 0, 2))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await store.append_events(
        "t", "run-1", [EventDraft(stream="s", kind="k", payload={"n": n}) for n in range(2)]
    )
    assert await asyncio.wait_for(waiting, 10) == [1, 2]


async def test_a_feed_that_loses_redis_resyncs_and_reads_on_from_where_it_was(
    store: RedisStore,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    feed_store = await open_store(REDIS_URL, prefix=prefix)  # the feed's own connections
    assert isinstance(feed_store, RedisStore)
    feed = RedisEventFeed(feed_store, block=0.1, retry_every=0.01)
    real_xread, failures = feed_store.client.xread, [rx.ConnectionError("network down")] * 2

    async def flaky_xread(*args: Any, **kwargs: Any) -> Any:
        if failures:  # the first reads fail as a dropped connection does
            raise failures.pop()
        return await real_xread(*args, **kwargs)

    try:
        async with contextlib.aclosing(feed.notices("t")) as notices:
            assert (await asyncio.wait_for(anext(notices), 10)).resync
            await store.append_events("t", "run-1", [EventDraft(stream="s", kind="k")])
            monkeypatch.setattr(feed_store.client, "xread", flaky_xread)
            resyncs = 0
            while (notice := await asyncio.wait_for(anext(notices), 10)).resync:
                resyncs += 1  # one after each reconnection
            assert resyncs == 2
            # ... and the notice appended before the failures was not skipped
            assert (notice.log_id, notice.first_seq, notice.last_seq) == ("run-1", 1, 1)
        assert not failures
        assert "lost Redis" in caplog.text
    finally:
        await feed_store.close()
