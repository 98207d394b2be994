"""One store object from any thread and any event loop (`statekeeper.loops`).

The shapes users run: a store opened in one ``asyncio.run`` and used in the next ones
and from threads that each run their own loop, while the loop that opened it is blocked
or closed; a process that leaves a PostgreSQL store unclosed; the hand-over itself when
its caller is cancelled or its caller's loop closes. Scripts run in real subprocesses,
each with a deadline: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from statekeeper.errors import StatekeeperError, StoreUnavailableError
from statekeeper.loops import background_loop, hand_off, run_blocking
from statekeeper.testing.services import require_service

PG = os.environ.get("STATEKEEPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("STATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DEADLINE = 60  # seconds a script may take; the work itself takes about one


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _url(kind: str, tmp_path: Path) -> str:
    unique = uuid.uuid4().hex[:10]
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    if kind == "sqlite-process":
        return f"sqlite:///{tmp_path / 'state.db'}?durability=process"
    if kind == "files":
        return f"files://{tmp_path / 'files'}"
    if kind == "postgres":
        if not _reachable("127.0.0.1", 5432):
            require_service("postgres", "no server at 127.0.0.1:5432")
        return f"{PG}?schema=sk_loops"
    if not _reachable("127.0.0.1", 6379):
        require_service("redis", "no server at 127.0.0.1:6379")
    return f"{REDIS}?prefix=loops{unique}"


BACKENDS = ["memory", "sqlite", "sqlite-process", "files", "postgres", "redis"]


def _run_script(body: str, *args: str) -> str:
    script = textwrap.dedent(body)
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the script hung (no exit within {DEADLINE}s): {exc.stderr!r}")
    assert done.returncode == 0, done.stderr
    return done.stdout


# The store is opened in one asyncio.run, then used from a second, from four threads
# that each run asyncio.run while the main thread waits for them, and from a fourth.
_LOOP_AFTER_LOOP = """
    import asyncio, sys, threading, uuid
    from statekeeper import open_store
    from statekeeper.stores.base import EntryDraft, SessionRecord

    url, sid = sys.argv[1], "s" + uuid.uuid4().hex[:8]

    def drafts(i):
        return [EntryDraft(id=f"e{i}-{k}", kind="message", payload={"i": i}) for k in range(3)]

    async def first():
        store = await open_store(url)
        await store.create_session(SessionRecord(tenant="t", id=sid))
        await store.append_entries("t", sid, drafts(0))
        return store

    store = asyncio.run(first())
    asyncio.run(store.append_entries("t", sid, drafts(1)))
    threads = [
        threading.Thread(target=lambda i=i: asyncio.run(store.append_entries("t", sid, drafts(i))))
        for i in range(10, 14)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    asyncio.run(store.append_entries("t", sid, drafts(2)))

    async def last():
        entries = await store.read_entries("t", sid)
        await store.close()
        return entries

    entries = asyncio.run(last())
    print(" ".join(e.id for e in entries))
    print(" ".join(str(e.seq) for e in entries))
"""


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_store_serves_loop_after_loop_and_threads(kind: str, tmp_path: Path) -> None:
    ids, seqs = _run_script(_LOOP_AFTER_LOOP, _url(kind, tmp_path)).splitlines()
    stored = ids.split()
    assert sorted(stored) == sorted(
        f"e{i}-{k}" for i in (0, 1, 2, 10, 11, 12, 13) for k in range(3)
    )
    assert [int(s) for s in seqs.split()] == list(range(1, 22))
    for i in (0, 1, 2, 10, 11, 12, 13):  # each batch stored whole and together
        at = stored.index(f"e{i}-0")
        assert stored[at : at + 3] == [f"e{i}-0", f"e{i}-1", f"e{i}-2"]


# The loop that opened the store is blocked (it waits for the threads synchronously),
# as in the OpenAI Agents SDK's own concurrent-access test; each thread runs a loop of its
# own and closes it.
_BLOCKED_HOME = """
    import asyncio, concurrent.futures, sys, uuid
    from statekeeper import open_store
    from statekeeper.stores.base import EntryDraft, SessionRecord

    url, sid = sys.argv[1], "s" + uuid.uuid4().hex[:8]

    async def main():
        store = await open_store(url)
        await store.create_session(SessionRecord(tenant="t", id=sid))

        def add(i):
            loop = asyncio.new_event_loop()
            draft = EntryDraft(id=f"e{i}", kind="message", payload={"i": i})
            loop.run_until_complete(store.append_entries("t", sid, [draft]))
            loop.close()

        with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
            list(pool.map(add, range(20)))
        entries = await store.read_entries("t", sid)
        await store.close()
        print(len(entries), len({e.id for e in entries}))

    asyncio.run(main())
"""


@pytest.mark.parametrize("kind", BACKENDS)
def test_threads_write_while_the_home_loop_is_blocked(kind: str, tmp_path: Path) -> None:
    assert _run_script(_BLOCKED_HOME, _url(kind, tmp_path)).split() == ["20", "20"]


# Writes under way, some cancelled, and asyncio.run returns without closing the store.
_LEFT_OPEN = """
    import asyncio, random, sys, uuid
    from statekeeper import open_store
    from statekeeper.stores.base import EntryDraft, SessionRecord

    url, rnd = sys.argv[1], random.Random(int(sys.argv[2]))

    async def main():
        store = await open_store(url)
        sids = ["s" + uuid.uuid4().hex[:8] for _ in range(3)]
        for sid in sids:
            await store.create_session(SessionRecord(tenant="t", id=sid))
        tasks = [
            asyncio.create_task(store.append_entries("t", rnd.choice(sids), [
                EntryDraft(id=f"e{i}", kind="message", payload={"i": i})]))
            for i in range(60)
        ]
        tasks += [asyncio.create_task(store.read_entries("t", rnd.choice(sids))) for _ in range(20)]
        await asyncio.sleep(rnd.random() * 0.02)
        for task in rnd.sample(tasks, 30):
            task.cancel()

    asyncio.run(main())
    print("exited")
"""


@pytest.mark.parametrize("seed", [4, 5, 6, 7])
def test_an_unclosed_postgres_store_lets_the_process_exit(seed: int, tmp_path: Path) -> None:
    # Before the fix, most seeds hung forever in asyncio.run's final task cancellation: a
    # psycopg_pool worker cancelled while connecting swallows the cancellation.
    url = _url("postgres", tmp_path).replace("schema=", "max_size=3&schema=")
    assert _run_script(_LEFT_OPEN, url, str(seed)).strip() == "exited"


# -- the hand-over ------------------------------------------------------------------------


def test_hand_off_runs_on_the_target_loop() -> None:
    async def where() -> threading.Thread:
        return threading.current_thread()

    async def main() -> threading.Thread:
        return await hand_off(where(), background_loop())

    assert asyncio.run(main()).name == "statekeeper-loop"


def test_a_cancelled_caller_waits_until_the_call_has_ended() -> None:
    ended = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.05)  # cleanup that must finish before the caller returns
            ended.set()

    async def main() -> None:
        call = asyncio.ensure_future(hand_off(slow(), background_loop()))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert ended.is_set()

    asyncio.run(main())


def test_a_call_finishes_after_its_callers_loop_closed() -> None:
    finished = threading.Event()
    release = threading.Event()

    async def write() -> None:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
        finished.set()

    loop = asyncio.new_event_loop()
    task = loop.create_task(hand_off(write(), background_loop()))
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()  # the caller's loop goes away with the call under way
    release.set()
    assert finished.wait(30)
    assert not task.done()  # nobody was told: the loop had closed


def test_a_closed_target_loop_is_a_typed_error() -> None:
    target = asyncio.new_event_loop()
    target.close()

    async def nothing() -> None:
        return None

    async def main() -> None:
        with pytest.raises(StoreUnavailableError, match="has closed"):
            await hand_off(nothing(), target)

    asyncio.run(main())


def test_run_blocking_refuses_inside_a_running_loop() -> None:
    async def nothing() -> int:
        return 1

    async def main() -> None:
        with pytest.raises(StatekeeperError, match="running event loop"):
            run_blocking(nothing())

    asyncio.run(main())
    assert run_blocking(nothing()) == 1


# The loops are left open on purpose: their sockets are reported when collected.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_loop_left_open_by_an_ended_thread_takes_its_engine_with_it() -> None:
    import gc

    from statekeeper.stores.base import EntryDraft, SessionRecord
    from statekeeper.stores.memory import MemoryStore

    store = MemoryStore()
    asyncio.run(store.create_session(SessionRecord(tenant="t", id="s")))

    def append_and_leave(i: int) -> None:
        loop = asyncio.new_event_loop()  # never closed: the thread just ends
        draft = EntryDraft(id=f"e{i}", kind="message", payload={"i": i})
        loop.run_until_complete(store.append_entries("t", "s", [draft]))

    threads = [threading.Thread(target=append_and_leave, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    gc.collect()
    assert MemoryStore._engine.items(store) == []  # one engine per loop, none kept
    assert len(asyncio.run(store.read_entries("t", "s"))) == 20
