"""Listing sessions: order, cursor and offset paging, tampered cursors (filters are in
test_session_filters)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from statekeeper.errors import InvalidInputError, InvalidPayloadError
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store
from statekeeper.stores.base import SessionPatch, SessionQuery, SessionRecord

from .support import (
    OTHER_TENANT,
    T0,
    TENANT,
    at,
    make_sessions,
    new_session,
    walk,
)


def newest_first(records: list[SessionRecord]) -> list[str]:
    """The order every backend lists in: last_active descending, then id descending."""
    return [r.id for r in sorted(records, key=lambda r: (r.last_active, r.id), reverse=True)]


# Seven sessions on three distinct instants: ties must be ordered (by id) and never
# split or repeated across pages.
TIED = {"s-a": 1, "s-b": 2, "s-c": 2, "s-d": 3, "s-e": 2, "s-f": 3, "s-g": 1}


async def test_cursor_paging_visits_every_session_once_newest_first(store: Store) -> None:
    records = await make_sessions(store, TIED)
    await new_session(store, "s-other", tenant=OTHER_TENANT, last_active=at(2))
    pages = await walk(store, TENANT, limit=3)
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for page in pages for i in page] == newest_first(records)


@pytest.mark.parametrize("limit", [1, 2, 7, 8, 1000])
async def test_paging_works_for_any_limit(store: Store, limit: int) -> None:
    records = await make_sessions(store, TIED)
    pages = await walk(store, TENANT, limit=limit)
    assert [i for page in pages for i in page] == newest_first(records)
    assert all(len(page) == limit for page in pages[:-1])
    assert 1 <= len(pages[-1]) <= limit


async def test_a_full_last_page_has_no_cursor(store: Store) -> None:
    records = await make_sessions(store, {f"s{i}": i for i in range(6)})
    first = await store.list_sessions(TENANT, SessionQuery(limit=3))
    assert first.next_cursor is not None
    second = await store.list_sessions(TENANT, SessionQuery(limit=3, cursor=first.next_cursor))
    assert second.next_cursor is None
    assert [s.id for s in first.items + second.items] == newest_first(records)


async def test_listed_items_are_the_stored_records(store: Store) -> None:
    await new_session(store, "s1", title="one", metadata={"k": [1, 2]})
    page = await store.list_sessions(TENANT, SessionQuery())
    assert page.items == [await store.get_session(TENANT, "s1")]
    assert page.next_cursor is None


async def test_offset_skips_sessions_in_list_order(store: Store) -> None:
    records = await make_sessions(store, TIED)
    order = newest_first(records)
    page = await store.list_sessions(TENANT, SessionQuery(offset=2, limit=3))
    assert [s.id for s in page.items] == order[2:5]
    assert page.next_cursor is not None
    tail = await store.list_sessions(TENANT, SessionQuery(offset=5, limit=3))
    assert [s.id for s in tail.items] == order[5:]
    assert tail.next_cursor is None
    beyond = await store.list_sessions(TENANT, SessionQuery(offset=7))
    assert (beyond.items, beyond.next_cursor) == ([], None)


async def test_an_update_moves_a_session_to_the_front(store: Store) -> None:
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    await new_session(store, "s1", last_active=an_hour_ago)
    await new_session(store, "s2", last_active=an_hour_ago + timedelta(seconds=1))
    assert [s.id for s in (await store.list_sessions(TENANT, SessionQuery())).items] == [
        "s2",
        "s1",
    ]
    await store.update_session(TENANT, "s1", SessionPatch(set={"title": "touched"}))
    page = await store.list_sessions(TENANT, SessionQuery())
    assert [s.id for s in page.items] == ["s1", "s2"]


# -- cursors -------------------------------------------------------------------------------


def _b64(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "not a cursor!",
        "",
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        _b64({"after": "s1"}),
        _b64([1, 2]),
        _b64(["yesterday", "s1"]),
        _b64(["2030-01-01T00:00:00+00:00", "../escape"]),
        _b64(["2030-01-01T00:00:00+00:00", "s1", "extra"]),
    ],
    ids=["garbage", "empty", "binary", "object", "numbers", "bad-date", "bad-id", "extra"],
)
async def test_a_tampered_cursor_raises_invalid_input(store: Store, cursor: str) -> None:
    await make_sessions(store, {"s1": 1, "s2": 2})
    with pytest.raises(InvalidInputError):
        await store.list_sessions(TENANT, SessionQuery(cursor=cursor))


async def test_a_cursor_with_a_naive_timestamp_raises_invalid_input(store: Store) -> None:
    await make_sessions(store, {"s1": 1, "s2": 2})
    with pytest.raises(InvalidInputError):
        await store.list_sessions(TENANT, SessionQuery(cursor=_b64(["2030-01-01T00:00:00", "s"])))


@pytest.mark.parametrize("bound", ["active_after", "active_before"])
async def test_a_naive_activity_bound_is_refused_when_the_query_is_built(
    store: Store, bound: str
) -> None:
    await make_sessions(store, {"s1": 1})
    naive: dict[str, Any] = {bound: datetime(2030, 1, 1)}
    with pytest.raises(InvalidPayloadError, match=bound):
        SessionQuery(**naive)
    with pytest.raises(InvalidPayloadError, match=bound):
        SessionQuery.model_validate(naive)
    with pytest.raises(InvalidPayloadError, match=bound):
        await SessionManager(store, TENANT).list(**naive)
    aware: dict[str, Any] = {bound: T0}
    page = await SessionManager(store, TENANT).list(**aware)
    assert [s.id for s in page.items] == (["s1"] if bound == "active_after" else [])
