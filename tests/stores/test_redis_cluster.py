"""The Redis store on Redis Cluster beyond the conformance suite (which runs on it as the
``redis-cluster`` backend): where a tenant's keys land, listing across slots, the index
steps that are not atomic with the session's, URLs, and waiting for replicas.

They use the suite's shared cluster (``STATEKEEPER_TEST_REDIS_CLUSTER_URL``, default
``redis+cluster://127.0.0.1:7101``, started if nothing answers), each under a key prefix
of its own, deleted afterwards. Tests that fail a master over start a cluster of their
own (tests/stores/test_redis_cluster_failover.py).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from redis_cluster import require_cluster_tools, start_cluster
from statekeeper.errors import InvalidInputError, StoreUnavailableError
from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionQuery, SessionRecord
from statekeeper.stores.redis import RedisStore
from statekeeper.stores.redis.scripts import SESSION_INDEX
from statekeeper.testing.schemes import (
    REDIS_CLUSTER_URL,
    REDIS_URL,
    _require_redis_cluster,
    delete_cluster_prefix,
)
from statekeeper.testing.services import require_service, tcp_reachable

TENANT = "tenant-a"
SPREAD_SESSIONS = int(os.environ.get("STATEKEEPER_SPREAD_SESSIONS", "2000"))
"""Sessions the spread test creates (`make thorough`: 10,000, as docs/stores.md reports)."""


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """A key prefix of this test's own on the shared cluster; its keys are deleted after."""
    await _require_redis_cluster(REDIS_CLUSTER_URL)
    name = f"skc{uuid.uuid4().hex[:12]}"
    yield name
    await delete_cluster_prefix(REDIS_CLUSTER_URL, name)


@pytest.fixture
async def store(prefix: str) -> AsyncIterator[RedisStore]:
    opened = await open_store(f"{REDIS_CLUSTER_URL}?prefix={prefix}")
    assert isinstance(opened, RedisStore)
    yield opened
    await opened.close()


async def heads_per_master(prefix: str) -> Counter[str]:
    """How many session heads of ``prefix`` each master holds (SCAN on each)."""
    parts = urlsplit(REDIS_CLUSTER_URL)
    cluster = RedisCluster(host=parts.hostname or "127.0.0.1", port=parts.port or 7101)
    counts: Counter[str] = Counter()
    try:
        await cluster.initialize()
        for node in cluster.get_primaries():
            client = Redis(host=node.host, port=int(node.port))
            try:
                async for _key in client.scan_iter(match=f"{prefix}/*/s", count=1000):
                    counts[node.name] += 1
            finally:
                await client.aclose()
        assert len(cluster.get_primaries()) == 3
    finally:
        await cluster.aclose()
    return counts


async def test_a_tenants_sessions_spread_over_every_master_and_list_whole(
    store: RedisStore, prefix: str
) -> None:
    ids = [f"s{n:05d}" for n in range(SPREAD_SESSIONS)]
    for start in range(0, len(ids), 500):
        await asyncio.gather(
            *(
                store.create_session(SessionRecord(tenant=TENANT, id=i, metadata={"n": n % 7}))
                for n, i in enumerate(ids[start : start + 500], start)
            )
        )

    counts = await heads_per_master(prefix)
    print(f"\n{SPREAD_SESSIONS} sessions of one tenant, heads per master: {dict(counts)}")
    assert sum(counts.values()) == SPREAD_SESSIONS
    assert len(counts) == 3  # every master holds some
    assert min(counts.values()) > SPREAD_SESSIONS * 0.25  # and about a third each

    listed: list[str] = []
    cursor = None
    while True:
        page = await store.list_sessions(TENANT, SessionQuery(limit=1000, cursor=cursor))
        listed += [s.id for s in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(listed) == ids  # every session once

    threes: list[str] = []
    cursor = None
    while True:
        query = SessionQuery(limit=500, cursor=cursor, metadata={"n": 3})
        page = await store.list_sessions(TENANT, query)
        threes += [s.id for s in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(threes) == [i for n, i in enumerate(ids) if n % 7 == 3]


async def test_writes_move_a_session_up_the_index_of_its_tenant(store: RedisStore) -> None:
    for name in ("old", "mid", "new"):
        await store.create_session(SessionRecord(tenant=TENANT, id=name))
    await store.append_entries(TENANT, "old", [EntryDraft(id="e1", kind="message", payload={})])

    page = await store.list_sessions(TENANT, SessionQuery())
    assert [s.id for s in page.items] == ["old", "new", "mid"]
    since = page.items[0].last_active - timedelta(microseconds=1)
    after = await store.list_sessions(TENANT, SessionQuery(active_after=since))
    assert [s.id for s in after.items] == ["old"]

    await store.delete_session(TENANT, "new")
    page = await store.list_sessions(TENANT, SessionQuery())
    assert [s.id for s in page.items] == ["old", "mid"]


async def test_an_index_member_left_by_a_create_that_died_is_not_listed(
    store: RedisStore,
) -> None:
    # A process that died after adding the session to its tenant's index (the first
    # step on a cluster) and before creating the head leaves a member with no head.
    await store._run(SESSION_INDEX, [store.keys.sessions(TENANT)], ["add", 1, "ghost"])
    await store.create_session(SessionRecord(tenant=TENANT, id="real"))

    page = await store.list_sessions(TENANT, SessionQuery())
    assert [s.id for s in page.items] == ["real"]
    assert page.corrupt == []
    # Creating it for real later lists it, and deleting it clears the member.
    await store.create_session(SessionRecord(tenant=TENANT, id="ghost"))
    assert {s.id for s in (await store.list_sessions(TENANT, SessionQuery())).items} == {
        "real",
        "ghost",
    }
    await store.delete_session(TENANT, "ghost")
    client = store.client
    assert await client.zscore(store.keys.sessions(TENANT), "ghost") is None


async def test_a_sessions_keys_share_a_slot_and_differ_from_the_tenants(
    store: RedisStore,
) -> None:
    client = store.client
    assert isinstance(client, RedisCluster)
    keys = store.keys
    session_slots = {
        client.keyslot(k)
        for k in (keys.head(TENANT, "a"), keys.entries(TENANT, "a"), keys.entry_ids(TENANT, "a"))
    }
    tenant_slots = {
        client.keyslot(k)
        for k in (keys.sessions(TENANT), keys.events(TENANT, "log"), keys.record(TENANT, "n", "k"))
    }
    assert len(session_slots) == 1
    assert len(tenant_slots) == 1
    assert session_slots != tenant_slots


async def test_waiting_for_a_replica_acknowledges_writes_on_a_cluster(prefix: str) -> None:
    url = f"{REDIS_CLUSTER_URL}?prefix={prefix}&wait_replicas=1&wait_timeout=2"
    async with open_store(url) as store:
        await store.create_session(SessionRecord(tenant=TENANT, id="w"))
        drafts = [EntryDraft(id=f"e{n}", kind="message", payload={"n": n}) for n in range(3)]
        await store.append_entries(TENANT, "w", drafts)
        assert [e.id for e in await store.read_entries(TENANT, "w")] == ["e0", "e1", "e2"]


async def test_waiting_for_a_replica_that_is_not_there_is_a_typed_error() -> None:
    # The shared single server has no replica: the write is applied, but not confirmed.
    name = f"skw{uuid.uuid4().hex[:12]}"
    try:
        async with open_store(f"{REDIS_URL}?prefix={name}") as plain:
            await plain.create_session(SessionRecord(tenant=TENANT, id="w"))
    except StoreUnavailableError:
        pytest.skip("no Redis server at " + REDIS_URL)
    url = f"{REDIS_URL}?prefix={name}&wait_replicas=1&wait_timeout=0.05"
    async with open_store(url) as store:
        draft = EntryDraft(id="e0", kind="message", payload={})
        with pytest.raises(StoreUnavailableError, match=r"only 0 of 1 replica\(s\) confirmed"):
            await store.append_entries(TENANT, "w", [draft])
    async with open_store(f"{REDIS_URL}?prefix={name}") as plain:
        assert [e.id for e in await plain.read_entries(TENANT, "w")] == ["e0"]
        await plain.delete_session(TENANT, "w")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://127.0.0.1:7101/0", "a cluster has no databases"),
        ("redis+cluster://127.0.0.1:x", "invalid Redis Cluster node"),
        ("redis+cluster://127.0.0.1:7101?wait_replicas=-1", "wait_replicas must be 0 or more"),
        (
            "redis+cluster://127.0.0.1:7101?wait_replicas=1&wait_timeout=9",
            "must be below socket_timeout",
        ),
    ],
)
async def test_bad_cluster_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        await open_store(url)


async def test_a_cluster_node_opened_as_one_server_names_the_cluster_url(prefix: str) -> None:
    node = urlsplit(REDIS_CLUSTER_URL)
    url = f"redis://{node.hostname}:{node.port}/0?prefix={prefix}"

    async def create_some() -> None:
        async with open_store(url) as store:
            for n in range(64):  # some of these sessions' slots are on another node
                await store.create_session(SessionRecord(tenant=TENANT, id=f"s{n}"))

    with pytest.raises(StoreUnavailableError, match=r"node of a Redis Cluster.*redis\+cluster://"):
        await create_some()


async def test_appends_follow_a_session_whose_slot_moves_to_another_master(
    tmp_path: Path,
) -> None:
    # A slot migrating (its keys moved, the slot not yet handed over) answers ASK; once
    # handed over, its old master answers MOVED. Appends follow both, and go on where
    # they were: nothing lost, nothing twice.
    require_cluster_tools()
    handle = await asyncio.to_thread(start_cluster, 7530, tmp_path / "cluster")
    try:
        async with open_store(f"{handle.url}?prefix=mv") as store:
            assert isinstance(store, RedisStore)
            await store.create_session(SessionRecord(tenant=TENANT, id="moving"))
            await store.append_entries(TENANT, "moving", [_draft(0)])
            keys = [store.keys.head(TENANT, "moving"), store.keys.entries(TENANT, "moving")]
            keys.append(store.keys.entry_ids(TENANT, "moving"))
            source = handle.master_for_key(keys[0])
            masters = {port: node_id for port, node_id, _ in handle.masters()}
            target = next(port for port in masters if port != source)
            slot = int(handle.client(source).execute_command("CLUSTER", "KEYSLOT", keys[0]))
            await asyncio.to_thread(_migrate_keys, handle, slot, source, target, masters, keys)

            await store.append_entries(TENANT, "moving", [_draft(1)])  # ASK, then ASKING
            await asyncio.to_thread(_hand_over, handle, slot, target, masters)
            await store.append_entries(TENANT, "moving", [_draft(2)])  # MOVED
            await store.append_entries(TENANT, "moving", [_draft(2)])  # a replay
            entries = await store.read_entries(TENANT, "moving")
        assert [(e.seq, e.id) for e in entries] == [(1, "e0"), (2, "e1"), (3, "e2")]
        assert handle.master_for_key(keys[0]) == target
    finally:
        await asyncio.to_thread(handle.stop)


def _draft(n: int) -> EntryDraft:
    return EntryDraft(id=f"e{n}", kind="message", payload={"n": n})


def _migrate_keys(
    handle: Any, slot: int, source: int, target: int, masters: dict[int, str], keys: list[str]
) -> None:
    """Start moving ``slot`` from ``source`` to ``target`` and move ``keys`` over."""
    handle.client(target).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", masters[source])
    handle.client(source).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", masters[target])
    handle.client(source).execute_command(
        "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys
    )


def _hand_over(handle: Any, slot: int, target: int, masters: dict[int, str]) -> None:
    """Finish the move: every master now says ``target`` serves the slot."""
    for port in masters:
        handle.client(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", masters[target])


async def test_a_cluster_that_is_not_there_is_a_typed_error() -> None:
    nowhere = r"cannot reach Redis Cluster at 127\.0\.0\.1:1 "
    with pytest.raises(StoreUnavailableError, match=nowhere):
        await open_store("redis+cluster://127.0.0.1:1")


async def test_one_server_opened_as_a_cluster_names_the_redis_url() -> None:
    server = urlsplit(REDIS_URL)
    if not await tcp_reachable(server.hostname or "127.0.0.1", server.port or 6379):
        require_service("redis", f"no Redis server at {REDIS_URL}")
    with pytest.raises(StoreUnavailableError, match=r"is not a cluster.*redis:// URL"):
        await open_store(f"redis+cluster://{server.hostname}:{server.port or 6379}")
