"""The files:// store: readable layout, damage and recovery, crashes, path safety."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import (
    ConflictError,
    InvalidIdError,
    InvalidInputError,
    NotFoundError,
    SchemaVersionError,
    StoreCorruptError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from statekeeper.sessions import SessionManager
from statekeeper.stores import open_store
from statekeeper.stores.base import (
    EntryDraft,
    EventDraft,
    SessionPatch,
    SessionQuery,
    SessionRecord,
)
from statekeeper.stores.files import FileStore, UnsafePathError
from statekeeper.stores.files import layout as files_layout
from statekeeper.stores.files import records as files_records
from statekeeper.stores.files import sessions as files_sessions

T = "alice"


def draft(entry_id: str, **payload: Any) -> EntryDraft:
    return EntryDraft(id=entry_id, payload={"text": entry_id, **payload})


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
async def store(root: Path) -> AsyncIterator[FileStore]:
    opened = await FileStore.open(root)
    try:
        yield opened
    finally:
        await opened.close()


async def reopen(root: Path, **options: Any) -> FileStore:
    return await FileStore.open(root, **options)


async def with_session(store: FileStore, count: int, session_id: str = "s1") -> SessionRecord:
    await store.create_session(SessionRecord(id=session_id, tenant=T))
    result = None
    for i in range(1, count + 1):
        result = await store.append_entries(
            T, session_id, [draft(f"e{i}")], patch=SessionPatch(add={"message_count": 1})
        )
    assert result is not None
    return result.session


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def head_doc(root: Path, session_id: str = "s1") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((root / T / "sessions" / f"{session_id}.json").read_text())
    return doc


def kinds(recoveries: list[Any]) -> list[str]:
    return [r.kind for r in recoveries]


def files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


def temp_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob(".*.tmp"))


# -- the layout is plain, readable JSON --------------------------------------------------


async def test_the_layout_is_plain_json_and_jsonl(store: FileStore, root: Path) -> None:
    await with_session(store, 2)
    await store.append_entries(
        T, "s1", [EntryDraft(id="c1", kind="checkpoint", side=True, payload={"at": 2})]
    )
    await store.put_record(T, "profiles", "k1", {"name": "Ada"})
    await store.append_events(T, "run-1", [EventDraft(stream="s", kind="a")] * 2)

    head = head_doc(root)
    assert head["session"]["id"] == "s1"
    assert head["session"]["last_seq"] == 3
    assert head["log"]["bytes"] == (root / T / "sessions" / "s1.jsonl").stat().st_size

    header, *entries = lines(root / T / "sessions" / "s1.jsonl")
    assert header["statekeeper"] == "transcript"
    assert header["gen"] == head["log"]["gen"]
    assert [list(e) for e in entries[:2]] == [
        ["seq", "id", "parent_seq", "kind", "created_at", "payload"]
    ] * 2
    assert [(e["seq"], e["id"], e["parent_seq"]) for e in entries] == [
        (1, "e1", None),
        (2, "e2", 1),
        (3, "c1", 2),
    ]
    assert entries[2]["side"] is True
    assert entries[0]["payload"] == {"text": "e1"}

    record = json.loads((root / T / "records" / "profiles" / "k1.json").read_text())
    assert (record["key"], record["version"], record["value"]) == ("k1", 1, {"name": "Ada"})

    header, *events = lines(root / T / "events" / "run-1.jsonl")
    assert header["statekeeper"] == "events"
    assert [(e["seq"], e["kind"], e.get("more")) for e in events] == [
        (1, "a", True),
        (2, "a", None),
    ]


async def test_a_rewrite_keeps_the_previous_version_as_backup(store: FileStore, root: Path) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=T, title="one"))
    await store.update_session(T, "s1", SessionPatch(set={"title": "two"}))
    backup = json.loads((root / T / "sessions" / "s1.json.bak").read_text())
    assert (backup["session"]["title"], head_doc(root)["session"]["title"]) == ("one", "two")
    await store.put_record(T, "ns", "k", 1)
    await store.put_record(T, "ns", "k", 2)
    assert json.loads((root / T / "records" / "ns" / "k.json.bak").read_text())["value"] == 1
    assert temp_files(root) == []


async def test_appends_with_process_durability_work_the_same(root: Path) -> None:
    store = await open_store(f"files://{root}?durability=process")
    try:
        assert isinstance(store, FileStore)
        assert store.durability == "process"
        await store.create_session(SessionRecord(id="s1", tenant=T))
        await store.append_entries(T, "s1", [draft("e1"), draft("e2")])
        assert [e.seq for e in await store.read_entries(T, "s1")] == [1, 2]
    finally:
        await store.close()


@pytest.mark.parametrize(
    "url",
    [
        "files://",
        "files:///tmp/x?durability=sometimes",
        "files:///tmp/x?max_payload_bytes=lots",
        "files:///tmp/x?max_payload_bytes=0",
        "files:///tmp/x?lock_timeout=-1",
        "files:///tmp/x?colour=blue",
    ],
)
async def test_bad_urls_are_explained(url: str) -> None:
    with pytest.raises(InvalidInputError):
        await open_store(url)


async def test_a_relative_url_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    expected = f"files://{tmp_path.resolve()}/state/here"  # noqa: ASYNC240
    store = await open_store("files://state/here")
    try:
        assert store.url == expected
        await store.put_record(T, "ns", "k", 1)
    finally:
        await store.close()
    assert (tmp_path / "state" / "here" / T / "records" / "ns" / "k.json").exists()


async def test_a_newer_format_is_refused(root: Path) -> None:
    await (await reopen(root)).close()  # creates the marker
    (root / ".statekeeper").write_text('{"format": "statekeeper-files", "version": 99}')
    with pytest.raises(SchemaVersionError, match="upgrade statekeeper"):
        await FileStore.open(root)


# -- transcripts: torn and damaged lines ----------------------------------------------------


async def test_an_uncommitted_tail_is_ignored_then_cut_with_a_report(
    store: FileStore, root: Path
) -> None:
    before = await with_session(store, 3)
    log = root / T / "sessions" / "s1.jsonl"
    committed = log.read_bytes()
    # A crash mid-append: one whole line and half of the next, never committed by the head.
    tail = (
        b'{"seq":4,"id":"e4","parent_seq":3,"kind":"message",'
        b'"created_at":"2030-01-01T00:00:00+00:00","payload":{}}\n{"seq":5,"id":"e5","par'
    )
    log.write_bytes(committed + tail)

    other = await reopen(root)
    try:
        assert [e.id for e in await other.read_entries(T, "s1")] == ["e1", "e2", "e3"]
        assert await other.get_session(T, "s1") == before
        with pytest.raises(NotFoundError):
            await other.get_entry(T, "s1", "e4")
        result = await other.append_entries(T, "s1", [draft("n4")])
        assert [(e.seq, e.parent_seq) for e in result.entries] == [(4, 3)]
        assert kinds(other.recoveries) == ["uncommitted-tail"]
    finally:
        await other.close()
    assert [e.get("id") for e in lines(log)[1:]] == ["e1", "e2", "e3", "n4"]
    assert [e.id for e in await store.read_entries(T, "s1")] == ["e1", "e2", "e3", "n4"]


async def test_a_transcript_cut_mid_line_serves_the_rest_and_a_corrupt_entry(
    store: FileStore, root: Path
) -> None:
    await with_session(store, 3)
    log = root / T / "sessions" / "s1.jsonl"
    data = log.read_bytes()
    log.write_bytes(data[: len(data) - 20])  # bytes the head committed are gone

    other = await reopen(root)
    try:
        entries = await other.read_entries(T, "s1")
        assert [(e.seq, e.kind) for e in entries] == [
            (1, "message"),
            (2, "message"),
            (3, "corrupt"),
        ]
        assert entries[2].id == "e3"
        assert "error" in entries[2].payload
        assert kinds(other.recoveries) == ["log-truncated"]
        result = await other.append_entries(T, "s1", [draft("e4")])
        assert [e.seq for e in result.entries] == [4]
        after = await other.read_entries(T, "s1")
        assert [(e.seq, e.kind) for e in after] == [
            (1, "message"),
            (2, "message"),
            (3, "corrupt"),
            (4, "message"),
        ]
    finally:
        await other.close()
    assert log.read_bytes().endswith(b"\n")


async def test_a_corrupt_line_in_the_middle_is_reported_in_place(
    store: FileStore, root: Path
) -> None:
    await with_session(store, 3)
    log = root / T / "sessions" / "s1.jsonl"
    text = log.read_bytes()
    damaged = text.replace(b'"payload":{"text":"e2"}', b'"payload":{"text":"e2"\xff')
    assert len(damaged) == len(text)
    assert damaged != text
    log.write_bytes(damaged)

    other = await reopen(root)
    try:
        entries = await other.read_entries(T, "s1")
        assert [(e.seq, e.id, e.kind) for e in entries] == [
            (1, "e1", "message"),
            (2, "e2", "corrupt"),
            (3, "e3", "message"),
        ]
        assert entries[1].parent_seq == 1
        assert (await other.get_entry(T, "s1", "e3")).payload == {"text": "e3"}
        assert (await other.get_entry(T, "s1", "e2")).kind == "corrupt"
        result = await other.append_entries(T, "s1", [draft("e4")])
        assert [(e.seq, e.parent_seq) for e in result.entries] == [(4, 3)]
        with pytest.raises(ConflictError):  # a retry of e2 cannot match a damaged entry
            await other.append_entries(T, "s1", [draft("e2")])
    finally:
        await other.close()


# -- heads: backup, then a recovery session -----------------------------------------------


async def test_a_truncated_head_falls_back_to_its_backup(store: FileStore, root: Path) -> None:
    await with_session(store, 3)
    head = root / T / "sessions" / "s1.json"
    stale_version = json.loads(head.read_text())["session"]["version"]
    head.write_bytes(head.read_bytes()[:40])

    other = await reopen(root)
    try:
        session = await other.get_session(T, "s1")
        # The backup is the version before the last append; that append's entry is kept.
        assert (session.last_seq, session.head_seq) == (3, 3)
        assert session.version == stale_version + 1
        assert [e.id for e in await other.read_entries(T, "s1")] == ["e1", "e2", "e3"]
        [recovery] = other.recoveries
        assert recovery.kind == "head-from-backup"
        assert recovery.quarantined
        assert (root / recovery.quarantined[0]).exists()
        with pytest.raises(ConflictError):
            await other.update_session(T, "s1", SessionPatch(), expected_version=stale_version)
        result = await other.append_entries(T, "s1", [draft("e4")])
        assert [(e.seq, e.parent_seq) for e in result.entries] == [(4, 3)]
    finally:
        await other.close()
    report = lines(root / T / "recoveries.jsonl")
    assert [r["kind"] for r in report] == ["head-from-backup"]
    assert json.loads(head.read_text())["session"]["last_seq"] == 4


async def test_a_head_restored_from_its_backup_counts_the_kept_messages_again(
    store: FileStore, root: Path
) -> None:
    manager = SessionManager(store, T, max_messages=4)
    session = await manager.create(session_id="s1")
    for text, tokens in (("one", 5), ("two", 7), ("three", 11)):
        await session.append(Message.user(text, tokens=tokens))
    assert (session.record.message_count, session.record.total_tokens) == (3, 23)
    head = root / T / "sessions" / "s1.json"
    head.write_bytes(head.read_bytes()[:-30])  # the last write cut short on disk

    other = await reopen(root)
    try:
        reopened = await SessionManager(other, T, max_messages=4).get("s1")
        record = reopened.record
        # The backup is from before the third append: its message is kept and counted.
        assert (record.message_count, record.total_tokens, record.fresh_tokens) == (3, 23, 23)
        assert [m.text for m in await reopened.messages()] == ["one", "two", "three"]
        [recovery] = other.recoveries
        assert recovery.kind == "head-from-backup"
        assert "counted again" in recovery.detail
        # The boundary check reads the recounted counter: the fourth message fits, the
        # fifth moves the conversation on (with the stale 2 it would have fitted too).
        assert (await reopened.append(Message.user("four"))).continued_from is None
        assert (await reopened.append(Message.user("five"))).continued_from == "s1"
    finally:
        await other.close()


async def test_head_and_backup_lost_make_a_recovery_session(store: FileStore, root: Path) -> None:
    await with_session(store, 3)
    folder = root / T / "sessions"
    (folder / "s1.json").write_text("{not json")
    (folder / "s1.json.bak").write_bytes(b"")

    other = await reopen(root)
    try:
        with pytest.raises(StoreCorruptError, match="recovered-s1"):
            await other.get_session(T, "s1")
        recovered = await other.get_session(T, "recovered-s1")
        assert recovered.metadata["recovered_from"] == "s1"
        recovery = recovered.metadata["recovery"]
        assert isinstance(recovery, dict)
        assert recovery["entries"] == 3
        assert (recovered.last_seq, recovered.head_seq, recovered.message_count) == (3, 3, 3)
        entries = await other.read_entries(T, "recovered-s1")
        assert [(e.seq, e.id, e.parent_seq) for e in entries] == [
            (1, "e1", None),
            (2, "e2", 1),
            (3, "e3", 2),
        ]
        [report] = other.recoveries
        assert (report.kind, report.recovered_as) == ("recovery-session", "recovered-s1")
        assert len(report.quarantined) == 3
        assert all((root / path).exists() for path in report.quarantined)
        # Still reported, as other backends report a damaged row, naming the quarantine.
        with pytest.raises(StoreCorruptError, match="recovered-s1") as caught:
            await other.get_session(T, "s1")
        assert all(path in str(caught.value) for path in report.quarantined)
        page = await other.list_sessions(T, SessionQuery(metadata={"recovered_from": "s1"}))
        assert [s.id for s in page.items] == ["recovered-s1"]
        assert [c.id for c in page.corrupt] == ["s1"]
        assert page.corrupt[0].raw == "{not json"
        # The id is free again; the recovery session and the quarantined files stay.
        await other.create_session(SessionRecord(id="s1", tenant=T))
        assert await other.read_entries(T, "s1") == []
        assert (await other.list_sessions(T, SessionQuery())).corrupt == []
        assert all((root / path).exists() for path in report.quarantined)
    finally:
        await other.close()


async def test_listing_recovers_a_damaged_head_and_keeps_serving(
    store: FileStore, root: Path
) -> None:
    await with_session(store, 2, "good")
    await store.create_session(SessionRecord(id="bad", tenant=T))  # no backup yet
    (root / T / "sessions" / "bad.json").write_text("")
    other = await reopen(root)
    try:
        page = await other.list_sessions(T, SessionQuery())
        assert sorted(s.id for s in page.items) == ["good", "recovered-bad"]
        assert kinds(other.recoveries) == ["recovery-session"]
    finally:
        await other.close()


async def test_a_head_copied_from_another_session_is_not_trusted(
    store: FileStore, root: Path
) -> None:
    await with_session(store, 1, "s1")
    await store.create_session(SessionRecord(id="s2", tenant=T))
    folder = root / T / "sessions"
    (folder / "s2.json").write_bytes((folder / "s1.json").read_bytes())
    other = await reopen(root)
    try:
        with pytest.raises(StoreCorruptError, match="recovered-s2"):
            await other.get_session(T, "s2")
    finally:
        await other.close()


async def test_an_interrupted_prune_is_completed(store: FileStore, root: Path) -> None:
    await store.create_session(SessionRecord(id="s1", tenant=T))
    for n in (1, 2, 3):
        side = EntryDraft(id=f"c{n}", kind="checkpoint", side=True, payload={})
        await store.append_entries(T, "s1", [draft(f"m{n}"), side])
    folder = root / T / "sessions"
    head_before = (folder / "s1.json").read_bytes()
    version = json.loads(head_before)["session"]["version"]
    assert await store.prune_entries(T, "s1", kind="checkpoint", before_seq=6) == 2
    # As if the process died between replacing the transcript and writing the head:
    (folder / "s1.json").write_bytes(head_before)

    other = await reopen(root)
    try:
        entries = await other.read_entries(T, "s1")
        assert [e.id for e in entries] == ["m1", "m2", "m3", "c3"]
        session = await other.get_session(T, "s1")
        assert (session.last_seq, session.version) == (6, version + 1)
        assert kinds(other.recoveries) == ["prune-completed"]
        result = await other.append_entries(T, "s1", [draft("m4")])
        assert [(e.seq, e.parent_seq) for e in result.entries] == [(7, 5)]
    finally:
        await other.close()


# -- records and events ----------------------------------------------------------------------


async def test_a_damaged_record_is_served_from_its_backup(store: FileStore, root: Path) -> None:
    await store.put_record(T, "ns", "k", {"v": 1})
    await store.put_record(T, "ns", "k", {"v": 2})
    path = root / T / "records" / "ns" / "k.json"
    path.write_bytes(path.read_bytes()[:10])
    other = await reopen(root)
    try:
        got = await other.get_record(T, "ns", "k")
        assert (got.value, got.version) == ({"v": 1}, 1)
        assert kinds(other.recoveries) == ["record-from-backup"]
        assert [r.key for r in await other.list_records(T, "ns")] == ["k"]
    finally:
        await other.close()


async def test_a_damaged_record_without_backup_stays_reported_until_put_again(
    store: FileStore, root: Path
) -> None:
    await store.put_record(T, "ns", "a", 1)
    await store.put_record(T, "ns", "k", 1)
    await store.put_record(T, "ns", "z", 1)
    damaged = '{"namespace": "ns", "key": "k", "ver'
    (root / T / "records" / "ns" / "k.json").write_text(damaged)
    other = await reopen(root)
    try:
        for _ in range(2):  # quarantined by the first listing, reported by both
            listing = await other.list_records(T, "ns")
            assert [r.key for r in listing] == ["a", "z"]
            [item] = listing.corrupt
            assert (item.id, item.raw) == ("k", damaged)
            assert "ns/k" in item.error
        [report] = other.recoveries
        assert report.kind == "record-lost"
        assert all((root / path).exists() for path in report.quarantined)
        with pytest.raises(StoreCorruptError, match="ns/k") as caught:
            await other.get_record(T, "ns", "k")
        assert all(path in str(caught.value) for path in report.quarantined)
    finally:
        await other.close()
    third = await reopen(root)  # another handle, which never saw the damage, too
    try:
        with pytest.raises(StoreCorruptError, match="quarantine"):
            await third.get_record(T, "ns", "k")
        assert [c.id for c in (await third.list_records(T, "ns")).corrupt] == ["k"]
        again = await third.put_record(T, "ns", "k", 2, expected_version=0)
        assert again.version == 1
        listing = await third.list_records(T, "ns")
        assert ([r.key for r in listing], listing.corrupt) == (["a", "k", "z"], [])
        assert all((root / path).exists() for path in report.quarantined)
    finally:
        await third.close()


async def test_a_lost_record_or_session_is_deleted_and_its_quarantine_kept(
    store: FileStore, root: Path
) -> None:
    await store.put_record(T, "ns", "k", 1)
    await with_session(store, 2, "s1")
    (root / T / "records" / "ns" / "k.json").write_text("[")
    for name in ("s1.json", "s1.json.bak"):
        (root / T / "sessions" / name).write_text("")
    with pytest.raises(StoreCorruptError):
        await store.get_record(T, "ns", "k")
    with pytest.raises(StoreCorruptError):
        await store.get_session(T, "s1")
    with pytest.raises(StoreCorruptError, match="'s1'"):
        await store.append_entries(T, "s1", [draft("late")])
    quarantined = [path for r in store.recoveries for path in r.quarantined]
    assert len(quarantined) == 4  # the record (no backup yet), the session's three files

    await store.delete_record(T, "ns", "k")
    await store.delete_session(T, "s1")
    with pytest.raises(NotFoundError):
        await store.get_record(T, "ns", "k")
    with pytest.raises(NotFoundError, match="recovered-s1"):
        await store.get_session(T, "s1")
    assert (await store.list_records(T, "ns")).corrupt == []
    assert (await store.list_sessions(T, SessionQuery())).corrupt == []
    assert all((root / path).exists() for path in quarantined)
    with pytest.raises(NotFoundError):  # deleted: nothing left to delete
        await store.delete_record(T, "ns", "k")


async def test_event_logs_ignore_torn_and_unfinished_batches(store: FileStore, root: Path) -> None:
    await store.append_events(T, "log", [EventDraft(stream="s", kind=f"k{i}") for i in range(3)])
    path = root / T / "events" / "log.jsonl"
    whole = path.read_bytes()
    unfinished = (
        b'{"seq":4,"more":true,"stream":"s","kind":"x","ts":"2030-01-01T00:00:00+00:00",'
        b'"payload":{}}\n{"seq":5,"stream":"s","ki'
    )
    path.write_bytes(whole + unfinished)
    other = await reopen(root)
    try:
        assert [e.seq for e in await other.read_events(T, "log")] == [1, 2, 3]
        [added] = await other.append_events(T, "log", [EventDraft(stream="s", kind="next")])
        assert (added.seq, added.kind) == (4, "next")
        assert kinds(other.recoveries) == ["uncommitted-tail"]
        assert [e.kind for e in await other.read_events(T, "log")] == ["k0", "k1", "k2", "next"]
    finally:
        await other.close()
    assert all(isinstance(line, dict) for line in lines(path))


async def test_a_corrupt_event_line_is_reported_in_place(store: FileStore, root: Path) -> None:
    await store.append_events(T, "log", [EventDraft(stream="s", kind=f"k{i}") for i in range(3)])
    path = root / T / "events" / "log.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"kind":"k1"', b'"kind":"k1\xff'))
    other = await reopen(root)
    try:
        events = await other.read_events(T, "log")
        assert [(e.seq, e.stream, e.kind) for e in events] == [
            (1, "s", "k0"),
            (2, "error", "corrupt"),
            (3, "s", "k2"),
        ]
    finally:
        await other.close()


# -- nothing outside the root ------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../x", "..", "a/../../b", "/etc", ".hidden", "a\x00b", ""])
async def test_hostile_ids_are_refused_before_any_file_is_touched(
    store: FileStore, root: Path, tmp_path: Path, bad: str
) -> None:
    before = files_under(tmp_path)
    calls = [
        store.create_session(SessionRecord.model_construct(id=bad, tenant=T)),
        store.get_session(bad, "s1"),
        store.put_record(T, bad, "k", 1),
        store.put_record(T, "ns", bad, 1),
        store.append_events(T, bad, [EventDraft(stream="s", kind="k")]),
        store.read_events(bad, "log"),
        store.list_records(T, "ns", prefix=bad) if bad else store.get_record(T, "ns", bad),
    ]
    for call in calls:
        with pytest.raises(InvalidIdError):
            await call
    assert files_under(tmp_path) == before


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret.json").write_text('{"secret": true}')
    return target


def untouched(outside: Path) -> bool:
    return [p.name for p in outside.iterdir()] == ["secret.json"] and (
        outside / "secret.json"
    ).read_text() == '{"secret": true}'


async def test_a_symlinked_tenant_folder_is_refused(
    store: FileStore, root: Path, outside: Path
) -> None:
    (root / "evil").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        await store.put_record("evil", "ns", "k", 1)
    with pytest.raises(UnsafePathError):
        await store.create_session(SessionRecord(id="s1", tenant="evil"))
    with pytest.raises(UnsafePathError):
        await store.list_sessions("evil", SessionQuery())
    with pytest.raises(UnsafePathError):
        await store.append_events("evil", "log", [EventDraft(stream="s", kind="k")])
    assert untouched(outside)


async def test_symlinks_deeper_inside_the_root_are_refused(
    store: FileStore, root: Path, outside: Path
) -> None:
    await store.put_record(T, "ns", "k", 1)
    await with_session(store, 1)
    (root / T / "records" / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        await store.get_record(T, "linked", "secret")
    with pytest.raises(UnsafePathError):
        await store.put_record(T, "linked", "k", 1)
    (root / T / "records" / "ns" / "secret.json").symlink_to(outside / "secret.json")
    with pytest.raises(UnsafePathError):
        await store.get_record(T, "ns", "secret")
    with pytest.raises(UnsafePathError):
        await store.put_record(T, "ns", "secret", {"overwritten": True})
    assert [r.key for r in await store.list_records(T, "ns")] == ["k"]
    # A head or a transcript replaced by a link is refused too, never followed.
    log = root / T / "sessions" / "s1.jsonl"
    log.rename(root / T / "s1.jsonl.real")
    log.symlink_to(outside / "secret.json")
    with pytest.raises(UnsafePathError):
        await store.read_entries(T, "s1")
    with pytest.raises(UnsafePathError):
        await store.append_entries(T, "s1", [draft("e2")])
    shutil_locks = root / T / "locks" / "events"
    shutil_locks.parent.mkdir(exist_ok=True)
    shutil_locks.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        await store.append_events(T, "log", [EventDraft(stream="s", kind="k")])
    assert untouched(outside)


# -- crashes and other processes ------------------------------------------------------------


def run_python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


CRASHER = """
    import asyncio, sys
    from statekeeper.stores import open_store
    from statekeeper.stores.base import EntryDraft, EventDraft, SessionPatch

    async def main(root):
        store = await open_store(f"files://{root}")
        i = 0
        while True:
            blob = "x" * (50_000 + 7_919 * (i % 13))
            await store.append_entries(
                "alice", "s1",
                [EntryDraft(id=f"a{i}", payload={"n": i, "blob": blob}),
                 EntryDraft(id=f"b{i}", payload={"n": i})],
                patch=SessionPatch(add={"message_count": 2}),
            )
            await store.append_events(
                "alice", "log", [EventDraft(stream="s", kind=f"{i}-{j}") for j in range(3)]
            )
            if i == 5:
                print("ready", flush=True)
            i += 1

    asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.13])
async def test_sigkill_mid_write_leaves_only_whole_entries(root: Path, delay: float) -> None:
    store = await reopen(root)
    await store.create_session(SessionRecord(id="s1", tenant=T))
    await store.close()
    proc = run_python(CRASHER, str(root))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.communicate()[1]
    await asyncio.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)

    store = await reopen(root)
    try:
        session = await store.get_session(T, "s1")
        entries = await store.read_entries(T, "s1")
        assert all(e.kind == "message" for e in entries)
        assert [e.seq for e in entries] == list(range(1, session.last_seq + 1))
        assert len(entries) % 2 == 0  # batches are atomic
        assert len(entries) >= 12
        assert [e.id for e in entries] == [
            f"{p}{i}" for i in range(len(entries) // 2) for p in ("a", "b")
        ]
        assert session.message_count == len(entries) == session.head_seq
        events = await store.read_events(T, "log")
        assert len(events) % 3 == 0
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert all(e.stream == "s" for e in events)
        await store.append_entries(T, "s1", [draft("after")])
        await store.append_events(T, "log", [EventDraft(stream="s", kind="after")])
    finally:
        await store.close()
    for line in lines(root / T / "sessions" / "s1.jsonl"):
        assert isinstance(line, dict)
    for line in lines(root / T / "events" / "log.jsonl"):
        assert isinstance(line, dict)


async def test_two_handles_in_one_process_share_locks(root: Path) -> None:
    first, second = await reopen(root), await reopen(root)
    try:
        await first.create_session(SessionRecord(id="s1", tenant=T))
        await second.append_entries(T, "s1", [draft("e1")])
        await first.append_entries(T, "s1", [draft("e2")])
        assert [(e.seq, e.parent_seq) for e in await second.read_entries(T, "s1")] == [
            (1, None),
            (2, 1),
        ]
        await second.delete_session(T, "s1")
        with pytest.raises(NotFoundError):
            await first.append_entries(T, "s1", [draft("e3")])
        assert not (root / T / "locks" / "sessions" / "s1").exists()
        assert not (root / T / "sessions" / "s1.jsonl").exists()
    finally:
        await first.close()
        await second.close()


async def test_a_closed_store_refuses_calls(root: Path) -> None:
    store = await reopen(root)
    await store.close()
    await store.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        await store.get_session(T, "s1")


CRASH_AT = """
    import asyncio, os, signal, sys
    from statekeeper.stores.files import layout as files_layout
    from statekeeper.stores.files import records as files_records
    from statekeeper.stores.files import sessions as files_sessions
    from statekeeper.stores.base import EntryDraft, EventDraft, SessionRecord
    from statekeeper.stores.files import FileStore

    root, point = sys.argv[1], sys.argv[2]

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    def arm():
        real_write_all = files_layout.write_all
        if point in ("mid-line", "events-mid-line"):
            def torn(fd, data, offset):
                real_write_all(fd, data[: len(data) // 2], offset)
                die()
            files_sessions.write_all = files_records.write_all = torn
        elif point == "before-head":
            files_layout.Layout.write_atomic = die
        elif point == "before-rename":
            os.replace = die

    async def main():
        store = await FileStore.open(root)
        await store.create_session(SessionRecord(id="s1", tenant="alice"))
        await store.append_entries(
            "alice", "s1", [EntryDraft(id="e1", payload={}), EntryDraft(id="e2", payload={})]
        )
        await store.append_events("alice", "log", [EventDraft(stream="s", kind="k")])
        arm()
        if point == "events-mid-line":
            await store.append_events("alice", "log", [EventDraft(stream="s", kind="x")] * 3)
        await store.append_entries(
            "alice", "s1",
            [EntryDraft(id="e3", payload={"x": "y" * 1000}), EntryDraft(id="e4", payload={})],
        )

    asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("point", ["mid-line", "before-head", "before-rename", "events-mid-line"])
async def test_a_crash_at_any_point_of_a_write_keeps_the_last_acknowledged_state(
    root: Path, point: str
) -> None:
    proc = run_python(CRASH_AT, str(root), point)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    store = await reopen(root)
    try:
        session = await store.get_session(T, "s1")
        assert (session.last_seq, session.head_seq, session.version) == (2, 2, 2)
        assert [e.id for e in await store.read_entries(T, "s1")] == ["e1", "e2"]
        assert [e.kind for e in await store.read_events(T, "log")] == ["k"]
        result = await store.append_entries(T, "s1", [draft("e3")])
        assert [(e.seq, e.parent_seq) for e in result.entries] == [(3, 2)]
        [event] = await store.append_events(T, "log", [EventDraft(stream="s", kind="next")])
        assert event.seq == 2
        # Lines written after the committed end, never acknowledged, are cut with a report.
        assert kinds(store.recoveries) == ["uncommitted-tail"]
        if point == "before-rename":  # the unrenamed temp head is left behind, and ignored
            assert [p.name for p in (root / T / "sessions").glob(".s1.json.*.tmp")] != []
    finally:
        await store.close()
    for path in (root / T / "sessions" / "s1.jsonl", root / T / "events" / "log.jsonl"):
        assert all(isinstance(line, dict) for line in lines(path))


async def test_something_planted_instead_of_a_file_is_refused(store: FileStore, root: Path) -> None:
    await with_session(store, 1)
    await store.put_record(T, "ns", "k", 1)
    os.mkfifo(root / T / "records" / "ns" / "fifo.json")  # would block a plain open()
    (root / T / "records" / "ns" / "folder.json").mkdir()
    with pytest.raises(UnsafePathError):
        await store.get_record(T, "ns", "fifo")
    with pytest.raises(UnsafePathError):
        await store.get_record(T, "ns", "folder")
    assert [r.key for r in await store.list_records(T, "ns")] == ["k"]
    log = root / T / "sessions" / "s1.jsonl"
    log.unlink()
    os.mkfifo(log)
    with pytest.raises(UnsafePathError):
        await store.read_entries(T, "s1")


def fail_with(code: int) -> Any:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code))

    return fail


async def test_a_full_disk_fails_the_write_and_keeps_the_data(
    store: FileStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = await with_session(store, 2)
    await store.append_events(T, "log", [EventDraft(stream="s", kind="k")])
    await store.put_record(T, "ns", "k", 1)
    with monkeypatch.context() as patched:
        patched.setattr(files_sessions, "write_all", fail_with(errno.ENOSPC))
        patched.setattr(files_records, "write_all", fail_with(errno.ENOSPC))
        with pytest.raises(StoreFullError):
            await store.append_entries(T, "s1", [draft("e3")])
        with pytest.raises(StoreFullError):
            await store.append_events(T, "log", [EventDraft(stream="s", kind="x")])
    with monkeypatch.context() as patched:
        # The entry line is written, then the head cannot be: nothing is committed.
        patched.setattr(files_layout.Layout, "write_atomic", fail_with(errno.ENOSPC))
        with pytest.raises(StoreFullError):
            await store.append_entries(T, "s1", [draft("e3")])
        with pytest.raises(StoreFullError):
            await store.put_record(T, "ns", "k", 2)
        patched.setattr(files_layout.Layout, "write_atomic", fail_with(errno.EROFS))
        with pytest.raises(StoreReadOnlyError):
            await store.update_session(T, "s1", SessionPatch(set={"title": "x"}))
    assert await store.get_session(T, "s1") == before
    assert [e.id for e in await store.read_entries(T, "s1")] == ["e1", "e2"]
    assert [e.kind for e in await store.read_events(T, "log")] == ["k"]
    assert (await store.get_record(T, "ns", "k")).version == 1
    result = await store.append_entries(T, "s1", [draft("e3")])
    assert [(e.seq, e.parent_seq) for e in result.entries] == [(3, 2)]
    assert kinds(store.recoveries) == ["uncommitted-tail"]


async def test_a_root_that_is_a_file_is_explained(tmp_path: Path) -> None:
    (tmp_path / "state.db").write_text("not a folder")
    with pytest.raises(StoreUnavailableError, match="not a directory"):
        await open_store(f"files://{tmp_path / 'state.db'}")
