"""Two handles on the same data, as two processes would hold (the `SHARED` capability:
the ``other_handle`` fixture skips the tests on backends without it).

Whatever a handle caches, a write through one handle must be seen by the other, and a
write made from stale knowledge must be refused, never stored.
"""

from __future__ import annotations

import asyncio

import pytest

from statekeeper.errors import AlreadyExistsError, ConflictError, NotFoundError
from statekeeper.stores import Store
from statekeeper.stores.base import EventDraft, SessionPatch, SessionQuery

from .support import TENANT, draft, new_session


async def chain(store: Store, session_id: str = "s1") -> list[tuple[int, int | None]]:
    return [(e.seq, e.parent_seq) for e in await store.read_entries(TENANT, session_id)]


async def test_writes_through_one_handle_are_read_through_the_other(
    store: Store, other_handle: Store
) -> None:
    await new_session(store, "s1", title="from a")
    result = await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2")])
    await store.put_record(TENANT, "ns", "k", {"v": 1})
    await store.append_events(TENANT, "log", [EventDraft(stream="s", kind="k")])
    assert await other_handle.get_session(TENANT, "s1") == result.session
    assert await other_handle.read_entries(TENANT, "s1") == result.entries
    assert (await other_handle.get_record(TENANT, "ns", "k")).value == {"v": 1}
    assert [e.seq for e in await other_handle.read_events(TENANT, "log")] == [1]
    page = await other_handle.list_sessions(TENANT, SessionQuery())
    assert [s.id for s in page.items] == ["s1"]
    with pytest.raises(AlreadyExistsError):
        await new_session(other_handle, "s1")


async def test_appends_alternating_between_handles_form_one_chain(
    store: Store, other_handle: Store
) -> None:
    created = await new_session(store, "s1")
    handles = [store, other_handle]
    for i in range(6):
        result = await handles[i % 2].append_entries(TENANT, "s1", [draft(f"e{i}")])
        assert [e.seq for e in result.entries] == [i + 1]
        assert result.session.version == created.version + i + 1
    expected = [(1, None), (2, 1), (3, 2), (4, 3), (5, 4), (6, 5)]
    assert await chain(store) == await chain(other_handle) == expected
    assert await store.get_session(TENANT, "s1") == await other_handle.get_session(TENANT, "s1")


async def test_an_update_through_one_handle_is_not_lost_by_the_other(
    store: Store, other_handle: Store
) -> None:
    await new_session(store, "s1")
    await store.append_entries(TENANT, "s1", [draft("e1")])
    await other_handle.update_session(TENANT, "s1", SessionPatch(add={"message_count": 5}))
    result = await store.append_entries(
        TENANT, "s1", [draft("e2")], patch=SessionPatch(add={"message_count": 1})
    )
    assert result.session.message_count == 6
    assert (await other_handle.get_session(TENANT, "s1")).message_count == 6


async def test_a_version_made_stale_by_the_other_handle_conflicts(
    store: Store, other_handle: Store
) -> None:
    created = await new_session(store, "s1")
    await store.append_entries(TENANT, "s1", [draft("e1")])
    seen = (await store.get_session(TENANT, "s1")).version
    await other_handle.append_entries(TENANT, "s1", [draft("e2")])
    with pytest.raises(ConflictError):
        await store.update_session(TENANT, "s1", SessionPatch(), expected_version=seen)
    with pytest.raises(ConflictError):
        await store.append_entries(TENANT, "s1", [draft("e3")], expected_version=seen)
    assert await chain(store) == [(1, None), (2, 1)]
    assert (await store.get_session(TENANT, "s1")).version == created.version + 2


async def test_create_only_puts_through_two_handles_let_one_win(
    store: Store, other_handle: Store
) -> None:
    first = await store.put_record(TENANT, "ns", "k", "a", expected_version=0)
    with pytest.raises(ConflictError):
        await other_handle.put_record(TENANT, "ns", "k", "b", expected_version=0)
    assert await other_handle.get_record(TENANT, "ns", "k") == first


async def test_event_appends_through_two_handles_share_one_sequence(
    store: Store, other_handle: Store
) -> None:
    for i in range(6):
        handle = (store, other_handle)[i % 2]
        [stored] = await handle.append_events(TENANT, "log", [EventDraft(stream="s", kind="k")])
        assert stored.seq == i + 1
    assert [e.seq for e in await store.read_events(TENANT, "log")] == [1, 2, 3, 4, 5, 6]


async def test_concurrent_appends_through_two_handles_form_one_chain(
    store: Store, other_handle: Store
) -> None:
    await new_session(store, "s1")
    calls = [
        (store, other_handle)[i % 2].append_entries(TENANT, "s1", [draft(f"e{i}")])
        for i in range(40)
    ]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert [o for o in outcomes if isinstance(o, BaseException)] == []
    assert await chain(other_handle) == [(1, None)] + [(i, i - 1) for i in range(2, 41)]


async def test_a_session_recreated_by_another_handle_is_not_overwritten(
    store: Store, other_handle: Store
) -> None:
    await new_session(store, "s1", title="old")
    await store.append_entries(TENANT, "s1", [draft("a1"), draft("a2")])
    await other_handle.delete_session(TENANT, "s1")
    await new_session(other_handle, "s1", title="new")
    await other_handle.append_entries(TENANT, "s1", [draft("b1")])
    result = await store.append_entries(TENANT, "s1", [draft("a3")])
    assert [(e.seq, e.parent_seq) for e in result.entries] == [(2, 1)]
    session = await other_handle.get_session(TENANT, "s1")
    assert (session.title, session.last_seq, session.head_seq) == ("new", 2, 2)
    assert await chain(other_handle) == [(1, None), (2, 1)]


async def test_a_session_deleted_by_another_handle_is_gone(
    store: Store, other_handle: Store
) -> None:
    await new_session(store, "s1")
    await store.append_entries(TENANT, "s1", [draft("e1")])
    await other_handle.delete_session(TENANT, "s1")
    with pytest.raises(NotFoundError):
        await store.append_entries(TENANT, "s1", [draft("e2")])
    with pytest.raises(NotFoundError):
        await store.update_session(TENANT, "s1", SessionPatch(set={"title": "x"}))
    with pytest.raises(NotFoundError):
        await store.get_session(TENANT, "s1")
