"""One damaged row never hides the rest: listings report it, get names it, delete removes it.

The rows are damaged below the store's API (`statekeeper.testing.damage`): these tests
check the `DAMAGE` capability, which backends whose data cannot be damaged that way
(memory) lack. A backend that repairs what it
finds (files: a lost head becomes a recovery session) may list that repair too; these
tests tell it apart by its ``recovered_from`` metadata.
"""

from __future__ import annotations

import pytest

from statekeeper.errors import NotFoundError, StoreCorruptError
from statekeeper.stores import Store
from statekeeper.stores.base import Page, SessionQuery, SessionRecord, VersionedRecord
from statekeeper.testing.damage import NOT_JSON, can_damage, damage_record, damage_session
from statekeeper.testing.registry import DAMAGE, needs
from statekeeper.testing.snapshot import snapshot

from .support import TENANT, draft, make_sessions

NS = "damaged-ns"
DAMAGED_HEADS = {
    "not JSON": NOT_JSON,
    "not a session": '{"id": 5, "tenant": []}',
    "not an object": "[1, 2, 3]",
}


@pytest.fixture
def damageable(store: Store) -> Store:
    """The store under test (its backend declares `DAMAGE`, so a `Damager` must know it)."""
    assert can_damage(store), (
        f"the backend declares the {DAMAGE!r} capability, but statekeeper.testing.damage "
        f"has no Damager for {type(store).__name__}: register one with register_damager"
    )
    return store


def listed(page: Page) -> list[str]:
    """The ids a page lists, without the recovery sessions a repairing backend made."""
    return [s.id for s in page.items if "recovered_from" not in s.metadata]


async def heads(store: Store, ids: list[str]) -> list[SessionRecord]:
    return [await store.get_session(TENANT, i) for i in ids]


@needs(DAMAGE)
@pytest.mark.parametrize("raw", DAMAGED_HEADS.values(), ids=list(DAMAGED_HEADS))
async def test_a_listing_reports_a_damaged_head_and_lists_the_others(
    damageable: Store, raw: str
) -> None:
    store = damageable
    await make_sessions(store, {"s-a": 1, "s-b": 2, "s-c": 3})
    before = await heads(store, ["s-a", "s-c"])
    await damage_session(store, TENANT, "s-b", raw)

    page = await store.list_sessions(TENANT, SessionQuery())
    assert listed(page) == ["s-c", "s-a"]
    [bad] = page.corrupt
    assert bad.id == "s-b"
    assert "'s-b'" in bad.error
    assert await heads(store, ["s-a", "s-c"]) == before


@needs(DAMAGE)
async def test_paging_passes_damaged_rows_and_reports_each_once(damageable: Store) -> None:
    store = damageable
    stamps = {f"s-{n}": n for n in range(1, 9)}
    await make_sessions(store, stamps)
    damaged = ["s-1", "s-4", "s-5", "s-8"]  # the newest, the oldest, and two in a row
    for session_id in damaged:
        await damage_session(store, TENANT, session_id)

    items: list[str] = []
    reported: list[str] = []
    cursor: str | None = None
    for _ in range(20):
        page = await store.list_sessions(TENANT, SessionQuery(limit=2, cursor=cursor))
        items += listed(page)
        reported += [c.id for c in page.corrupt]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert items == ["s-7", "s-6", "s-3", "s-2"]
    assert sorted(reported) == sorted(damaged)


@needs(DAMAGE)
async def test_get_of_a_damaged_session_raises_a_store_corrupt_error_naming_it(
    damageable: Store,
) -> None:
    store = damageable
    await make_sessions(store, {"s-a": 1, "s-b": 2})
    await damage_session(store, TENANT, "s-b")
    with pytest.raises(StoreCorruptError, match="'s-b'"):
        await store.get_session(TENANT, "s-b")
    assert (await store.get_session(TENANT, "s-a")).id == "s-a"


@needs(DAMAGE)
async def test_a_damaged_session_can_be_deleted(damageable: Store) -> None:
    store = damageable
    await make_sessions(store, {"s-a": 1, "s-b": 2, "s-c": 3})
    await store.append_entries(TENANT, "s-a", [draft("e1"), draft("e2")])
    await store.put_record(TENANT, NS, "k", 1)
    before = await snapshot(store, TENANT, namespaces=[NS])
    await damage_session(store, TENANT, "s-b")

    await store.delete_session(TENANT, "s-b")
    with pytest.raises(NotFoundError):
        await store.get_session(TENANT, "s-b")
    page = await store.list_sessions(TENANT, SessionQuery())
    assert ([s.id for s in page.items], page.corrupt) == (["s-c", "s-a"], [])
    del before["sessions"]["s-b"]
    assert await snapshot(store, TENANT, namespaces=[NS]) == before


@needs(DAMAGE)
async def test_a_record_listing_reports_damaged_records_and_lists_the_others(
    damageable: Store,
) -> None:
    store = damageable
    for key in ("k1", "k2", "k3", "k4", "k5"):
        await store.put_record(TENANT, NS, key, {"key": key})
    kept = [await store.get_record(TENANT, NS, key) for key in ("k1", "k3", "k5")]
    await damage_record(store, TENANT, NS, "k2")
    await damage_record(store, TENANT, NS, "k4", "{}}")

    # Paged one record at a time, as callers do (after_key = the last key listed).
    found: list[VersionedRecord] = []
    reported: list[tuple[str, bool]] = []
    after: str | None = None
    for _ in range(10):
        batch = await store.list_records(TENANT, NS, after_key=after, limit=1)
        found += batch
        reported += [(c.id, f"{NS}/{c.id}" in c.error) for c in batch.corrupt]
        if not batch:
            break
        after = batch[-1].key
    assert found == kept
    assert reported == [("k2", True), ("k4", True)]


@needs(DAMAGE)
async def test_get_of_a_damaged_record_raises_a_store_corrupt_error_naming_it(
    damageable: Store,
) -> None:
    store = damageable
    await store.put_record(TENANT, NS, "good", 1)
    await store.put_record(TENANT, NS, "bad", 2)
    await damage_record(store, TENANT, NS, "bad")
    with pytest.raises(StoreCorruptError, match=f"{NS}/bad"):
        await store.get_record(TENANT, NS, "bad")
    assert (await store.get_record(TENANT, NS, "good")).value == 1


@needs(DAMAGE)
async def test_a_damaged_record_can_be_deleted(damageable: Store) -> None:
    store = damageable
    await store.put_record(TENANT, NS, "good", 1)
    await store.put_record(TENANT, NS, "bad", 2)
    await damage_record(store, TENANT, NS, "bad")
    await store.delete_record(TENANT, NS, "bad")
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, NS, "bad")
    listing = await store.list_records(TENANT, NS)
    assert ([r.key for r in listing], listing.corrupt) == (["good"], [])
