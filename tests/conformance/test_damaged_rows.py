"""The shipped conformance tests of damaged session heads and records, and (below) that
a damaged row stays reported until it is deleted: every listing reports it and every
read raises `StoreCorruptError` naming it, on every handle, including on the files
backend, which moves the damaged files to quarantine when it first finds them."""

from __future__ import annotations

import pytest

from statekeeper.errors import NotFoundError, StoreCorruptError
from statekeeper.stores import Store
from statekeeper.stores.base import SessionQuery
from statekeeper.testing.damage import damage_record, damage_session
from statekeeper.testing.registry import DAMAGE, SHARED, needs
from statekeeper.testing.spec.support import TENANT, make_sessions
from statekeeper.testing.spec.test_damaged_rows import *  # noqa: F403
from statekeeper.testing.spec.test_damaged_rows import NS, listed


async def _session_is_reported(store: Store, session_id: str, others: list[str]) -> None:
    """Listed in ``corrupt`` (and nowhere else), and `StoreCorruptError` when read."""
    page = await store.list_sessions(TENANT, SessionQuery())
    assert listed(page) == others
    assert [(c.id, repr(session_id) in c.error) for c in page.corrupt] == [(session_id, True)]
    with pytest.raises(StoreCorruptError, match=repr(session_id)):
        await store.get_session(TENANT, session_id)


async def _record_is_reported(store: Store, key: str, others: list[str]) -> None:
    listing = await store.list_records(TENANT, NS)
    assert [r.key for r in listing] == others
    assert [(c.id, f"{NS}/{key}" in c.error) for c in listing.corrupt] == [(key, True)]
    with pytest.raises(StoreCorruptError, match=f"{NS}/{key}"):
        await store.get_record(TENANT, NS, key)


@needs(DAMAGE)
async def test_a_damaged_head_stays_reported_until_it_is_deleted(store: Store) -> None:
    await make_sessions(store, {"s-a": 1, "s-b": 2})
    await damage_session(store, TENANT, "s-b")
    for _ in range(3):  # every listing and read, not only the first
        await _session_is_reported(store, "s-b", ["s-a"])

    await store.delete_session(TENANT, "s-b")
    with pytest.raises(NotFoundError):
        await store.get_session(TENANT, "s-b")
    page = await store.list_sessions(TENANT, SessionQuery())
    assert (listed(page), page.corrupt) == (["s-a"], [])


@needs(DAMAGE)
async def test_a_damaged_record_stays_reported_until_it_is_deleted(store: Store) -> None:
    for key in ("k1", "k2", "k3"):
        await store.put_record(TENANT, NS, key, {"key": key})
    await damage_record(store, TENANT, NS, "k2")
    for _ in range(3):
        await _record_is_reported(store, "k2", ["k1", "k3"])

    await store.delete_record(TENANT, NS, "k2")
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, NS, "k2")
    listing = await store.list_records(TENANT, NS)
    assert ([r.key for r in listing], listing.corrupt) == (["k1", "k3"], [])


@needs(DAMAGE, SHARED)
async def test_another_handle_sees_a_damaged_row_reported_too(
    store: Store, other_handle: Store
) -> None:
    await make_sessions(store, {"s-a": 1, "s-b": 2})
    await store.put_record(TENANT, NS, "k1", 1)
    await store.put_record(TENANT, NS, "k2", 2)
    await damage_session(store, TENANT, "s-b")
    await damage_record(store, TENANT, NS, "k2")
    # The first handle finds the damage (the files backend quarantines it then) ...
    await _session_is_reported(store, "s-b", ["s-a"])
    await _record_is_reported(store, "k2", ["k1"])
    # ... and the other handle, which never saw it, still gets it reported.
    await _session_is_reported(other_handle, "s-b", ["s-a"])
    await _record_is_reported(other_handle, "k2", ["k1"])

    await other_handle.delete_session(TENANT, "s-b")
    await other_handle.delete_record(TENANT, NS, "k2")
    assert (await store.list_sessions(TENANT, SessionQuery())).corrupt == []
    assert (await store.list_records(TENANT, NS)).corrupt == []
