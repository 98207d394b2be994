"""The Redis store beyond the conformance suite: racing processes, restarts, faults, key
layout.

Tests that need no fault run against the shared server (``STATEKEEPER_TEST_REDIS_URL``,
default ``redis://127.0.0.1:6379/0``) under a key prefix of their own, deleted afterwards.
Tests that stop, restart or reconfigure a server start their own ``redis-server`` on a
free loopback port and stop it themselves.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    StoreCorruptError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from statekeeper.stores import open_store
from statekeeper.stores.base import (
    EntryDraft,
    EventDraft,
    SessionPatch,
    SessionQuery,
    SessionRecord,
)
from statekeeper.stores.redis import RedisStore

REDIS_URL = os.environ.get("STATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TENANT = "tenant-a"


async def reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname or "localhost", parts.port or 6379), 1.0
        )
    except (OSError, TimeoutError):
        return False
    writer.close()
    await writer.wait_closed()
    return True


def skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"} or os.environ.get(
        "STATEKEEPER_REQUIRE_SERVICES"
    ):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """A key prefix of this test's own on the shared server; its keys are deleted after."""
    if not await reachable(REDIS_URL):
        skip_or_fail(f"no Redis server at {REDIS_URL}")
    name = f"skt{uuid.uuid4().hex[:12]}"
    yield name
    client = Redis.from_url(REDIS_URL)
    try:
        async for key in client.scan_iter(match=f"{name}/*", count=1000):
            await client.unlink(key)
        await client.unlink(f"{name}:sync:ready", f"{name}:sync:go", f"{name}:sync:done")
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


def draft(entry_id: str, parent: Any = "head", **payload: Any) -> EntryDraft:
    return EntryDraft(id=entry_id, parent=parent, payload={"text": entry_id, **payload})


# -- a private server ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateRedis:
    """A redis-server of this test's own, on a free loopback port, in a temp folder."""

    def __init__(self, folder: Path, *options: str) -> None:
        self.folder = folder
        self.port = free_port()
        self.options = options
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def location(self) -> str:
        return f"127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--daemonize",
            "no",
            "--dir",
            str(self.folder),
            *self.options,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        client = Redis(port=self.port, password=self.password())
        try:
            for _ in range(200):
                try:
                    await client.ping()
                    return
                except Exception:
                    await asyncio.sleep(0.05)
            raise RuntimeError(f"redis-server on port {self.port} did not start")
        finally:
            await client.aclose()

    def password(self) -> str | None:
        if "--requirepass" in self.options:
            return self.options[self.options.index("--requirepass") + 1]
        return None

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)
            await asyncio.wait_for(self.proc.wait(), 30)
        self.proc = None


@pytest.fixture
async def private(tmp_path: Path) -> AsyncIterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        skip_or_fail("redis-server is not installed")
    server = PrivateRedis(tmp_path, "--appendonly", "no")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


# -- real processes ------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from redis.asyncio import Redis
    from statekeeper.errors import ConflictError
    from statekeeper.stores import open_store
    from statekeeper.stores.base import EntryDraft

    url, prefix, name, count = sys.argv[1:5]

    async def main():
        store = await open_store(url, prefix=prefix)
        sync = Redis.from_url(url)
        outcomes = []
        try:
            await sync.rpush(prefix + ":sync:ready", name)
            await sync.blpop([prefix + ":sync:go"], timeout=60)
            for n in range(int(count)):
                await sync.blpop([prefix + ":sync:go"], timeout=60) if n else None
                try:
                    await store.append_entries(
                        "t", "s1", [EntryDraft(id=f"{name}-{n}", payload={"n": n})],
                        expected_version=1 + n,
                    )
                    outcomes.append("won")
                except ConflictError:
                    outcomes.append("conflict")
                await sync.rpush(prefix + ":sync:done", name)
        finally:
            await sync.aclose()
            await store.close()
        print(json.dumps(outcomes))

    asyncio.run(main())
    """
)


async def spawn(prefix: str, name: str, count: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        REDIS_URL,
        prefix,
        name,
        str(count),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def release(client: Redis, prefix: str, children: int) -> None:
    """Wait until every child is connected, then let them all go at once."""
    for _ in range(children):
        assert await client.blpop([f"{prefix}:sync:ready"], timeout=60) is not None
    await client.rpush(f"{prefix}:sync:go", *["go"] * children)


async def finish(procs: list[asyncio.subprocess.Process]) -> list[list[str]]:
    results = []
    for proc in procs:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out))
    return results


@pytest.mark.slow
async def test_two_processes_racing_on_one_expected_version_let_exactly_one_win(
    store: RedisStore, prefix: str
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant="t"))
    rounds = 12
    procs = [await spawn(prefix, name, rounds) for name in ("a", "b")]
    client = Redis.from_url(REDIS_URL)
    try:
        await release(client, prefix, 2)
        for n in range(rounds):
            for _ in procs:  # both answered round n: start round n + 1
                assert await client.blpop([f"{prefix}:sync:done"], timeout=60) is not None
            if n + 1 < rounds:
                await client.rpush(f"{prefix}:sync:go", "go", "go")
        a, b = await finish(procs)
    finally:
        await client.aclose()

    assert len(a) == len(b) == rounds
    for round_outcomes in zip(a, b, strict=True):
        assert sorted(round_outcomes) == ["conflict", "won"]
    entries = await store.read_entries("t", "s1")
    assert [e.seq for e in entries] == list(range(1, rounds + 1))
    winners = ["a" if x == "won" else "b" for x in a]
    assert [e.id for e in entries] == [f"{w}-{n}" for n, w in enumerate(winners)]
    assert (await store.get_session("t", "s1")).version == 1 + rounds


# -- server restarts -----------------------------------------------------------------------


async def test_while_the_server_is_down_operations_fail_cleanly_then_recover(
    private: PrivateRedis,
) -> None:
    store = await RedisStore.open(private.location, socket_timeout=2.0)
    try:
        await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        await store.append_entries(TENANT, "s1", [draft("e1")])
        await store.put_record(TENANT, "ns", "k", 1)
        await private.stop()

        down = [
            lambda: store.append_entries(TENANT, "s1", [draft("e2")]),
            lambda: store.get_session(TENANT, "s1"),
            lambda: store.update_session(TENANT, "s1", SessionPatch(set={"title": "x"})),
            lambda: store.read_entries(TENANT, "s1"),
            lambda: store.list_sessions(TENANT, SessionQuery()),
            lambda: store.put_record(TENANT, "ns", "k", 2),
            lambda: store.read_events(TENANT, "log"),
            lambda: store.append_events(TENANT, "log", [EventDraft(stream="s", kind="k")]),
        ]
        for call in down:
            with pytest.raises(StoreUnavailableError, match="cannot reach Redis"):
                await asyncio.wait_for(call(), 10)

        # No persistence on this server: a restart starts from an empty database. The
        # store must see exactly that (its cached head and its loaded scripts are gone),
        # never a half-known session.
        await private.start()
        with pytest.raises(NotFoundError):
            await store.append_entries(TENANT, "s1", [draft("e2")])
        with pytest.raises(NotFoundError):
            await store.get_session(TENANT, "s1")
        assert (await store.list_sessions(TENANT, SessionQuery())).items == []
        with pytest.raises(NotFoundError):
            await store.get_record(TENANT, "ns", "k")
        await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        result = await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2")])
        assert [(e.seq, e.parent_seq) for e in result.entries] == [(1, None), (2, 1)]
        assert (await store.put_record(TENANT, "ns", "k", 3)).version == 1
    finally:
        await store.close()


async def test_a_killed_server_with_an_append_only_file_keeps_appends_whole(
    tmp_path: Path,
) -> None:
    if shutil.which("redis-server") is None:
        skip_or_fail("redis-server is not installed")
    server = PrivateRedis(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    await server.start()
    store = await RedisStore.open(server.location, socket_timeout=2.0)
    acknowledged: list[int] = []
    enough = asyncio.Event()
    try:
        await store.create_session(SessionRecord(id="s1", tenant=TENANT))

        async def writer() -> None:
            for n in range(10_000):
                drafts = [draft(f"e{n}-{i}", n=n) for i in range(3)]
                await store.append_entries(
                    TENANT, "s1", drafts, patch=SessionPatch(add={"message_count": 3})
                )
                acknowledged.append(n)
                if len(acknowledged) == 50:
                    enough.set()

        task = asyncio.create_task(writer())
        await asyncio.wait_for(enough.wait(), 60)
        await server.stop(signal.SIGKILL)
        with pytest.raises(StoreUnavailableError):
            await asyncio.wait_for(task, 30)
        await server.start()

        entries = await store.read_entries(TENANT, "s1")
        session = await store.get_session(TENANT, "s1")
        batches = len(entries) // 3
        assert len(entries) == 3 * batches  # whole batches only
        assert batches in (len(acknowledged), len(acknowledged) + 1)  # + the one in flight
        assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
        assert [e.payload["n"] for e in entries] == [n for n in range(batches) for _ in range(3)]
        assert (session.last_seq, session.head_seq) == (len(entries), len(entries))
        assert session.message_count == len(entries)
        assert session.version == 1 + batches
        more = await store.append_entries(TENANT, "s1", [draft("after")])
        assert more.entries[0].seq == len(entries) + 1
    finally:
        await store.close()
        await server.stop()


# -- typed faults ---------------------------------------------------------------------------


async def test_a_read_only_replica_refuses_writes_with_a_typed_error(
    private: PrivateRedis, tmp_path: Path
) -> None:
    folder = tmp_path / "replica"
    folder.mkdir()
    replica = PrivateRedis(folder, "--replicaof", "127.0.0.1", str(private.port))
    await replica.start()
    store = await RedisStore.open(replica.location)
    try:
        with pytest.raises(StoreReadOnlyError, match="read-only replica"):
            await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        with pytest.raises(StoreReadOnlyError):
            await store.put_record(TENANT, "ns", "k", 1)
        with pytest.raises(StoreReadOnlyError):
            await store.append_events(TENANT, "log", [EventDraft(stream="s", kind="k")])
        assert await store.read_events(TENANT, "log") == []
    finally:
        await store.close()
        await replica.stop()


async def test_a_full_server_refuses_writes_with_a_typed_error_and_writes_nothing(
    private: PrivateRedis,
) -> None:
    store = await RedisStore.open(private.location)
    admin = Redis(port=private.port)
    try:
        await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        before = await store.append_entries(TENANT, "s1", [draft("e1")])
        await admin.config_set("maxmemory", "1")
        await admin.config_set("maxmemory-policy", "noeviction")
        with pytest.raises(StoreFullError, match="out of memory"):
            await store.append_entries(TENANT, "s1", [draft("e2"), draft("e3")])
        with pytest.raises(StoreFullError):
            await store.put_record(TENANT, "ns", "k", 1)
        await admin.config_set("maxmemory", "0")
        assert await store.get_session(TENANT, "s1") == before.session
        assert [e.id for e in await store.read_entries(TENANT, "s1")] == ["e1"]
    finally:
        await admin.aclose()
        await store.close()


async def test_credentials_work_and_never_show_in_the_url_or_errors(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        skip_or_fail("redis-server is not installed")
    server = PrivateRedis(tmp_path, "--requirepass", "s3cr3t-pw")
    await server.start()
    try:
        store = await open_store(f"redis://:s3cr3t-pw@127.0.0.1:{server.port}/0?prefix=app")
        try:
            assert "s3cr3t" not in store.url
            await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        finally:
            await store.close()
        with pytest.raises(StoreUnavailableError) as caught:
            await open_store(f"redis://:wrong-pw-123@127.0.0.1:{server.port}/0")
        assert "wrong-pw-123" not in str(caught.value)
        with pytest.raises(StoreUnavailableError) as caught:
            await open_store(f"redis://127.0.0.1:{server.port}/0")
        assert "s3cr3t" not in str(caught.value)
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("redis://127.0.0.1:6379/0?colour=red", InvalidInputError),
        ("redis://127.0.0.1:6379/0?prefix=a/b", InvalidInputError),
        ("redis://127.0.0.1:6379/0?socket_timeout=soon", InvalidInputError),
        ("redis://127.0.0.1:notaport/0", InvalidInputError),
        ("redis://127.0.0.1:6379/zero", InvalidInputError),
    ],
    ids=["unknown-option", "bad-prefix", "bad-timeout", "bad-port", "bad-db"],
)
async def test_bad_urls_are_refused(url: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        await open_store(url)


async def test_an_unreachable_server_fails_at_open() -> None:
    with pytest.raises(StoreUnavailableError, match="cannot reach Redis"):
        await open_store(f"redis://127.0.0.1:{free_port()}/0?socket_timeout=2")


# -- key layout and stored forms ------------------------------------------------------------


async def test_ids_with_colons_never_share_keys(store: RedisStore) -> None:
    pairs = [("a:b", "c"), ("a", "b:c"), ("a:b:c", "d"), ("a", "b:c:d")]
    for tenant, name in pairs:
        await store.create_session(SessionRecord(id=name, tenant=tenant, title=tenant + name))
        await store.append_entries(tenant, name, [draft("e1", owner=tenant)])
        await store.put_record(tenant, name, "k", tenant)
        await store.append_events(tenant, name, [EventDraft(stream="s", kind=tenant)])
    for tenant, name in pairs:
        assert (await store.get_session(tenant, name)).title == tenant + name
        assert [e.payload["owner"] for e in await store.read_entries(tenant, name)] == [tenant]
        assert (await store.get_record(tenant, name, "k")).value == tenant
        assert [e.kind for e in await store.read_events(tenant, name)] == [tenant]
        listed = {s.id for s in (await store.list_sessions(tenant, SessionQuery())).items}
        assert listed == {n for t, n in pairs if t == tenant}
    keys = [store.keys.head(t, n) for t, n in pairs]
    assert len(set(keys)) == len(keys)


async def test_a_corrupt_entry_is_reported_and_the_rest_still_served(
    store: RedisStore, prefix: str
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2"), draft("e3")])
    client = Redis.from_url(REDIS_URL)
    try:
        key = store.keys.entries(TENANT, "s1")
        [(member, _)] = await client.zrangebyscore(key, 2, 2, withscores=True)
        await client.zremrangebyscore(key, 2, 2)
        await client.zadd(key, {member.replace(b'{"text"', b"{not json"): 2})
    finally:
        await client.aclose()
    entries = await store.read_entries(TENANT, "s1")
    assert [(e.seq, e.kind) for e in entries] == [(1, "message"), (2, "corrupt"), (3, "message")]
    assert entries[1].id == "e2"
    assert "not json" in entries[1].payload["raw"]
    assert (await store.get_entry(TENANT, "s1", "e3")).payload == {"text": "e3"}


async def test_a_record_with_an_expiry_also_expires_in_redis_later(store: RedisStore) -> None:
    expires = datetime.now(UTC) + timedelta(hours=1)
    await store.put_record(TENANT, "ns", "k", 1, expires_at=expires)
    client = Redis.from_url(REDIS_URL)
    try:
        key = store.keys.record(TENANT, "ns", "k")
        at_ms = await client.pexpiretime(key)
        expected = int(expires.timestamp() * 1000) + 60_000
        assert abs(at_ms - expected) <= 1
        await store.put_record(TENANT, "ns", "k", 2)
        assert await client.pexpiretime(key) == -1  # no expiry any more
        await client.unlink(key)  # as if Redis expired it: the listing drops the index row
        assert await store.list_records(TENANT, "ns") == []
        assert await client.zcard(store.keys.record_index(TENANT, "ns")) == 0
    finally:
        await client.aclose()


# -- many writers through one handle (group commit) ------------------------------------------


async def test_concurrent_appends_through_one_handle_each_get_their_own_outcome(
    store: RedisStore,
) -> None:
    created = await store.create_session(SessionRecord(id="s1", tenant=TENANT))

    async def append(n: int) -> Any:
        if n % 4 == 1:
            return await store.append_entries(TENANT, "s1", [draft(f"e{n}", parent=10_000)])
        if n % 4 == 2:
            return await store.append_entries(
                TENANT, "s1", [draft(f"e{n}")], expected_version=created.version
            )
        return await store.append_entries(TENANT, "s1", [draft(f"e{n}"), draft(f"f{n}")])

    outcomes = await asyncio.gather(*(append(n) for n in range(40)), return_exceptions=True)
    for n, outcome in enumerate(outcomes):
        if n % 4 == 1:
            assert isinstance(outcome, InvalidInputError)
        elif n % 4 == 2:
            # Exactly one writer can have seen version 1 (or none if another landed first).
            assert isinstance(outcome, ConflictError) or not outcome.replayed
    wins = [o for o in outcomes if not isinstance(o, BaseException)]
    entries = await store.read_entries(TENANT, "s1")
    assert sorted(e.seq for w in wins for e in w.entries) == [e.seq for e in entries]
    assert [e.parent_seq for e in entries] == [None, *range(1, len(entries))]
    assert sum(isinstance(o, ConflictError) for o in outcomes) >= 9
    session = await store.get_session(TENANT, "s1")
    assert session.version == created.version + len(wins)
    assert max(w.session.version for w in wins) == session.version


async def test_a_replayed_append_inside_a_batch_is_recognised(store: RedisStore) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    same = [draft("x1"), draft("x2")]
    results = await asyncio.gather(*(store.append_entries(TENANT, "s1", same) for _ in range(6)))
    assert sum(not r.replayed for r in results) == 1
    assert all(r.entries == results[0].entries for r in results)
    assert [e.id for e in await store.read_entries(TENANT, "s1")] == ["x1", "x2"]


async def test_cancelled_appends_leave_whole_entries_and_a_matching_head(
    store: RedisStore,
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    tasks = [
        asyncio.create_task(store.append_entries(TENANT, "s1", [draft(f"e{n}"), draft(f"f{n}")]))
        for n in range(30)
    ]
    await asyncio.sleep(0)
    for task in tasks[1::3]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    entries = await store.read_entries(TENANT, "s1")
    session = await store.get_session(TENANT, "s1")
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    assert [e.id[1:] for e in entries[::2]] == [e.id[1:] for e in entries[1::2]]  # pairs
    assert session.last_seq == len(entries)
    done = [t for t in tasks if not t.cancelled()]
    assert 2 * len(done) <= len(entries) <= 2 * len(tasks)
    again = await store.append_entries(TENANT, "s1", [draft("last")])
    assert again.entries[0].seq == len(entries) + 1


# -- how scripts reach the server ----------------------------------------------------------


async def test_a_frozen_server_fails_a_write_after_the_socket_timeout_then_recovers(
    private: PrivateRedis,
) -> None:
    store = await RedisStore.open(private.location, socket_timeout=0.5)
    try:
        await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        await store.append_entries(TENANT, "s1", [draft("e1")])
        assert private.proc is not None
        private.proc.send_signal(signal.SIGSTOP)  # connections stay open; nothing answers
        try:
            with pytest.raises(StoreUnavailableError, match=r"no answer within 0\.5 s"):
                await asyncio.wait_for(store.append_entries(TENANT, "s1", [draft("e2")]), 10)
            task = asyncio.current_task()
            assert task is not None
            assert task.cancelling() == 0  # the timer's cancel was taken back
        finally:
            private.proc.send_signal(signal.SIGCONT)
        # The timed-out connection was closed (its late reply is never read as another's).
        again = await store.append_entries(TENANT, "s1", [draft("e3")])
        ids = [e.id for e in await store.read_entries(TENANT, "s1")]
        assert ids in (["e1", "e3"], ["e1", "e2", "e3"])
        assert again.session == await store.get_session(TENANT, "s1")
    finally:
        await store.close()


async def test_a_store_given_a_client_uses_that_client_and_leaves_it_open(prefix: str) -> None:
    client = Redis.from_url(REDIS_URL, decode_responses=True)
    store = RedisStore(client, prefix=prefix)
    try:
        await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        first = await store.append_entries(TENANT, "s1", [draft("e1")])
        second = await store.append_entries(TENANT, "s1", [draft("e2")])
        assert (first.entries[0].seq, second.entries[0].seq) == (1, 2)
        assert [e.id for e in await store.read_entries(TENANT, "s1")] == ["e1", "e2"]
        assert (await store.get_session(TENANT, "s1")).version == second.session.version
        await store.close()
        assert await client.ping()  # the caller's client stays open
        with pytest.raises(StoreUnavailableError, match="closed"):
            await store.get_session(TENANT, "s1")
    finally:
        await client.aclose()


def test_script_commands_are_packed_as_redis_py_packs_them() -> None:
    from redis.asyncio.connection import Connection

    from statekeeper.stores.redis.wire import pack

    args: list[Any] = ["EVALSHA", "ab", 2, "k/{t}/1", b"\x00\xff", -7, 10**20, 1.5, "é\n", b""]
    assert pack(args) == b"".join(Connection().pack_command(*args))
    for bad in (True, None, [1]):
        with pytest.raises(TypeError):
            pack(["EVALSHA", bad])


async def test_an_append_stores_the_live_fields_and_leaves_the_document(
    store: RedisStore, prefix: str
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT, metadata={"a": 1}))
    await store.append_entries(TENANT, "s1", [draft("e1")])
    patch = SessionPatch(set={"title": "t", "state": {"k": [1]}})
    updated = await store.update_session(TENANT, "s1", patch)
    client = Redis.from_url(REDIS_URL)
    key = f"{prefix}/{{{TENANT}}}/s/s1"
    try:
        doc, live = await client.hmget(key, "doc", "live")
        assert live is None  # an update writes the whole document
        assert SessionRecord.model_validate_json(doc) == updated
        last = await store.append_entries(
            TENANT, "s1", [draft("e2"), draft("e3")], patch=SessionPatch(add={"total_tokens": 5})
        )
        after, live = await client.hmget(key, "doc", "live")
    finally:
        await client.aclose()
    assert after == doc  # the append did not send the document again
    head = last.session
    assert json.loads(live) == [
        head.version,
        round(head.last_active.timestamp() * 1_000_000),
        3,
        3,
        head.message_count,
        5,
        head.fresh_tokens,
    ]
    assert (head.title, head.metadata, head.state) == ("t", {"a": 1}, {"k": [1]})
    other = await open_store(REDIS_URL, prefix=prefix)
    try:  # a fresh handle reads the document with the live fields over it
        assert await other.get_session(TENANT, "s1") == head
        assert (await other.list_sessions(TENANT, SessionQuery())).items == [head]
        again = await other.append_entries(TENANT, "s1", [draft("e4")])
        assert again.session.last_seq == 4
        assert (await store.get_session(TENANT, "s1")).title == "t"
    finally:
        await other.close()


@pytest.mark.parametrize("live", [b"[1,2]", b"not json", b'[1,2,3,4,5,6,"x"]', b"[1,2,3,4,5,6,-1]"])
async def test_damaged_live_fields_are_reported_and_the_session_can_be_deleted(
    store: RedisStore, prefix: str, live: bytes
) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=TENANT))
    await store.append_entries(TENANT, "s1", [draft("e1")])
    client = Redis.from_url(REDIS_URL)
    try:
        await client.hset(f"{prefix}/{{{TENANT}}}/s/s1", "live", live)
    finally:
        await client.aclose()
    other = await open_store(REDIS_URL, prefix=prefix)
    try:
        with pytest.raises(StoreCorruptError, match="s1"):
            await other.get_session(TENANT, "s1")
        page = await other.list_sessions(TENANT, SessionQuery())
        assert page.items == []
        assert [c.id for c in page.corrupt] == ["s1"]
        await other.delete_session(TENANT, "s1")
        with pytest.raises(NotFoundError):
            await other.get_session(TENANT, "s1")
    finally:
        await other.close()


async def test_more_commands_in_flight_than_connections_wait_instead_of_failing(
    store: RedisStore,
) -> None:
    # 300 at once through one store (a server under load): the pool holds 100
    # connections, and the rest wait for one ("Too many connections" before).
    from statekeeper.stores.redis.base import MAX_CONNECTIONS

    made = await store.create_session(SessionRecord(tenant="t", id="s-many"))
    assert made.version >= 0
    reads = await asyncio.gather(
        *(store.get_session("t", "s-many") for _ in range(3 * MAX_CONNECTIONS))
    )
    assert {r.id for r in reads} == {"s-many"}
