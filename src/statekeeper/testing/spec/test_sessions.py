"""Session head records: create, get, update (compare-and-set), delete."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidIdError,
    InvalidInputError,
    InvalidPayloadError,
    NotFoundError,
    PayloadTooLargeError,
)
from statekeeper.stores import Store
from statekeeper.stores.base import (
    DeliveryContext,
    ForkPoint,
    SessionPatch,
    SessionQuery,
    SessionRecord,
)
from statekeeper.testing.plugin import StoreOpener

from .support import TENANT, at, draft, new_session, seqs_of


async def test_store_satisfies_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)
    assert isinstance(store.url, str)
    assert store.url


async def test_a_fresh_store_is_empty(store: Store) -> None:
    assert (await store.list_sessions(TENANT, SessionQuery())).items == []
    assert await store.list_records(TENANT, "ns") == []
    assert await store.read_events(TENANT, "log") == []


# -- create / get --------------------------------------------------------------------------


async def test_create_returns_version_1_with_an_empty_transcript(store: Store) -> None:
    created = await new_session(store, "s1")
    assert (created.version, created.head_seq, created.last_seq) == (1, 0, 0)
    assert (created.id, created.tenant) == ("s1", TENANT)
    assert await store.get_session(TENANT, "s1") == created
    assert await store.read_entries(TENANT, "s1") == []


async def test_create_ignores_the_callers_version_and_positions(store: Store) -> None:
    created = await new_session(store, "s1", version=7, head_seq=2, last_seq=3)
    assert (created.version, created.head_seq, created.last_seq) == (1, 0, 0)
    result = await store.append_entries(TENANT, "s1", [draft("e1")])
    assert [e.seq for e in result.entries] == [1]
    assert result.session.version == 2


async def test_create_round_trips_every_field(store: Store) -> None:
    record = SessionRecord(
        id="s-full",
        tenant=TENANT,
        agent_id="agent:support",
        title="Ünïcode title 🙂",
        created_at=datetime(2029, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2))),
        last_active=at(0.5),
        metadata={"user": "u-1", "n": 2**70, "nested": {"tags": ["a", "b"], "x": None}},
        model_override="model-x",
        thinking_level="high",
        total_tokens=10,
        fresh_tokens=4,
        message_count=3,
        compaction_count=1,
        delivery=DeliveryContext(channel="slack", sender="u-1", extra={"thread": "t-9"}),
        continued_from="s-previous",
        continued_to="s-next",
        continuation_index=2,
        forked_from=ForkPoint(session_id="s-origin", seq=12),
        state={"step": 3, "plan": ["a", "b"]},
    )
    created = await store.create_session(record)
    got = await store.get_session(TENANT, "s-full")
    assert got == created
    ignored = {"version", "head_seq", "last_seq"}
    assert got.model_dump(exclude=ignored) == record.model_dump(exclude=ignored)


async def test_a_taken_id_raises_already_exists_and_keeps_the_original(store: Store) -> None:
    await new_session(store, "s1", title="original")
    await store.append_entries(TENANT, "s1", [draft("e1")])
    before = await store.get_session(TENANT, "s1")
    with pytest.raises(AlreadyExistsError):
        await new_session(store, "s1", title="impostor")
    assert await store.get_session(TENANT, "s1") == before
    assert await seqs_of(store, "s1") == [1]


async def test_unknown_session_raises_not_found_everywhere(store: Store) -> None:
    await new_session(store, "known")
    with pytest.raises(NotFoundError):
        await store.get_session(TENANT, "unknown")
    with pytest.raises(NotFoundError):
        await store.update_session(TENANT, "unknown", SessionPatch(set={"title": "x"}))
    with pytest.raises(NotFoundError):
        await store.delete_session(TENANT, "unknown")
    with pytest.raises(NotFoundError):
        await store.append_entries(TENANT, "unknown", [draft("e1")])
    with pytest.raises(NotFoundError):
        await store.read_entries(TENANT, "unknown")
    with pytest.raises(NotFoundError):
        await store.get_entry(TENANT, "unknown", "e1")
    with pytest.raises(NotFoundError):
        await store.prune_entries(TENANT, "unknown", kind="checkpoint", before_seq=9)
    items = (await store.list_sessions(TENANT, SessionQuery())).items
    assert [s.id for s in items] == ["known"]


@pytest.mark.parametrize("field", ["created_at", "last_active"])
def test_a_session_record_refuses_naive_timestamps(field: str) -> None:
    with pytest.raises(ValueError, match="timezone"):
        SessionRecord.model_validate({"id": "s1", "tenant": TENANT, field: datetime(2030, 1, 1)})


async def test_create_refuses_non_json_metadata(store: Store) -> None:
    with pytest.raises(InvalidPayloadError):
        await new_session(store, "s1", metadata={"x": float("nan")})
    with pytest.raises(InvalidPayloadError):
        await new_session(store, "s2", state={"x": float("inf")})
    with pytest.raises(NotFoundError):
        await store.get_session(TENANT, "s1")
    assert (await store.list_sessions(TENANT, SessionQuery())).items == []


async def test_create_refuses_a_record_over_the_size_limit(open_test_store: StoreOpener) -> None:
    small = await open_test_store(max_payload_bytes=4096)
    with pytest.raises(PayloadTooLargeError):
        await new_session(small, "s1", metadata={"blob": "x" * 8192})
    with pytest.raises(NotFoundError):
        await small.get_session(TENANT, "s1")


# -- update --------------------------------------------------------------------------------


async def test_update_sets_fields_and_adds_counters(store: Store) -> None:
    created = await new_session(store, "s1")
    patch = SessionPatch(
        set={"title": "renamed", "metadata": {"k": "v"}, "delivery": {"channel": "email"}},
        add={"total_tokens": 12, "message_count": 2},
    )
    updated = await store.update_session(TENANT, "s1", patch)
    assert updated.version == created.version + 1
    assert updated.title == "renamed"
    assert updated.metadata == {"k": "v"}
    assert updated.delivery == DeliveryContext(channel="email")
    assert (updated.total_tokens, updated.message_count) == (12, 2)
    assert updated.last_active >= created.last_active
    assert (updated.created_at, updated.agent_id) == (created.created_at, created.agent_id)
    assert await store.get_session(TENANT, "s1") == updated


async def test_counters_accumulate(store: Store) -> None:
    await new_session(store, "s1", total_tokens=5)
    for _ in range(3):
        await store.update_session(
            TENANT, "s1", SessionPatch(add={"total_tokens": 10, "compaction_count": 1})
        )
    got = await store.get_session(TENANT, "s1")
    assert (got.total_tokens, got.compaction_count, got.message_count) == (35, 3, 0)


async def test_update_with_the_current_version_succeeds(store: Store) -> None:
    created = await new_session(store, "s1")
    patch = SessionPatch(set={"title": "a"})
    first = await store.update_session(TENANT, "s1", patch, expected_version=created.version)
    second = await store.update_session(TENANT, "s1", patch, expected_version=first.version)
    assert second.version == first.version + 1 == created.version + 2


async def test_a_stale_version_conflicts_and_changes_nothing(store: Store) -> None:
    created = await new_session(store, "s1")
    stale = created.version
    current = await store.update_session(TENANT, "s1", SessionPatch(set={"title": "first"}))
    with pytest.raises(ConflictError) as caught:
        await store.update_session(
            TENANT, "s1", SessionPatch(set={"title": "second"}), expected_version=stale
        )
    assert (caught.value.expected, caught.value.actual) == (stale, current.version)
    assert await store.get_session(TENANT, "s1") == current


@pytest.mark.parametrize(
    "field", ["id", "tenant", "version", "last_seq", "created_at", "total_tokens", "nope"]
)
def test_a_patch_refuses_fields_that_are_not_settable(field: str) -> None:
    with pytest.raises(InvalidInputError, match="cannot set session field"):
        SessionPatch(set={field: 1})


@pytest.mark.parametrize("field", ["id", "version", "last_seq", "head_seq", "nope"])
def test_a_patch_refuses_counters_that_do_not_exist(field: str) -> None:
    with pytest.raises(InvalidInputError):
        SessionPatch(add={field: 1})


@pytest.mark.parametrize("data", [{"set": {"version": 9}}, {"add": {"last_seq": 1}}])
def test_a_patch_from_data_refuses_the_same_fields(data: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="cannot set session field"):
        SessionPatch.model_validate(data)
    with pytest.raises(ValueError, match="cannot set session field"):
        SessionPatch.model_validate_json(json.dumps(data))


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"title": 123}, InvalidPayloadError),
        ({"fresh_tokens": "many"}, InvalidPayloadError),
        ({"metadata": {"x": float("nan")}}, InvalidPayloadError),
        ({"metadata": "not a dict"}, InvalidPayloadError),
        ({"head_seq": 5}, InvalidInputError),
        ({"head_seq": -1}, InvalidInputError),
        ({"continued_to": "../escape"}, InvalidIdError),
    ],
    ids=["title", "counter", "nan", "metadata", "head-past-end", "head-negative", "id"],
)
async def test_an_invalid_update_raises_and_changes_nothing(
    store: Store, changes: dict[str, Any], error: type[Exception]
) -> None:
    await new_session(store, "s1")
    await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2")])
    before = await store.get_session(TENANT, "s1")
    with pytest.raises(error):
        await store.update_session(TENANT, "s1", SessionPatch(set=changes, add={"total_tokens": 1}))
    assert await store.get_session(TENANT, "s1") == before


async def test_an_update_over_the_size_limit_changes_nothing(open_test_store: StoreOpener) -> None:
    small = await open_test_store(max_payload_bytes=4096)
    before = await new_session(small, "s1")
    with pytest.raises(PayloadTooLargeError):
        await small.update_session(TENANT, "s1", SessionPatch(set={"state": {"x": "y" * 8192}}))
    assert await small.get_session(TENANT, "s1") == before


async def test_update_can_move_the_head_to_an_earlier_entry(store: Store) -> None:
    await new_session(store, "s1")
    await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2"), draft("e3")])
    moved = await store.update_session(TENANT, "s1", SessionPatch(set={"head_seq": 1}))
    assert (moved.head_seq, moved.last_seq) == (1, 3)
    result = await store.append_entries(TENANT, "s1", [draft("e4")])
    assert (result.entries[0].seq, result.entries[0].parent_seq) == (4, 1)
    assert (result.session.head_seq, result.session.last_seq) == (4, 4)


# -- delete --------------------------------------------------------------------------------


async def test_delete_removes_the_session_and_its_entries(store: Store) -> None:
    await new_session(store, "s1")
    await new_session(store, "s2")
    await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2")])
    await store.append_entries(TENANT, "s2", [draft("e1")])
    await store.delete_session(TENANT, "s1")
    with pytest.raises(NotFoundError):
        await store.get_session(TENANT, "s1")
    with pytest.raises(NotFoundError):
        await store.read_entries(TENANT, "s1")
    with pytest.raises(NotFoundError):
        await store.get_entry(TENANT, "s1", "e1")
    with pytest.raises(NotFoundError):
        await store.delete_session(TENANT, "s1")
    assert [s.id for s in (await store.list_sessions(TENANT, SessionQuery())).items] == ["s2"]
    assert await seqs_of(store, "s2") == [1]
    assert (await store.get_entry(TENANT, "s2", "e1")).seq == 1


async def test_a_deleted_id_can_be_reused_and_starts_empty(store: Store) -> None:
    await new_session(store, "s1", title="old")
    await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2")])
    await store.delete_session(TENANT, "s1")
    again = await new_session(store, "s1", title="new")
    assert (again.version, again.head_seq, again.last_seq, again.title) == (1, 0, 0, "new")
    assert await store.read_entries(TENANT, "s1") == []
    with pytest.raises(NotFoundError):
        await store.get_entry(TENANT, "s1", "e2")
    result = await store.append_entries(TENANT, "s1", [draft("e1")])
    assert not result.replayed
    assert [(e.seq, e.parent_seq) for e in result.entries] == [(1, None)]
    assert result.session.version == 2
