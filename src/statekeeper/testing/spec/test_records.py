"""Versioned records: put/get, compare-and-set, listing, deletion, expiry, JSON values."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given

from statekeeper.errors import (
    ConflictError,
    InvalidIdError,
    InvalidInputError,
    InvalidPayloadError,
    NotFoundError,
    PayloadTooLargeError,
)
from statekeeper.stores import Store
from statekeeper.testing.plugin import StoreOpener

from .support import (
    SAMPLE_PAYLOAD,
    TENANT,
    assert_same_json,
    fresh_id,
    hypothesis_settings,
    json_values,
)

NS = "profiles"


def past() -> datetime:
    return datetime.now(UTC) - timedelta(hours=1)


def future() -> datetime:
    return datetime.now(UTC) + timedelta(days=1)


async def keys(store: Store, namespace: str = NS, **options: Any) -> list[str]:
    return [r.key for r in await store.list_records(TENANT, namespace, **options)]


async def test_put_then_get(store: Store) -> None:
    before = datetime.now(UTC)
    put = await store.put_record(TENANT, NS, "k1", {"name": "Ada", "n": [1, 2]})
    assert (put.namespace, put.key, put.value, put.version) == (
        NS,
        "k1",
        {"name": "Ada", "n": [1, 2]},
        1,
    )
    assert put.expires_at is None
    assert put.updated_at.tzinfo is not None
    assert put.updated_at >= before - timedelta(seconds=1)
    assert await store.get_record(TENANT, NS, "k1") == put


async def test_every_put_adds_one_to_the_version(store: Store) -> None:
    versions = [(await store.put_record(TENANT, NS, "k", i)).version for i in range(5)]
    assert versions == [1, 2, 3, 4, 5]
    got = await store.get_record(TENANT, NS, "k")
    assert (got.value, got.version) == (4, 5)


@pytest.mark.parametrize(
    "value", [None, True, 0, -7, 2**80, 1.5, "", "text", [], {}, [None, {"a": []}]], ids=repr
)
async def test_any_json_value_can_be_a_record(store: Store, value: Any) -> None:
    await store.put_record(TENANT, NS, "k", value)
    assert_same_json((await store.get_record(TENANT, NS, "k")).value, value)


async def test_a_record_round_trips_exactly(store: Store) -> None:
    put = await store.put_record(TENANT, NS, "k", copy.deepcopy(SAMPLE_PAYLOAD))
    assert_same_json(put.value, SAMPLE_PAYLOAD)
    assert_same_json((await store.get_record(TENANT, NS, "k")).value, SAMPLE_PAYLOAD)
    assert_same_json((await store.list_records(TENANT, NS))[0].value, SAMPLE_PAYLOAD)


@hypothesis_settings
@given(value=json_values)
async def test_any_json_value_round_trips(store: Store, value: Any) -> None:
    key = fresh_id("k")
    put = await store.put_record(TENANT, NS, key, value)
    assert_same_json(put.value, value)
    assert_same_json((await store.get_record(TENANT, NS, key)).value, value)


# -- compare-and-set -------------------------------------------------------------------------


async def test_expected_version_zero_creates_only(store: Store) -> None:
    created = await store.put_record(TENANT, NS, "k", "first", expected_version=0)
    assert created.version == 1
    with pytest.raises(ConflictError) as caught:
        await store.put_record(TENANT, NS, "k", "second", expected_version=0)
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    assert await store.get_record(TENANT, NS, "k") == created


async def test_the_current_version_succeeds_and_a_stale_one_conflicts(store: Store) -> None:
    first = await store.put_record(TENANT, NS, "k", "a")
    second = await store.put_record(TENANT, NS, "k", "b", expected_version=first.version)
    assert second.version == 2
    with pytest.raises(ConflictError) as caught:
        await store.put_record(TENANT, NS, "k", "c", expected_version=first.version)
    assert (caught.value.expected, caught.value.actual) == (1, 2)
    assert await store.get_record(TENANT, NS, "k") == second


async def test_expecting_a_version_of_a_missing_record_conflicts(store: Store) -> None:
    with pytest.raises(ConflictError):
        await store.put_record(TENANT, NS, "k", "x", expected_version=3)
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, NS, "k")


# -- listing ---------------------------------------------------------------------------------

# Byte (code point) order, which differs from most locale collations: "-" < "." < digits
# < ":" < "@" < upper case < "_" < lower case.
SORTED_KEYS = ["A", "Z", "a", "a-b", "a.b", "a0", "a9", "a:b", "a@b", "aA", "a_b", "aa", "b", "z"]


async def test_list_is_in_key_order(store: Store) -> None:
    for i, key in enumerate(reversed(SORTED_KEYS)):
        await store.put_record(TENANT, NS, key, i)
    records = await store.list_records(TENANT, NS)
    assert [r.key for r in records] == SORTED_KEYS
    assert records[0] == await store.get_record(TENANT, NS, "A")


async def test_list_by_prefix_after_key_and_limit(store: Store) -> None:
    for key in SORTED_KEYS:
        await store.put_record(TENANT, NS, key, key)
    assert await keys(store, prefix="a") == SORTED_KEYS[2:12]
    assert await keys(store, prefix="a.") == ["a.b"]
    assert await keys(store, prefix="aa") == ["aa"]
    assert await keys(store, prefix="c") == []
    assert await keys(store, after_key="a9") == ["a:b", "a@b", "aA", "a_b", "aa", "b", "z"]
    assert await keys(store, after_key="a5") == ["a9", "a:b", "a@b", "aA", "a_b", "aa", "b", "z"]
    assert await keys(store, after_key="z") == []
    assert await keys(store, prefix="a", after_key="a:b") == ["a@b", "aA", "a_b", "aa"]
    assert await keys(store, prefix="a", after_key="0") == SORTED_KEYS[2:12]
    assert await keys(store, limit=3) == SORTED_KEYS[:3]
    assert await keys(store, prefix="a", limit=2) == ["a", "a-b"]
    assert await keys(store, limit=0) == []


async def test_list_with_a_negative_limit_is_refused(store: Store) -> None:
    await store.put_record(TENANT, NS, "a", 1)
    await store.put_record(TENANT, NS, "b", 2)
    with pytest.raises(InvalidInputError):
        await store.list_records(TENANT, NS, limit=-1)


async def test_paging_with_after_key_visits_every_record_once(store: Store) -> None:
    for key in SORTED_KEYS:
        await store.put_record(TENANT, NS, key, key)
    seen: list[str] = []
    after: str | None = None
    while page := await keys(store, after_key=after, limit=4):
        seen += page
        after = page[-1]
    assert seen == SORTED_KEYS


async def test_namespaces_are_separate(store: Store) -> None:
    await store.put_record(TENANT, "ns", "k", "plain")
    await store.put_record(TENANT, "ns2", "k", "two")
    await store.put_record(TENANT, "ns.sub", "k2", "sub")
    await store.put_record(TENANT, "n", "sk", "short")
    assert await keys(store, "ns") == ["k"]
    assert (await store.get_record(TENANT, "ns", "k")).value == "plain"
    assert (await store.get_record(TENANT, "ns2", "k")).value == "two"
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, "ns", "k2")
    await store.delete_record(TENANT, "ns", "k")
    assert (await store.get_record(TENANT, "ns2", "k")).version == 1


@pytest.mark.parametrize("prefix", ["../", "a/b", "a b", ".", "a\x00"])
async def test_a_prefix_no_key_can_have_is_refused(store: Store, prefix: str) -> None:
    with pytest.raises(InvalidIdError):
        await store.list_records(TENANT, NS, prefix=prefix)


# -- deletion --------------------------------------------------------------------------------


async def test_delete_removes_the_record(store: Store) -> None:
    await store.put_record(TENANT, NS, "k", 1)
    await store.put_record(TENANT, NS, "other", 2)
    await store.delete_record(TENANT, NS, "k")
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, NS, "k")
    with pytest.raises(NotFoundError):
        await store.delete_record(TENANT, NS, "k")
    assert await keys(store) == ["other"]
    again = await store.put_record(TENANT, NS, "k", 3, expected_version=0)
    assert again.version == 1


async def test_delete_with_the_current_version(store: Store) -> None:
    put = await store.put_record(TENANT, NS, "k", 1)
    await store.delete_record(TENANT, NS, "k", expected_version=put.version)
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, NS, "k")


async def test_delete_with_a_stale_version_conflicts_and_keeps_the_record(store: Store) -> None:
    await store.put_record(TENANT, NS, "k", 1)
    current = await store.put_record(TENANT, NS, "k", 2)
    with pytest.raises(ConflictError):
        await store.delete_record(TENANT, NS, "k", expected_version=1)
    with pytest.raises(ConflictError):
        await store.delete_record(TENANT, NS, "k", expected_version=0)
    assert await store.get_record(TENANT, NS, "k") == current


async def test_missing_records_are_not_found(store: Store) -> None:
    await store.put_record(TENANT, NS, "k", 1)
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, NS, "missing")
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, "other-ns", "k")
    with pytest.raises(NotFoundError):
        await store.delete_record(TENANT, NS, "missing")
    with pytest.raises(NotFoundError):
        await store.delete_record(TENANT, NS, "missing", expected_version=1)
    assert await store.list_records(TENANT, "other-ns") == []


# -- expiry ----------------------------------------------------------------------------------


async def test_an_expired_record_is_invisible(store: Store) -> None:
    await store.put_record(TENANT, NS, "gone", "old", expires_at=past())
    await store.put_record(TENANT, NS, "kept", "new")
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, NS, "gone")
    assert await keys(store) == ["kept"]
    with pytest.raises(NotFoundError):
        await store.delete_record(TENANT, NS, "gone")


async def test_a_put_over_an_expired_record_starts_again(store: Store) -> None:
    await store.put_record(TENANT, NS, "k", "v1")
    await store.put_record(TENANT, NS, "k", "v2", expires_at=past())
    with pytest.raises(ConflictError):
        await store.put_record(TENANT, NS, "k", "x", expected_version=2)
    fresh = await store.put_record(TENANT, NS, "k", "v3", expected_version=0)
    assert (fresh.value, fresh.version, fresh.expires_at) == ("v3", 1, None)
    assert await store.get_record(TENANT, NS, "k") == fresh


async def test_a_record_expiring_later_is_visible_with_its_expiry(store: Store) -> None:
    expires = future().replace(microsecond=123456)
    put = await store.put_record(TENANT, NS, "k", "v", expires_at=expires)
    got = await store.get_record(TENANT, NS, "k")
    assert got == put
    assert got.expires_at == expires
    assert await keys(store) == ["k"]
    cleared = await store.put_record(TENANT, NS, "k", "w")
    assert (cleared.version, cleared.expires_at) == (2, None)


async def test_a_naive_expiry_is_refused(store: Store) -> None:
    with pytest.raises(InvalidInputError):
        await store.put_record(TENANT, NS, "k", 1, expires_at=datetime(2100, 1, 1))
    assert await store.list_records(TENANT, NS) == []


# -- values that are not JSON ----------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("-inf"), object(), b"bytes", {"a": {1, 2}}, [1, float("nan")]],
    ids=["nan", "inf", "object", "bytes", "set", "nested-nan"],
)
async def test_a_non_json_value_is_refused_and_nothing_stored(store: Store, value: Any) -> None:
    with pytest.raises(InvalidPayloadError):
        await store.put_record(TENANT, NS, "new", value)
    with pytest.raises(NotFoundError):
        await store.get_record(TENANT, NS, "new")
    existing = await store.put_record(TENANT, NS, "old", "kept")
    with pytest.raises(InvalidPayloadError):
        await store.put_record(TENANT, NS, "old", value, expected_version=1)
    assert await store.get_record(TENANT, NS, "old") == existing


async def test_a_lone_surrogate_is_refused(store: Store) -> None:
    with pytest.raises(InvalidPayloadError):
        await store.put_record(TENANT, NS, "k", {"s": "\udfff"})
    assert await store.list_records(TENANT, NS) == []


async def test_a_value_over_the_size_limit_is_refused(open_test_store: StoreOpener) -> None:
    small = await open_test_store(max_payload_bytes=1000)
    existing = await small.put_record(TENANT, NS, "k", "small")
    with pytest.raises(PayloadTooLargeError):
        await small.put_record(TENANT, NS, "k", "x" * 2000)
    assert await small.get_record(TENANT, NS, "k") == existing


async def test_returned_values_are_copies(store: Store) -> None:
    def mutable(value: object) -> dict[str, Any]:
        assert isinstance(value, dict)
        return value

    sent: dict[str, Any] = {"list": [1], "map": {"k": "v"}}
    put = await store.put_record(TENANT, NS, "k", sent)
    sent["list"].append("changed by the caller")
    mutable(put.value)["map"]["k"] = "changed"
    mutable((await store.get_record(TENANT, NS, "k")).value)["new"] = 1
    mutable((await store.list_records(TENANT, NS))[0].value)["list"].append(2)
    assert (await store.get_record(TENANT, NS, "k")).value == {"list": [1], "map": {"k": "v"}}
