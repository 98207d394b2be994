"""`branch_seqs`: which entries of a page are on the active branch, read without the
whole branch, agrees with the library's `Session.branch` on every page."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import StoreCorruptError
from statekeeper.server.branch import branch_seqs
from statekeeper.sessions import Session, SessionManager
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import Entry, EntryDraft

TENANT = "acme"


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    opened = await open_store("memory://")
    try:
        yield opened
    finally:
        await opened.close()


async def _pages_agree(store: Store, session: Session, limit: int) -> None:
    record = await session.refresh()
    on_branch = {e.seq for e in await session.branch()}
    after = 0
    while page := await session.entries(after_seq=after, limit=limit):
        found = await branch_seqs(store, TENANT, session.id, record.head_seq, page)
        assert found == {e.seq for e in page} & on_branch, (after, limit)
        after = page[-1].seq


async def test_every_page_agrees_with_the_branch(store: Store) -> None:
    session = await SessionManager(store, TENANT).create(session_id="s")
    for n in range(150):
        await session.append(Message.user(f"q{n}"), Message.assistant(f"a{n}"))
    await session.checkout(40)  # abandons 41..300
    for n in range(100):
        await session.append(Message.user(f"again {n}"))
    # Side entries hang off the branch without joining it.
    await store.append_entries(
        TENANT, "s", [EntryDraft(kind="marker", payload={"n": 1}, side=True)]
    )
    await session.refresh()
    await session.append(Message.user("last"))
    for limit in (1, 7, 20, 64, 1000):
        await _pages_agree(store, session, limit)
    await session.checkout(120)  # the head below later entries: those are off the branch
    for limit in (5, 200):
        await _pages_agree(store, session, limit)


async def test_a_fork_pages_its_own_entries(store: Store) -> None:
    manager = SessionManager(store, TENANT)
    origin = await manager.create(session_id="o")
    await origin.append(Message.user("a"), Message.assistant("b"), Message.user("c"))
    fork = await origin.fork(2, session_id="f")
    await fork.append(Message.user("d"), Message.assistant("e"))
    await _pages_agree(store, fork, 1)
    await _pages_agree(store, origin, 2)


class _Stored:
    """A transcript store holding given entries (damaged ones, too)."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.reads = 0

    async def read_entries(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        self.reads += 1
        top = until_seq if until_seq is not None else 1 << 62
        found = [e for e in self.entries if after_seq < e.seq <= top]
        return found[:limit] if limit is not None else found


def _entry(seq: int, parent: int | None) -> Entry:
    return Entry(seq, f"e{seq}", parent, "message", datetime.now(UTC), {})


async def test_the_newest_page_reads_nothing_more() -> None:
    stored = _Stored([_entry(n, n - 1 or None) for n in range(1, 10_001)])
    page = stored.entries[-20:]
    found = await branch_seqs(stored, TENANT, "s", 10_000, page)  # type: ignore[arg-type]
    assert found == {e.seq for e in page}
    assert stored.reads == 0


async def test_an_abandoned_branch_above_the_page_is_skipped() -> None:
    # 1..10 then a branch from 10 to 5,000 that was left: 5,001 continues from 10.
    entries = [_entry(n, n - 1 or None) for n in range(1, 5_001)]
    entries += [_entry(5_001, 10), _entry(5_002, 5_001)]
    stored = _Stored(entries)
    found = await branch_seqs(stored, TENANT, "s", 5_002, entries[:10])  # type: ignore[arg-type]
    assert found == set(range(1, 11))
    assert stored.reads == 1


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([_entry(1, None), _entry(3, 2), _entry(30, 3)], "entry 2 of the active branch is missing"),
        ([_entry(1, None), _entry(2, 1), _entry(30, 30)], "entry 30 points forward to parent 30"),
    ],
)
async def test_a_broken_branch_is_reported(entries: list[Entry], message: str) -> None:
    stored = _Stored(entries)
    with pytest.raises(StoreCorruptError, match=message):
        await branch_seqs(stored, TENANT, "s", 30, entries[:1])  # type: ignore[arg-type]
