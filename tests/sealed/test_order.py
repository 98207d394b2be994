"""Sealed entries are bound to their place in the transcript: an entry moved to another
seq (two entries swapped) or under another parent reads as a ``corrupt`` entry naming
it, and an entry deleted from under a later one is reported where the chain shows it;
appends (retries included) and concurrent writers keep working."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from statekeeper.stores import open_store
from statekeeper.stores.base import EntryDraft, SessionRecord
from statekeeper.stores.sealed import Keyring, SealedStore
from statekeeper.stores.sealed.entries import MISSING_ID

T = "tenant-a"


async def three_entries(store: SealedStore) -> list[Any]:
    await store.create_session(SessionRecord(id="s1", tenant=T))
    drafts = [EntryDraft(id=f"e{n}", payload={"text": f"entry {n}"}) for n in (1, 2, 3)]
    await store.append_entries(T, "s1", drafts)
    return await store.wrapped.read_entries(T, "s1")


async def test_two_entries_swapped_read_as_corrupt(sealed_store: SealedStore) -> None:
    raw = await three_entries(sealed_store)
    inner = sealed_store.wrapped
    # The same session id, the same entries, e1 and e2 in each other's place.
    await inner.delete_session(T, "s1")
    await inner.create_session(SessionRecord(id="s1", tenant=T))
    swapped = [raw[1], raw[0], raw[2]]
    await inner.append_entries(
        T, "s1", [EntryDraft(id=e.id, kind=e.kind, payload=e.payload) for e in swapped]
    )
    entries = await sealed_store.read_entries(T, "s1")
    assert [(e.seq, e.id, e.kind) for e in entries] == [
        (1, "e2", "corrupt"),
        (2, "e1", "corrupt"),
        (3, "e3", "message"),
    ]
    assert "entry 'e2' at seq 1" in entries[0].payload["error"]
    assert "reordered" in entries[0].payload["error"]
    assert (await sealed_store.get_entry(T, "s1", "e1")).kind == "corrupt"
    assert entries[2].payload == {"text": "entry 3"}


async def test_an_entry_under_another_parent_reads_as_corrupt(sealed_store: SealedStore) -> None:
    raw = await three_entries(sealed_store)
    inner = sealed_store.wrapped
    await inner.delete_session(T, "s1")
    await inner.create_session(SessionRecord(id="s1", tenant=T))
    moved = [EntryDraft(id=e.id, payload=e.payload) for e in raw[:2]]
    moved.append(EntryDraft(id="e3", payload=raw[2].payload, parent=1))  # was under 2
    await inner.append_entries(T, "s1", moved)
    entries = await sealed_store.read_entries(T, "s1")
    assert [e.kind for e in entries] == ["message", "message", "corrupt"]


async def test_a_deleted_entry_is_reported_where_the_chain_shows_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    ring = Keyring({"k1": Keyring.new_key()})
    async with open_store(url, keyring=ring) as store:
        assert isinstance(store, SealedStore)
        await three_entries(store)
    with sqlite3.connect(tmp_path / "state.db") as db:  # someone with the file deletes e2
        assert db.execute("DELETE FROM entries WHERE id = 'e2'").rowcount == 1
    async with open_store(url, keyring=ring) as store:
        entries = await store.read_entries(T, "s1")
        assert [(e.seq, e.id, e.kind) for e in entries] == [
            (1, "e1", "message"),
            (2, MISSING_ID, "corrupt"),
            (3, "e3", "message"),
        ]
        assert "entry 'e3' (seq 3) names seq 2 as its parent" in entries[1].payload["error"]
        # A read starting after the gap cannot see it; one that covers it does.
        assert [e.id for e in await store.read_entries(T, "s1", after_seq=2)] == ["e3"]
        assert [e.id for e in await store.read_entries(T, "s1", after_seq=1)] == [MISSING_ID, "e3"]


async def test_pruning_is_not_taken_for_a_deletion(sealed_store: SealedStore) -> None:
    await sealed_store.create_session(SessionRecord(id="s1", tenant=T))
    await sealed_store.append_entries(T, "s1", [EntryDraft(id="e1", payload={})])
    side = EntryDraft(id="c1", kind="checkpoint", payload={}, side=True)
    await sealed_store.append_entries(T, "s1", [side, EntryDraft(id="e2", payload={})])
    assert await sealed_store.prune_entries(T, "s1", kind="checkpoint", before_seq=9) == 1
    entries = await sealed_store.read_entries(T, "s1")
    assert [(e.seq, e.id, e.kind) for e in entries] == [(1, "e1", "message"), (3, "e2", "message")]


async def test_branches_side_entries_and_retries_still_work(sealed_store: SealedStore) -> None:
    await sealed_store.create_session(SessionRecord(id="s1", tenant=T))
    batch = [
        EntryDraft(id="a", payload={"n": 1}),
        EntryDraft(id="side", kind="checkpoint", payload={"n": 2}, side=True),
        EntryDraft(id="b", payload={"n": 3}),
        EntryDraft(id="root", payload={"n": 4}, parent=None),
        EntryDraft(id="fork", payload={"n": 5}, parent=1),
    ]
    first = await sealed_store.append_entries(T, "s1", batch)
    assert [(e.seq, e.parent_seq) for e in first.entries] == [
        (1, None), (2, 1), (3, 1), (4, None), (5, 1),
    ]  # fmt: skip
    # Another writer (another handle, no cache of this one) appends meanwhile.
    other = SealedStore(sealed_store.wrapped, sealed_store.keyring)
    await other.append_entries(T, "s1", [EntryDraft(id="x", payload={"n": 6})])
    # The first batch retried after that: recognised as stored, not written again.
    again = await sealed_store.append_entries(T, "s1", batch)
    assert again.replayed
    assert [e.payload for e in again.entries] == [d.payload for d in batch]
    version = (await sealed_store.get_session(T, "s1")).version
    retried = await sealed_store.append_entries(T, "s1", batch, expected_version=version - 1)
    assert retried.replayed  # a retry replays whatever version it carried
    await sealed_store.append_entries(T, "s1", [EntryDraft(id="y", payload={"n": 7})])
    entries = await sealed_store.read_entries(T, "s1")
    assert [e.kind for e in entries if e.kind == "corrupt"] == []
    assert [e.id for e in entries] == ["a", "side", "b", "root", "fork", "x", "y"]
    assert entries[-1].parent_seq == 6


async def test_concurrent_appends_through_two_handles(sealed_store: SealedStore) -> None:
    await sealed_store.create_session(SessionRecord(id="s1", tenant=T))
    other = SealedStore(sealed_store.wrapped, sealed_store.keyring)

    async def append(store: SealedStore, name: str) -> None:
        for i in range(5):
            await store.append_entries(T, "s1", [EntryDraft(id=f"{name}{i}", payload={})])

    await asyncio.gather(append(sealed_store, "a"), append(other, "b"), append(other, "c"))
    entries = await sealed_store.read_entries(T, "s1")
    assert len(entries) == 15
    assert {e.kind for e in entries} == {"message"}
    assert [e.parent_seq for e in entries] == [None, *range(1, 15)]


async def test_a_session_made_again_elsewhere_at_the_same_version(
    sealed_store: SealedStore,
) -> None:
    await three_entries(sealed_store)  # this handle last saw version 2, last seq 3
    other = SealedStore(sealed_store.wrapped, sealed_store.keyring)
    await other.delete_session(T, "s1")
    await other.create_session(SessionRecord(id="s1", tenant=T))
    await other.append_entries(T, "s1", [EntryDraft(id="x1", payload={"n": 1})])
    # Version 2 again, with other seqs: the entry lands at seq 2, and still reads.
    result = await sealed_store.append_entries(T, "s1", [EntryDraft(id="e4", payload={"n": 4})])
    assert [(e.seq, e.parent_seq) for e in result.entries] == [(2, 1)]
    entries = await sealed_store.read_entries(T, "s1")
    assert [(e.id, e.kind, e.payload) for e in entries] == [
        ("x1", "message", {"n": 1}),
        ("e4", "message", {"n": 4}),
    ]
