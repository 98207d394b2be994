"""SQLite faults: newer schemas, read-only and full disks, corrupt rows, bad URLs, crashes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import (
    InvalidInputError,
    SchemaVersionError,
    StoreCorruptError,
    StoreFullError,
    StoreReadOnlyError,
)
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store
from statekeeper.stores.sqlite import SQLiteStore
from statekeeper.stores.sqlite.schema import SCHEMA_VERSION


async def make_session(path: Path, texts: list[str]) -> str:
    store = await open_store(f"sqlite:///{path}")
    try:
        chat = await SessionManager(store, "alice").create(
            session_id="s1", messages=[Message.user(t) for t in texts]
        )
        return chat.id
    finally:
        await store.close()


async def read_texts(path: Path, session_id: str = "s1") -> list[str]:
    store = await open_store(f"sqlite:///{path}")
    try:
        chat = await SessionManager(store, "alice").get(session_id)
        return [m.text for m in await chat.messages()]
    finally:
        await store.close()


async def test_newer_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    await make_session(db, ["a"])
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaVersionError, match="upgrade statekeeper"):
        await open_store(f"sqlite:///{db}")
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 1
    conn.close()


async def test_read_only_store_refuses_writes_and_serves_reads(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    await make_session(db, ["a", "b"])
    store = await open_store(f"sqlite:///{db}?mode=ro")
    try:
        chat = await SessionManager(store, "alice").get("s1")
        with pytest.raises(StoreReadOnlyError):
            await chat.append(Message.user("c"))
        assert [m.text for m in await chat.messages()] == ["a", "b"]
    finally:
        await store.close()


async def test_full_disk_fails_the_write_and_keeps_the_data(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    await make_session(db, ["a"])
    store = await SQLiteStore.open(db)
    try:
        chat = await SessionManager(store, "alice").get("s1")
        assert store._conn is not None
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count={pages}")

        async def fill() -> None:
            for _ in range(50):
                await chat.append(Message.user("x" * 20_000), strict=False)

        with pytest.raises(StoreFullError, match="full"):
            await fill()
        store._conn.execute("PRAGMA max_page_count=1073741823")
        await chat.refresh()
        texts = [m.text for m in await chat.messages()]
        assert texts[0] == "a"
        assert len(texts) == chat.record.message_count
        await chat.append(Message.user("after"))
    finally:
        await store.close()


async def test_corrupt_row_is_reported_and_the_rest_still_served(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    await make_session(db, ["a", "b", "c"])
    conn = sqlite3.connect(db)
    conn.execute("UPDATE entries SET payload='{not json' WHERE (rid & 4294967295)=2")
    conn.commit()
    conn.close()
    store = await open_store(f"sqlite:///{db}")
    try:
        view = await (await SessionManager(store, "alice").get("s1")).view()
        assert [m.text for m in view.messages] == ["a", "c"]
        assert [e.seq for e in view.corrupt] == [2]
        assert "not json" in view.corrupt[0].payload["raw"]
    finally:
        await store.close()


@pytest.mark.parametrize(
    "payload",
    [
        '{"role": ["user"], "content": "b"}',
        '{"role": "user", "content": "b", "metadata": null}',
        '{"role": "user", "content": [{"type": "tool_call", "id": "", "name": "f"}]}',
        '{"role": "user", "content": "b", "tokens": NaN}',
        '["role", "user"]',
    ],
)
async def test_a_row_that_is_json_but_not_a_message_is_reported(
    tmp_path: Path, payload: str
) -> None:
    db = tmp_path / "state.db"
    await make_session(db, ["a", "b", "c"])
    conn = sqlite3.connect(db)
    conn.execute("UPDATE entries SET payload=? WHERE (rid & 4294967295)=2", (payload,))
    conn.commit()
    conn.close()
    store = await open_store(f"sqlite:///{db}")
    try:
        view = await (await SessionManager(store, "alice").get("s1")).view()
        assert [m.text for m in view.messages] == ["a", "c"]
        assert [e.seq for e in view.corrupt] == [2]
    finally:
        await store.close()


async def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreCorruptError):
        await open_store(f"sqlite:///{db}")
    assert db.read_bytes() == b"this is not sqlite" * 100


@pytest.mark.parametrize(
    "url",
    [
        "nosuch://x",
        "sqlite://",
        "sqlite:///x.db?durability=sometimes",
        "sqlite:///x.db?busy_timeout=soon",
        "sqlite:///x.db?colour=blue",
        "memory://?max_payload_bytes=big",
    ],
)
async def test_bad_urls_are_explained(url: str, tmp_path: Path) -> None:
    os.chdir(tmp_path)
    with pytest.raises(InvalidInputError):
        await open_store(url)
    assert not (tmp_path / "x.db").exists()


def run_python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


FIRST_WRITER = """
    import asyncio, sys
    from statekeeper.core.messages import Message
    from statekeeper.sessions import SessionManager
    from statekeeper.stores import open_store

    async def main(path, name):
        store = await open_store(f"sqlite:///{path}")
        try:
            chat = await SessionManager(store, "alice").create(session_id=name)
            for i in range(30):
                await chat.append(Message.user(f"{name}-{i}"))
        finally:
            await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.slow
async def test_concurrent_first_writers_never_see_database_is_locked(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    procs = [run_python(FIRST_WRITER, str(db), f"w{i}") for i in range(6)]
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert "locked" not in err
    for i in range(6):
        assert await read_texts(db, f"w{i}") == [f"w{i}-{n}" for n in range(30)]


CRASHER = """
    import asyncio, sys
    from statekeeper.core.messages import Message
    from statekeeper.sessions import SessionManager
    from statekeeper.stores import open_store

    async def main(path):
        store = await open_store(f"sqlite:///{path}")
        chat = await SessionManager(store, "alice").get("s1")
        i = 0
        while True:
            await chat.append(Message.user(f"m{i}"), Message.assistant(f"r{i}"))
            if i == 20:
                print("ready", flush=True)
            i += 1

    asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.slow
async def test_sigkill_mid_append_leaves_whole_entries_only(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    await make_session(db, [])
    proc = run_python(CRASHER, str(db))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)

    texts = await read_texts(db)
    assert len(texts) >= 42
    assert len(texts) % 2 == 0  # pairs are atomic
    assert texts == [t for i in range(len(texts) // 2) for t in (f"m{i}", f"r{i}")]
    store = await open_store(f"sqlite:///{db}")
    try:
        chat = await SessionManager(store, "alice").get("s1")
        assert chat.record.message_count == len(texts) == chat.record.last_seq
    finally:
        await store.close()
