"""SQLite schema migrations: a database written by an older schema opens with its data."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionPatch, SessionQuery, SessionRecord
from statekeeper.stores.sqlite.schema import MIGRATIONS, SCHEMA_VERSION


def _version_one_database(path: Path) -> None:
    """A database as schema version 1 wrote it: one session with three entries."""
    record = SessionRecord(id="s1", tenant="t", version=4, head_seq=3, last_seq=3)
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0].split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(
        "INSERT INTO sessions (tenant, id, agent_id, active_us, created_us, version, doc)"
        " VALUES ('t', 's1', NULL, 1, 1, 4, ?)",
        (record.model_dump_json(),),
    )
    for seq in (1, 2, 3):
        conn.execute(
            "INSERT INTO entries (session_sk, seq, id, parent_seq, kind, created_us, payload)"
            " VALUES (1, ?, ?, ?, 'message', ?, ?)",
            (seq, f"e{seq}", seq - 1 or None, seq, f'{{"n": {seq}}}'),
        )
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()


async def test_version_one_entries_survive_the_migration_in_order(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _version_one_database(path)
    async with open_store(f"sqlite:///{path}") as store:
        entries = await store.read_entries("t", "s1")
        assert [(e.seq, e.id, e.parent_seq, e.payload) for e in entries] == [
            (1, "e1", None, {"n": 1}),
            (2, "e2", 1, {"n": 2}),
            (3, "e3", 2, {"n": 3}),
        ]
        assert (await store.get_entry("t", "s1", "e2")).seq == 2
        appended = await store.append_entries("t", "s1", [EntryDraft(id="e4", payload={"n": 4})])
        assert (appended.entries[0].seq, appended.entries[0].parent_seq) == (4, 3)
        assert [e.seq for e in await store.read_entries("t", "s1", after_seq=2)] == [3, 4]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


async def test_entries_of_two_sessions_stay_apart(tmp_path: Path) -> None:
    async with open_store(f"sqlite:///{tmp_path / 'a.db'}") as store:
        for sid in ("a", "b"):
            await store.create_session(SessionRecord(id=sid, tenant="t"))
        for n in range(3):
            for sid in ("a", "b"):
                await store.append_entries("t", sid, [EntryDraft(payload={"s": sid, "n": n})])
        await store.delete_session("t", "a")
        kept = await store.read_entries("t", "b")
        assert [(e.seq, e.payload) for e in kept] == [(n + 1, {"s": "b", "n": n}) for n in range(3)]


async def test_a_head_written_before_version_three_reads_from_its_document(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    _version_one_database(path)
    async with open_store(f"sqlite:///{path}") as store:
        head = await store.get_session("t", "s1")
        assert (head.version, head.head_seq, head.last_seq) == (4, 3, 3)
        appended = await store.append_entries(
            "t", "s1", [EntryDraft(id="e4", payload={"n": 4})], expected_version=4
        )
        assert (appended.session.version, appended.session.last_seq) == (5, 4)
    # A new handle (no cached head) reads the columns the append wrote over the old
    # document, and the listing agrees.
    async with open_store(f"sqlite:///{path}") as store:
        head = await store.get_session("t", "s1")
        assert (head.version, head.head_seq, head.last_seq) == (5, 4, 4)
        assert head == appended.session
        [listed] = (await store.list_sessions("t", SessionQuery())).items
        assert listed == head


async def test_an_append_writes_the_live_columns_and_leaves_the_document(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with open_store(f"sqlite:///{path}") as store:
        await store.create_session(SessionRecord(id="s1", tenant="t", title="first"))
        conn = sqlite3.connect(path)
        doc_before = conn.execute("SELECT doc FROM sessions").fetchone()[0]
        draft = EntryDraft(id="e1", payload={"n": 1})
        appended = await store.append_entries(
            "t", "s1", [draft], patch=SessionPatch(add={"message_count": 1, "total_tokens": 7})
        )
        row = conn.execute(
            "SELECT doc, version, head_seq, last_seq, message_count, total_tokens FROM sessions"
        ).fetchone()
        assert row == (doc_before, 2, 1, 1, 1, 7)
        # Any other field rewrites the document, with the live values in it too.
        updated = await store.update_session("t", "s1", SessionPatch(set={"title": "second"}))
        (doc,) = conn.execute("SELECT doc FROM sessions").fetchone()
        stored = SessionRecord.model_validate_json(doc)
        assert (stored.title, stored.version, stored.message_count) == ("second", 3, 1)
        conn.close()
    async with open_store(f"sqlite:///{path}") as store:
        head = await store.get_session("t", "s1")
        assert head == updated
        assert head.last_active == updated.last_active > appended.session.created_at


async def test_a_change_to_an_equal_value_of_another_type_is_written(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with open_store(f"sqlite:///{path}") as store:
        await store.create_session(SessionRecord(id="s1", tenant="t", metadata={"a": True}))
        await store.update_session("t", "s1", SessionPatch(set={"metadata": {"a": 1}}))
    async with open_store(f"sqlite:///{path}") as store:
        stored = (await store.get_session("t", "s1")).metadata["a"]
        assert stored == 1
        assert stored is not True


async def test_a_token_count_is_stored_in_its_column_and_read_back_in_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    payloads = [
        {"role": "user", "content": "hi", "tokens": 7},  # split: tokens last, an int
        {"tokens": 3, "role": "user"},  # tokens not last: stored as is
        {"role": "user", "content": "x", "tokens": True},  # not an int: as is
        {"role": "user", "content": ',"tokens":5}', "n": 1},  # no tokens key at all
    ]
    async with open_store(f"sqlite:///{path}") as store:
        await store.create_session(SessionRecord(id="s1", tenant="t"))
        drafts = [EntryDraft(id=f"e{n}", payload=p) for n, p in enumerate(payloads)]
        appended = await store.append_entries("t", "s1", drafts)
        assert [e.payload for e in appended.entries] == payloads
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT payload, tokens, body FROM entries ORDER BY rid").fetchall()
    conn.close()
    assert rows[0] == ('{"role":"user"}', 7, "hi")
    assert [tokens for _, tokens, _ in rows[1:]] == [None, None, None]
    async with open_store(f"sqlite:///{path}") as store:
        read = await store.read_entries("t", "s1")
        assert [e.payload for e in read] == payloads
        assert [list(e.payload) for e in read] == [list(p) for p in payloads]  # key order
        # A payload rewritten in place (what reseal does) replaces the count too.
        done = await store.rewrite_entry_payloads(
            "t", "s1", {"e0": (payloads[0], {"role": "user", "content": "hi"})}
        )
        assert done == 1
        assert (await store.get_entry("t", "s1", "e0")).payload == {
            "role": "user",
            "content": "hi",
        }
