"""SQLite group commit (durability power): concurrent writers share transactions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from statekeeper.errors import ConflictError
from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionRecord
from statekeeper.stores.sqlite import SQLiteStore


async def _writer(store: SQLiteStore, session_id: str, count: int) -> None:
    for n in range(count):
        await store.append_entries("t", session_id, [EntryDraft(payload={"n": n})])


async def test_concurrent_writers_are_grouped_and_every_write_lands(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'g.db'}", durability="power")
    assert isinstance(store, SQLiteStore)
    async with store:
        ids = [f"s{i}" for i in range(8)]
        for session_id in ids:
            await store.create_session(SessionRecord(id=session_id, tenant="t"))
        await asyncio.gather(*(_writer(store, session_id, 25) for session_id in ids))
        assert store._group.batches > 0  # the writes did share transactions
        for session_id in ids:
            entries = await store.read_entries("t", session_id)
            assert [e.payload["n"] for e in entries] == list(range(25))
            assert [e.seq for e in entries] == list(range(1, 26))
            assert (await store.get_session("t", session_id)).last_seq == 25
    async with open_store(f"sqlite:///{tmp_path / 'g.db'}") as again:  # durable, not cached
        assert len(await again.read_entries("t", "s7")) == 25


async def test_a_failing_write_in_a_group_fails_alone(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'g.db'}", durability="power")
    assert isinstance(store, SQLiteStore)
    async with store:
        for session_id in ("a", "b", "c"):
            await store.create_session(SessionRecord(id=session_id, tenant="t"))

        async def good(session_id: str) -> None:
            await store.append_entries("t", session_id, [EntryDraft(payload={"ok": True})])

        async def stale() -> None:
            await store.append_entries(
                "t", "b", [EntryDraft(payload={"ok": False})], expected_version=99
            )

        for _ in range(5):
            results = await asyncio.gather(good("a"), stale(), good("c"), return_exceptions=True)
            assert results[0] is None
            assert results[2] is None
            assert isinstance(results[1], ConflictError)
        assert store._group.batches > 0
        assert len(await store.read_entries("t", "a")) == 5
        assert len(await store.read_entries("t", "c")) == 5
        assert await store.read_entries("t", "b") == []


async def test_process_durability_never_groups(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'p.db'}", durability="process")
    assert isinstance(store, SQLiteStore)
    async with store:
        for session_id in ("a", "b"):
            await store.create_session(SessionRecord(id=session_id, tenant="t"))
        await asyncio.gather(_writer(store, "a", 10), _writer(store, "b", 10))
        assert store._group.batches == 0


async def test_a_lone_writer_stays_inline(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'l.db'}", durability="power")
    assert isinstance(store, SQLiteStore)
    async with store:
        await store.create_session(SessionRecord(id="a", tenant="t"))
        await _writer(store, "a", 10)
        assert store._group.batches == 0


async def test_a_writer_counts_as_writing_from_the_end_of_its_last_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit slower than the window (a slow fsync) must not hide its writer: the next
    writer to ask still sees it writing, so their commits are grouped."""
    from statekeeper.stores.sqlite import group
    from statekeeper.stores.worker import Worker

    clock = [100.0]
    monkeypatch.setattr(group.time, "monotonic", lambda: clock[0])
    commits = group.GroupCommit(Worker("test-group"), lambda batch: None, enabled=True)

    async def writer(then: float) -> bool:
        wanted = commits.wanted()
        clock[0] = then  # the commit (inline, alone) takes until then
        commits.wrote()
        return wanted

    async def next_writer() -> bool:
        return commits.wanted()

    first = await asyncio.ensure_future(writer(100.0 + 10 * group._WINDOW))
    assert (first, await asyncio.ensure_future(next_writer())) == (False, True)
