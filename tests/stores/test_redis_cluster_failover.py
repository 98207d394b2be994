"""Failover under load on Redis Cluster: writers append to sessions whose slots live on
one master while the test kills that master, again and again (``STATEKEEPER_FAILOVERS``
times, default 2; ``make thorough`` runs 20). Each writer retries the same append (same
entry ids) after `StoreUnavailableError` until it returns: a returned append is
acknowledged. Read back afterwards, no entry is there twice and each session's entries
form one chain, seqs 1..n; with ``wait_replicas=1`` every acknowledged append is there.
Without it (the default) a write acknowledged by a master that dies before its replica
copied it is lost (a whole session, when its creation is: the writer creates it again):
the test counts and prints those (``pytest -s``), asserting no bound. Failovers here
follow each other closely (the next kill comes once the cluster is healthy again and
every writer got `PROGRESS` more appends through), so a replica may have resynced just
before: its master streams to it only after its first ``REPLCONF ACK`` (sent once a
second), and a kill then loses up to a second of writes.

Each test runs its own cluster on its own ports (7500s, 7510s) and tmp dir: never the
shared one (7101-7106), which other tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from redis_cluster import ClusterHandle, require_cluster_tools, start_cluster
from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    NotFoundError,
    StoreUnavailableError,
)
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import EntryDraft, SessionRecord
from statekeeper.stores.redis.store import RedisStore

pytestmark = pytest.mark.slow

FAILOVERS = int(os.environ.get("STATEKEEPER_FAILOVERS", "2"))
WRITERS = 4
PROGRESS = 5
"""Appends each writer has acknowledged after a failover before the next one."""
TENANT = "acme"
CALL_SECONDS = 15.0
"""A single call longer than this is hung (socket_timeout is 5 s): the test fails."""
RETRY_SECONDS = 45.0
"""How long a writer repeats one append before the test fails."""
PROGRESS_SECONDS = 45.0
"""How long the writers may take to make `PROGRESS` after a failover."""


@dataclass
class Writer:
    """One writer's session, what it got acknowledged (in order), and its retries."""

    session_id: str
    lossy: bool
    """Whether the store may lose acknowledged writes (no WAIT): then a session whose
    creation was lost is created again, and the writer goes on."""
    acked: list[str] = field(default_factory=list)
    retries: int = 0
    recreated: int = 0


@dataclass(frozen=True)
class Outcome:
    """What a run measured."""

    acked: int
    lost: int
    duplicates: int
    retries: int
    sessions_lost: int
    seconds: float


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClusterHandle]:
    require_cluster_tools()
    handle = start_cluster(request.param, tmp_path / "cluster")
    try:
        yield handle
    finally:
        handle.stop()


async def _append_until_acknowledged(store: Store, writer: Writer, n: int) -> None:
    """Append entry ``n``, repeating the same draft (same id, same content) until the
    store acknowledges it."""
    draft = EntryDraft(id=f"{writer.session_id}-e{n:05d}", kind="message", payload={"n": n})
    deadline = time.monotonic() + RETRY_SECONDS
    while True:
        try:
            async with asyncio.timeout(CALL_SECONDS):
                await store.append_entries(TENANT, writer.session_id, [draft])
        except NotFoundError:
            if not writer.lossy:
                raise
            # The failover lost the session itself: create it again, then append.
            with contextlib.suppress(StoreUnavailableError, AlreadyExistsError):
                async with asyncio.timeout(CALL_SECONDS):
                    await store.create_session(SessionRecord(id=writer.session_id, tenant=TENANT))
                writer.recreated += 1
        except (StoreUnavailableError, ConflictError) as exc:
            writer.retries += 1
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{draft.id} not acknowledged within {RETRY_SECONDS} s: {exc}"
                ) from exc
            await asyncio.sleep(0.01)  # a pause between retries, not a wait for a state
        else:
            writer.acked.append(draft.id)
            return


async def _write(store: Store, writer: Writer, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        await _append_until_acknowledged(store, writer, n)


async def _until(what: str, check: Callable[[], bool], tasks: list[asyncio.Task[None]]) -> None:
    """Poll ``check``; a writer that failed fails the test at once."""
    deadline = time.monotonic() + PROGRESS_SECONDS
    while not check():
        for task in tasks:
            if task.done():
                task.result()  # its error, or:
                raise AssertionError(f"a writer stopped while waiting for {what}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {PROGRESS_SECONDS} s waiting for {what}")
        await asyncio.sleep(0.02)


async def _progress(writers: list[Writer], tasks: list[asyncio.Task[None]], what: str) -> None:
    marks = [len(writer.acked) + PROGRESS for writer in writers]
    await _until(
        what,
        lambda: all(len(w.acked) >= mark for w, mark in zip(writers, marks, strict=True)),
        tasks,
    )


async def _sessions_on_one_master(
    cluster: ClusterHandle, store: RedisStore
) -> tuple[int, list[str]]:
    """`WRITERS` session ids whose head slots are on one master, and its port."""
    ids: list[str] = []
    target = None
    for i in range(1000):
        session_id = f"w{i}"
        port = await asyncio.to_thread(cluster.master_for_key, store.keys.head(TENANT, session_id))
        target = port if target is None else target
        if port == target:
            ids.append(session_id)
            if len(ids) == WRITERS:
                return target, ids
    raise AssertionError("no master owns the slots of enough sessions")


async def _failovers(cluster: ClusterHandle, url: str, *, lossy: bool) -> Outcome:
    """Run the writers through `FAILOVERS` kills of their master; read everything back."""
    started = time.monotonic()
    store = await open_store(url)
    assert isinstance(store, RedisStore)
    try:
        master, ids = await _sessions_on_one_master(cluster, store)
        for session_id in ids:
            await store.create_session(SessionRecord(id=session_id, tenant=TENANT))
        writers = [Writer(session_id, lossy) for session_id in ids]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_write(store, writer, stop)) for writer in writers]
        try:
            await _progress(writers, tasks, "the first appends")
            for round_ in range(1, FAILOVERS + 1):
                for session_id in ids:  # still together: the replica took every slot
                    head = store.keys.head(TENANT, session_id)
                    assert await asyncio.to_thread(cluster.master_for_key, head) == master
                master = await asyncio.to_thread(cluster.failover_by_kill, master)
                await _progress(writers, tasks, f"appends after failover {round_}")
        finally:
            stop.set()
            done, _ = await asyncio.wait(tasks, timeout=RETRY_SECONDS + CALL_SECONDS)
            for task in tasks:
                if task not in done:
                    task.cancel()
            for task in tasks:
                if task in done:
                    task.result()
        assert len(done) == len(tasks), "a writer did not stop"
    finally:
        await store.close()

    lost = duplicates = 0
    async with open_store(url) as fresh:  # a new handle: nothing cached
        for writer in writers:
            entries = await fresh.read_entries(TENANT, writer.session_id)
            stored = [entry.id for entry in entries]
            duplicates += len(stored) - len(set(stored))
            lost += len(set(writer.acked) - set(stored))
            assert set(stored) <= set(writer.acked), "an entry no writer wrote"
            assert stored == sorted(stored), "entries out of the order they were written"
            assert [entry.seq for entry in entries] == list(range(1, len(entries) + 1))
            assert [entry.parent_seq for entry in entries] == [None] + [
                entry.seq for entry in entries[:-1]
            ], "a broken parent chain"
            session = await fresh.get_session(TENANT, writer.session_id)
            assert (session.head_seq, session.last_seq) == (len(entries), len(entries))
    return Outcome(
        acked=sum(len(writer.acked) for writer in writers),
        lost=lost,
        duplicates=duplicates,
        retries=sum(writer.retries for writer in writers),
        sessions_lost=sum(writer.recreated for writer in writers),
        seconds=time.monotonic() - started,
    )


def _report(mode: str, outcome: Outcome) -> str:
    return (
        f"failover ({mode}): {outcome.lost} of {outcome.acked} acknowledged appends lost "
        f"over {FAILOVERS} failovers, {outcome.duplicates} duplicated, "
        f"{outcome.sessions_lost} sessions lost whole (created again), "
        f"{outcome.retries} retries, {outcome.seconds:.1f} s"
    )


@pytest.mark.parametrize("cluster", [7500], indirect=True)
async def test_waiting_for_a_replica_loses_no_acknowledged_append(
    cluster: ClusterHandle, record_property: Callable[[str, object], None]
) -> None:
    async with asyncio.timeout(60 + 20 * FAILOVERS):
        outcome = await _failovers(cluster, f"{cluster.url}?prefix=fo&wait_replicas=1", lossy=False)
    print(_report("wait_replicas=1", outcome))
    record_property("acknowledged", outcome.acked)
    record_property("lost", outcome.lost)
    assert outcome.acked >= WRITERS * PROGRESS * (FAILOVERS + 1)
    assert outcome.retries > 0, "no append met a failover: the test tested nothing"
    assert (outcome.lost, outcome.duplicates, outcome.sessions_lost) == (0, 0, 0)


@pytest.mark.parametrize("cluster", [7510], indirect=True)
async def test_by_default_failovers_may_lose_acknowledged_appends_but_never_duplicate(
    cluster: ClusterHandle, record_property: Callable[[str, object], None]
) -> None:
    async with asyncio.timeout(60 + 20 * FAILOVERS):
        outcome = await _failovers(cluster, f"{cluster.url}?prefix=fo", lossy=True)
    print(_report("default, no WAIT", outcome))
    record_property("acknowledged", outcome.acked)
    record_property("lost", outcome.lost)
    assert outcome.acked >= WRITERS * PROGRESS * (FAILOVERS + 1)
    assert outcome.retries > 0, "no append met a failover: the test tested nothing"
    assert outcome.duplicates == 0


@pytest.mark.parametrize("cluster", [7520], indirect=True)
async def test_a_replay_is_not_acknowledged_before_a_replica_holds_it(
    cluster: ClusterHandle,
) -> None:
    # The first call's write reaches its master but not the (frozen) replica: its WAIT
    # fails. Repeating the call is answered as a replay of what is stored, which writes
    # nothing: it must not be acknowledged either until a replica holds that entry.
    async with open_store(f"{cluster.url}?prefix=rp&wait_replicas=1&wait_timeout=0.5") as store:
        assert isinstance(store, RedisStore)
        await store.create_session(SessionRecord(id="s1", tenant=TENANT))
        master = cluster.master_for_key(store.keys.head(TENANT, "s1"))
        master_id = next(n.id for n in cluster.nodes() if n.port == master)
        replica = next(n.port for n in cluster.nodes() if n.master_id == master_id)
        with cluster.client(replica) as client:
            replica_pid = int(client.info("server")["process_id"])
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            draft = EntryDraft(id="x1", kind="message", payload={"n": 1})
            for _ in range(2):  # the call, then the same call again
                with pytest.raises(StoreUnavailableError, match="0 of 1 replica"):
                    await store.append_entries(TENANT, "s1", [draft])
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        replayed = await store.append_entries(TENANT, "s1", [draft])  # the replica is back
        assert replayed.replayed
        assert [e.id for e in await store.read_entries(TENANT, "s1")] == ["x1"]
