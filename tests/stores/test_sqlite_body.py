"""A message's text in a column of its own (SQLite schema version 5), on real files."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from statekeeper.core.messages import Message
from statekeeper.sessions import SessionManager
from statekeeper.sessions.view import message_draft
from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionRecord
from statekeeper.stores.sqlite.schema import MIGRATIONS, SCHEMA_VERSION

TEXTS = ['say "hi"', "back\\slash \\n", "", "é 😀 \u2028", "nul \x00 byte", '{"json": [1]}']


def _rows(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT id, payload, tokens, body FROM entries ORDER BY rid").fetchall()
    conn.close()
    return rows


async def test_messages_round_trip_with_their_text_in_the_body(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    messages = [Message.user(t, tokens=n) for n, t in enumerate(TEXTS)] + [
        Message.system("rules", tokens=4, category=2),
        Message(role="tool", content='{"ok": true}', name="f", metadata={"a": 1}, tokens=2),
        Message.assistant([{"type": "text", "text": "blocks stay JSON"}], tokens=3),
    ]
    async with open_store(f"sqlite:///{path}") as store:
        session = await SessionManager(store, "t").create(session_id="s1")
        await session.append(*messages)
        entries = await session.entries()
        assert await session.messages() == messages
    rows = _rows(path)
    assert [body for _, _, _, body in rows] == [*TEXTS, "rules", '{"ok": true}', None]
    assert all('"content"' not in payload for _, payload, _, body in rows if body is not None)
    assert rows[0][1:3] == ('{"role":"user"}', 0)
    assert rows[6][1:3] == ('{"role":"system","category":2}', 4)
    # A new handle (nothing cached) reads the same messages and payloads, key order too.
    async with open_store(f"sqlite:///{path}") as store:
        session = await SessionManager(store, "t").get("s1")
        assert await session.messages() == messages
        again = await session.entries()
        assert again == entries
        assert [list(e.payload) for e in again] == [list(e.payload) for e in entries]
        assert await store.get_entry("t", "s1", entries[1].id) == entries[1]


async def test_a_replayed_append_is_recognised(tmp_path: Path) -> None:
    message = Message.user('a "quoted" text', tokens=5)
    async with open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        session = await SessionManager(store, "t").create(session_id="s1")
        await session.append(message)
        # What Session.append stored, retried as is: found equal, written no second time.
        retried = await store.append_entries("t", "s1", [message_draft(message)])
        assert retried.replayed
        assert [e.payload for e in retried.entries] == [
            {"role": "user", "content": 'a "quoted" text', "tokens": 5}
        ]
        await session.append(message)
        assert await session.messages() == [message]


async def test_rewriting_a_split_payload_compares_the_whole_payload(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    payload = {"role": "user", "content": "secret", "category": 2, "tokens": 3}
    async with open_store(f"sqlite:///{path}") as store:
        await store.create_session(SessionRecord(id="s1", tenant="t"))
        await store.append_entries("t", "s1", [EntryDraft(id="e1", payload=payload)])
        sealed = {"sealed": "xyz"}
        # Only the whole payload, key for key, matches.
        for stale in ({**payload, "content": "other"}, {"role": "user", "category": 2}):
            assert await store.rewrite_entry_payloads("t", "s1", {"e1": (stale, sealed)}) == 0
        assert await store.rewrite_entry_payloads("t", "s1", {"e1": (payload, sealed)}) == 1
        assert (await store.get_entry("t", "s1", "e1")).payload == sealed
        # And back: a rewritten payload is stored whole, body and tokens cleared.
        assert await store.rewrite_entry_payloads("t", "s1", {"e1": (sealed, payload)}) == 1
        assert _rows(path) == [
            ("e1", '{"role":"user","content":"secret","category":2,"tokens":3}', None, None)
        ]
        assert (await store.get_entry("t", "s1", "e1")).payload == payload


def _version_four_database(path: Path) -> None:
    """A database as schema version 4 wrote it: a session with two messages."""
    conn = sqlite3.connect(path)
    for migration in MIGRATIONS[:4]:
        for statement in migration.split(";"):
            if statement.strip():
                conn.execute(statement)
    record = SessionRecord(id="s1", tenant="t", version=3, head_seq=2, last_seq=2)
    conn.execute(
        "INSERT INTO sessions (tenant, id, agent_id, active_us, created_us, version, doc)"
        " VALUES ('t', 's1', NULL, 1, 1, 3, ?)",
        (record.model_dump_json(),),
    )
    conn.executemany(
        "INSERT INTO entries (rid, session_sk, id, parent_seq, kind, created_us, payload,"
        " tokens) VALUES (?, 1, ?, ?, 'message', 1000000, ?, ?)",
        [
            ((1 << 32) | 1, "e1", None, '{"role":"user","content":"old \\"one\\""}', 4),
            ((1 << 32) | 2, "e2", 1, '{"role":"assistant","content":"old two","category":2}', None),
        ],
    )
    conn.execute("PRAGMA user_version=4")
    conn.commit()
    conn.close()


async def test_a_version_four_file_migrates_and_reads_old_and_new_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _version_four_database(path)
    old = [
        {"role": "user", "content": 'old "one"', "tokens": 4},
        {"role": "assistant", "content": "old two", "category": 2},
    ]
    async with open_store(f"sqlite:///{path}") as store:
        assert [e.payload for e in await store.read_entries("t", "s1")] == old
        assert [list(e.payload) for e in await store.read_entries("t", "s1")] == [
            list(p) for p in old
        ]
        # An old row is replayed against as it reads, and rewritten as before.
        retried = await store.append_entries("t", "s1", [EntryDraft(id="e1", payload=old[0])])
        assert retried.replayed
        new = {"role": "user", "content": "new three", "tokens": 2}
        await store.append_entries("t", "s1", [EntryDraft(id="e3", payload=new)])
        assert [e.payload for e in await store.read_entries("t", "s1")] == [*old, new]
        assert (await store.get_entry("t", "s1", "e1")).payload == old[0]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    conn.close()
    assert [row[3] for row in _rows(path)] == [None, None, "new three"]


@pytest.mark.parametrize(
    ("payload", "body"),
    [
        ("{not json", "b"),
        ('["role", "user"]', "b"),
        ('{"content": "b"}', "b"),
        ('{"role": "user", "content": "b"}', "b"),
        ('{"role": "user"}', b"b"),
    ],
)
async def test_a_body_that_does_not_go_with_its_payload_is_reported(
    tmp_path: Path, payload: str, body: Any
) -> None:
    path = tmp_path / "s.db"
    async with open_store(f"sqlite:///{path}") as store:
        session = await SessionManager(store, "t").create(session_id="s1")
        await session.append(*(Message.user(t) for t in "abc"))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE entries SET payload=?, body=? WHERE (rid & 4294967295)=2", (payload, body))
    conn.commit()
    conn.close()
    async with open_store(f"sqlite:///{path}") as store:
        session = await SessionManager(store, "t").get("s1")
        view = await session.view()
        assert [m.text for m in view.messages] == ["a", "c"]
        assert [e.seq for e in view.corrupt] == [2]
        assert view.corrupt[0].payload["raw"] == payload
        damaged = (await session.entries())[1]
        assert damaged.kind == "corrupt"
        assert await store.get_entry("t", "s1", damaged.id) == damaged
        # Never what a rewrite expects: left as it is.
        expected = {"role": "user", "content": "b", "tokens": 1}
        assert await store.rewrite_entry_payloads("t", "s1", {damaged.id: (expected, {})}) == 0


async def test_a_token_count_beyond_64_bits_stays_in_the_json(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    payloads = [{"role": "user", "content": "x", "tokens": 2**70}, {"n": 1, "tokens": -(2**64)}]
    async with open_store(f"sqlite:///{path}") as store:
        await store.create_session(SessionRecord(id="s1", tenant="t"))
        drafts = [EntryDraft(payload=p) for p in payloads]
        assert [e.payload for e in (await store.append_entries("t", "s1", drafts)).entries] == (
            payloads
        )
        assert [e.payload for e in await store.read_entries("t", "s1")] == payloads
    assert [row[2:] for row in _rows(path)] == [(None, "x"), (None, None)]
