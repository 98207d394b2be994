"""PostgreSQL coordination with real subprocesses against the test server (skipped
without one, failed instead under ``CI=true``): advisory locks across processes and after
a process dies, and LISTEN / NOTIFY feeds (another process's appends, schemas kept apart,
reconnection). What every implementation must do is in ``test_coordination_contract.py``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from services import POSTGRES_URL, drop_postgres_schema, require

from statekeeper.runtime import EventBus, EventNotice, SessionLockTimeoutError, feed_bus
from statekeeper.stores import open_store
from statekeeper.stores.postgres.coordination import PgEventFeed, PgSessionLocks

pytest.importorskip("psycopg")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


@pytest.fixture
async def locks() -> AsyncIterator[PgSessionLocks]:
    await require(POSTGRES_URL)
    async with PgSessionLocks.from_url(POSTGRES_URL, namespace=f"t{uuid.uuid4().hex}") as made:
        yield made


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    await require(POSTGRES_URL)
    name = f"sktest_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        await drop_postgres_schema(name)


def spawn(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def finish(proc: subprocess.Popen[bytes]) -> str:
    """Wait for the process; its output (fails the test if it failed)."""
    try:
        out, err = await asyncio.to_thread(proc.communicate, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


# -- locks ---------------------------------------------------------------------------------

COUNTER = """
    import asyncio, sys, time
    from pathlib import Path
    from statekeeper.stores.postgres.coordination import PgSessionLocks

    async def main(url, namespace, folder, rounds):
        counter, log = Path(folder, "counter"), Path(folder, "log")
        async with PgSessionLocks.from_url(url, namespace=namespace) as locks:
            for _ in range(rounds):
                async with locks.hold("t", "s1", wait=60):
                    start = time.time()
                    value = int(counter.read_text())  # read, pause, write: racy unless
                    await asyncio.sleep(0.003)        # the lock keeps others out
                    counter.write_text(str(value + 1))
                    with log.open("a") as f:
                        f.write(f"{start} {time.time()}\\n")

    url, namespace, folder, rounds = sys.argv[1:]
    asyncio.run(main(url, namespace, folder, int(rounds)))
"""


@pytest.mark.slow
async def test_processes_holding_one_session_lock_never_overlap(
    locks: PgSessionLocks, tmp_path: Path
) -> None:
    (tmp_path / "counter").write_text("0")
    workers, rounds = 4, 10
    procs = [
        spawn(COUNTER, POSTGRES_URL, locks.namespace, str(tmp_path), str(rounds))
        for _ in range(workers)
    ]
    for proc in procs:
        await finish(proc)
    assert int((tmp_path / "counter").read_text()) == workers * rounds
    spans = sorted(
        tuple(map(float, line.split())) for line in (tmp_path / "log").read_text().splitlines()
    )
    assert len(spans) == workers * rounds
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start + 0.001  # one holder at a time (clock jitter aside)


HOLDER = """
    import asyncio, sys
    from statekeeper.stores.postgres.coordination import PgSessionLocks

    async def main(url, namespace):
        locks = PgSessionLocks.from_url(url, namespace=namespace)
        async with locks.hold("t", "s1"):
            print("held", flush=True)
            await asyncio.sleep(120)

    asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow
async def test_a_lock_held_by_a_process_that_dies_is_released(locks: PgSessionLocks) -> None:
    proc = spawn(HOLDER, POSTGRES_URL, locks.namespace)
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.strip() == b"held", proc.stderr.read() if proc.stderr else b""
        with pytest.raises(SessionLockTimeoutError):
            async with locks.hold("t", "s1", wait=0):
                pass
        with pytest.raises(SessionLockTimeoutError):
            async with locks.hold("t", "s1", wait=0.3):
                pass
        async with locks.hold("t", "s2", wait=0):  # other sessions are free
            pass
        proc.kill()  # no clean-up code runs: the server sees the connection drop
        started = time.monotonic()
        async with locks.hold("t", "s1", wait=20) as held:
            await held.check()
        assert time.monotonic() - started < 20
    finally:
        proc.kill()
        await asyncio.to_thread(proc.wait)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_lock_keys_are_stable_and_ids_are_checked() -> None:
    locks = PgSessionLocks("", namespace="ns")
    assert locks.key("t", "s1") == PgSessionLocks("", namespace="ns").key("t", "s1")
    assert locks.key("t", "s1") != locks.key("t", "s2")
    assert locks.key("t", "s1") != PgSessionLocks("", namespace="other").key("t", "s1")
    assert -(2**63) <= locks.key("t", "s1") < 2**63
    from statekeeper.errors import InvalidIdError

    with pytest.raises(InvalidIdError):
        locks.key("t", "../x")


# -- event wake-ups ------------------------------------------------------------------------

APPENDER = """
    import asyncio, sys
    from statekeeper.stores import open_store
    from statekeeper.stores.base import EventDraft

    async def main(url, schema, channel, batches):
        store = await open_store(url, schema=schema, notify_channel=channel)
        try:
            for spec in batches.split(","):
                log_id, count = spec.split(":")
                events = [EventDraft(stream="tool", kind="result", payload={"i": i})
                          for i in range(int(count))]
                await store.append_events("t", log_id, events)
        finally:
            await store.close()

    asyncio.run(main(*sys.argv[1:]))
"""


async def test_appends_of_another_process_are_noticed_for_the_feeds_schema_only(
    schema: str,
) -> None:
    channel = f"sk_{uuid.uuid4().hex[:16]}"
    other = f"{schema}_b"
    for name in (schema, other):  # the schemas exist before the writers start
        await (await open_store(POSTGRES_URL, schema=name)).close()
    feed = PgEventFeed.from_url(POSTGRES_URL, channel=channel, schema=schema)
    try:
        async with contextlib.aclosing(feed.notices("t")) as notices:
            assert (await asyncio.wait_for(anext(notices), 15)).resync
            await finish(spawn(APPENDER, POSTGRES_URL, other, channel, "run-1:5"))
            await finish(spawn(APPENDER, POSTGRES_URL, schema, channel, "run-1:3,run-2:1"))
            got = [await asyncio.wait_for(anext(notices), 15) for _ in range(2)]
    finally:
        await drop_postgres_schema(other)
    assert [(n.tenant, n.log_id, n.last_seq) for n in got] == [("t", "run-1", 3), ("t", "run-2", 1)]


async def test_a_bus_subscriber_wakes_for_another_process_events(schema: str) -> None:
    channel = f"sk_{uuid.uuid4().hex[:16]}"
    async with open_store(POSTGRES_URL, schema=schema) as store:
        bus = EventBus(store, "t")
        feed = PgEventFeed.from_url(POSTGRES_URL, channel=channel, schema=schema)
        async with feed_bus(bus, feed), bus.subscribe("run-1", from_seq=0) as sub:
            writer = spawn(APPENDER, POSTGRES_URL, schema, channel, "run-1:2")
            try:
                got = [await asyncio.wait_for(anext(sub), 15) for _ in range(2)]
            finally:
                await finish(writer)
        assert [(e.run_id, e.seq, e.payload) for e in got] == [
            ("run-1", 1, {"i": 0}),
            ("run-1", 2, {"i": 1}),
        ]


async def test_a_feed_reconnects_and_says_it_may_have_missed_some(schema: str) -> None:
    import psycopg

    channel = f"sk_{uuid.uuid4().hex[:16]}"
    await (await open_store(POSTGRES_URL, schema=schema)).close()
    feed = PgEventFeed.from_url(POSTGRES_URL, channel=channel, schema=schema, retry_every=0.1)
    async with contextlib.aclosing(feed.notices("t")) as notices:
        assert (await asyncio.wait_for(anext(notices), 15)).resync
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
                (f'LISTEN "{channel}"',),
            )
        notice: EventNotice = await asyncio.wait_for(anext(notices), 15)
        assert notice.resync  # listening again: what came meanwhile may be lost
        await finish(spawn(APPENDER, POSTGRES_URL, schema, channel, "run-9:2"))
        notice = await asyncio.wait_for(anext(notices), 15)
    assert (notice.log_id, notice.last_seq) == ("run-9", 2)


async def test_a_feed_that_cannot_connect_fails_at_once() -> None:
    from statekeeper.errors import StoreUnavailableError

    feed = PgEventFeed.from_url("postgresql://nobody@127.0.0.1:1/none", connect_timeout=2)
    with pytest.raises(StoreUnavailableError):
        await anext(feed.notices("t"))
