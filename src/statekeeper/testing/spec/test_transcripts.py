"""Transcript entries: appends, parents and branches, atomic batches, idempotent retries."""

from __future__ import annotations

from typing import Any

import pytest

from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    InvalidPayloadError,
    NotFoundError,
    PayloadTooLargeError,
)
from statekeeper.stores import Store
from statekeeper.stores.base import EntryDraft, SessionPatch, SessionRecord
from statekeeper.testing.plugin import StoreOpener

from .support import (
    TENANT,
    draft,
    new_session,
    seqs_of,
)


async def links(store: Store, session_id: str) -> list[tuple[int, int | None]]:
    """(seq, parent_seq) of every stored entry, in order."""
    return [(e.seq, e.parent_seq) for e in await store.read_entries(TENANT, session_id)]


async def with_entries(store: Store, session_id: str, count: int) -> SessionRecord:
    """A new session holding ``count`` chained entries e1..e<count>."""
    await new_session(store, session_id)
    drafts = [draft(f"e{i}") for i in range(1, count + 1)]
    return (await store.append_entries(TENANT, session_id, drafts)).session


async def assert_unchanged(store: Store, before: SessionRecord) -> None:
    """The session and its transcript are exactly as they were."""
    assert await store.get_session(TENANT, before.id) == before
    assert await seqs_of(store, before.id) == list(range(1, before.last_seq + 1))


# -- appending and parents -----------------------------------------------------------------


async def test_append_one_entry(store: Store) -> None:
    created = await new_session(store, "s1")
    sent = EntryDraft(id="e1", payload={"text": "hi"})
    result = await store.append_entries(TENANT, "s1", [sent])
    assert not result.replayed
    [entry] = result.entries
    assert (entry.seq, entry.id, entry.parent_seq, entry.kind) == (1, "e1", None, "message")
    assert (entry.payload, entry.created_at) == ({"text": "hi"}, sent.created_at)
    session = result.session
    assert (session.head_seq, session.last_seq) == (1, 1)
    assert session.version == created.version + 1
    assert await store.get_session(TENANT, "s1") == session
    assert await store.read_entries(TENANT, "s1") == result.entries


async def test_appends_chain_from_the_head_with_contiguous_seqs(store: Store) -> None:
    created = await new_session(store, "s1")
    first = await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2"), draft("e3")])
    assert [(e.seq, e.parent_seq) for e in first.entries] == [(1, None), (2, 1), (3, 2)]
    assert first.session.version == created.version + 1
    second = await store.append_entries(TENANT, "s1", [draft("e4"), draft("e5")])
    assert [(e.seq, e.parent_seq) for e in second.entries] == [(4, 3), (5, 4)]
    assert (second.session.head_seq, second.session.last_seq) == (5, 5)
    assert second.session.version == created.version + 2
    assert await store.read_entries(TENANT, "s1") == first.entries + second.entries


async def test_a_none_parent_starts_a_new_root(store: Store) -> None:
    await with_entries(store, "s1", 2)
    root = await store.append_entries(TENANT, "s1", [draft("r", parent=None)])
    assert [(e.seq, e.parent_seq) for e in root.entries] == [(3, None)]
    assert root.session.head_seq == 3
    after = await store.append_entries(TENANT, "s1", [draft("r2")])
    assert [(e.seq, e.parent_seq) for e in after.entries] == [(4, 3)]


async def test_an_explicit_parent_branches_and_moves_the_head(store: Store) -> None:
    await with_entries(store, "s1", 3)
    branch = await store.append_entries(TENANT, "s1", [draft("b1", parent=1), draft("b2")])
    assert [(e.seq, e.parent_seq) for e in branch.entries] == [(4, 1), (5, 4)]
    assert (branch.session.head_seq, branch.session.last_seq) == (5, 5)
    tip = await store.append_entries(TENANT, "s1", [draft("b3")])
    assert [(e.seq, e.parent_seq) for e in tip.entries] == [(6, 5)]


async def test_a_branch_without_moving_the_head(store: Store) -> None:
    await with_entries(store, "s1", 3)
    side = await store.append_entries(
        TENANT, "s1", [draft("x1", parent=2), draft("x2")], move_head=False
    )
    assert [(e.seq, e.parent_seq) for e in side.entries] == [(4, 2), (5, 4)]
    assert (side.session.head_seq, side.session.last_seq) == (3, 5)
    detached = await store.append_entries(TENANT, "s1", [draft("x3")], move_head=False)
    assert [(e.seq, e.parent_seq) for e in detached.entries] == [(6, 3)]
    assert (detached.session.head_seq, detached.session.last_seq) == (3, 6)
    main = await store.append_entries(TENANT, "s1", [draft("m1")])
    assert [(e.seq, e.parent_seq) for e in main.entries] == [(7, 3)]
    assert (main.session.head_seq, main.session.last_seq) == (7, 7)


async def test_a_parent_may_be_an_earlier_entry_of_the_same_batch(store: Store) -> None:
    await with_entries(store, "s1", 2)
    result = await store.append_entries(
        TENANT, "s1", [draft("a"), draft("b", parent=None), draft("c", parent=3)]
    )
    assert [(e.seq, e.parent_seq) for e in result.entries] == [(3, 2), (4, None), (5, 3)]
    assert result.session.head_seq == 5


@pytest.mark.parametrize(
    "parent", [0, -1, 4, 5, 99], ids=["zero", "negative", "self", "next", "far"]
)
async def test_an_invalid_parent_raises_and_writes_nothing(store: Store, parent: int) -> None:
    before = await with_entries(store, "s1", 2)
    # The bad draft comes second (seq 4 if written): seq 4 and later are not yet entries.
    with pytest.raises(InvalidInputError):
        await store.append_entries(TENANT, "s1", [draft("ok"), draft("bad", parent=parent)])
    await assert_unchanged(store, before)
    with pytest.raises(NotFoundError):
        await store.get_entry(TENANT, "s1", "ok")


# -- atomic batches ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), object(), b"bytes", {1, 2}],
    ids=["nan", "inf", "object", "bytes", "set"],
)
async def test_a_batch_with_one_non_json_entry_writes_nothing(store: Store, value: Any) -> None:
    before = await with_entries(store, "s1", 1)
    drafts = [
        draft("good1"),
        EntryDraft(id="bad", payload={"v": [1, {"deep": value}]}),
        draft("g2"),
    ]
    with pytest.raises(InvalidPayloadError):
        await store.append_entries(
            TENANT, "s1", drafts, patch=SessionPatch(add={"message_count": 3})
        )
    await assert_unchanged(store, before)
    for entry_id in ("good1", "bad", "g2"):
        with pytest.raises(NotFoundError):
            await store.get_entry(TENANT, "s1", entry_id)


async def test_a_batch_with_one_oversized_entry_writes_nothing(
    open_test_store: StoreOpener,
) -> None:
    small = await open_test_store(max_payload_bytes=4096)
    before = await with_entries(small, "s1", 1)
    drafts = [draft("good"), draft("big", blob="x" * 5000), draft("good2")]
    with pytest.raises(PayloadTooLargeError):
        await small.append_entries(TENANT, "s1", drafts)
    await assert_unchanged(small, before)
    fits = await small.append_entries(TENANT, "s1", [draft("fits", blob="x" * 3000)])
    assert [e.seq for e in fits.entries] == [2]


async def test_an_invalid_patch_fails_the_append(store: Store) -> None:
    before = await with_entries(store, "s1", 1)
    with pytest.raises(InvalidInputError):
        await store.append_entries(
            TENANT, "s1", [draft("e2")], patch=SessionPatch(set={"head_seq": 99}), move_head=False
        )
    with pytest.raises(InvalidPayloadError):
        await store.append_entries(
            TENANT, "s1", [draft("e2")], patch=SessionPatch(set={"title": ["not", "text"]})
        )
    await assert_unchanged(store, before)


async def test_an_empty_batch_is_refused(store: Store) -> None:
    before = await with_entries(store, "s1", 1)
    with pytest.raises(InvalidInputError):
        await store.append_entries(TENANT, "s1", [])
    await assert_unchanged(store, before)


async def test_an_id_twice_in_one_batch_is_refused(store: Store) -> None:
    before = await with_entries(store, "s1", 1)
    with pytest.raises(InvalidInputError):
        await store.append_entries(TENANT, "s1", [draft("d"), draft("x"), draft("d")])
    await assert_unchanged(store, before)


# -- compare-and-set -----------------------------------------------------------------------


async def test_append_with_the_current_version_succeeds(store: Store) -> None:
    created = await new_session(store, "s1")
    first = await store.append_entries(
        TENANT, "s1", [draft("e1")], expected_version=created.version
    )
    second = await store.append_entries(
        TENANT, "s1", [draft("e2")], expected_version=first.session.version
    )
    assert [e.seq for e in second.entries] == [2]


async def test_append_with_a_stale_version_conflicts_and_writes_nothing(store: Store) -> None:
    created = await new_session(store, "s1")
    await store.update_session(TENANT, "s1", SessionPatch(set={"title": "moved on"}))
    before = await store.get_session(TENANT, "s1")
    with pytest.raises(ConflictError) as caught:
        await store.append_entries(TENANT, "s1", [draft("e1")], expected_version=created.version)
    assert (caught.value.expected, caught.value.actual) == (created.version, before.version)
    await assert_unchanged(store, before)


# -- idempotent retries --------------------------------------------------------------------


async def test_retrying_an_append_replays_the_stored_entries(store: Store) -> None:
    created = await new_session(store, "s1")
    payloads = [{"text": "one", "n": [1, 2]}, {"text": "two", "nested": {"k": None}}]
    patch = SessionPatch(add={"message_count": 2, "total_tokens": 7})

    def drafts() -> list[EntryDraft]:
        # Rebuilt as a retry after a crash would: same ids and payloads, new objects.
        return [EntryDraft(id=f"e{i}", payload=p) for i, p in enumerate(payloads, start=1)]

    first = await store.append_entries(
        TENANT, "s1", drafts(), expected_version=created.version, patch=patch
    )
    stored = await store.read_entries(TENANT, "s1")
    # The retry still carries the version the first attempt expected: now stale.
    again = await store.append_entries(
        TENANT, "s1", drafts(), expected_version=created.version, patch=patch
    )
    assert again.replayed
    assert again.entries == stored
    assert again.session == first.session == await store.get_session(TENANT, "s1")
    assert (again.session.message_count, again.session.total_tokens) == (2, 7)
    assert await store.read_entries(TENANT, "s1") == stored
    part = await store.append_entries(TENANT, "s1", drafts()[1:])
    assert part.replayed
    assert part.entries == stored[1:]
    assert part.session == first.session


async def test_a_replay_compares_payloads_as_json(store: Store) -> None:
    await new_session(store, "s1")
    first = await store.append_entries(TENANT, "s1", [draft("e1", pair=(1, 2))])
    again = await store.append_entries(TENANT, "s1", [draft("e1", pair=[1, 2])])
    assert again.replayed
    assert again.session == first.session


@pytest.mark.parametrize("change", ["payload", "kind"])
async def test_a_reused_id_with_other_content_conflicts(store: Store, change: str) -> None:
    await new_session(store, "s1")
    await store.append_entries(TENANT, "s1", [EntryDraft(id="e1", payload={"text": "one"})])
    before = await store.get_session(TENANT, "s1")
    other = (
        EntryDraft(id="e1", payload={"text": "changed"})
        if change == "payload"
        else EntryDraft(id="e1", kind="marker", payload={"text": "one"})
    )
    with pytest.raises(ConflictError):
        await store.append_entries(TENANT, "s1", [other])
    await assert_unchanged(store, before)
    assert (await store.get_entry(TENANT, "s1", "e1")).payload == {"text": "one"}


async def test_mixing_stored_and_new_entries_conflicts(store: Store) -> None:
    before = await with_entries(store, "s1", 2)
    with pytest.raises(ConflictError):
        await store.append_entries(TENANT, "s1", [draft("e2"), draft("new")])
    await assert_unchanged(store, before)
    with pytest.raises(NotFoundError):
        await store.get_entry(TENANT, "s1", "new")


async def test_the_same_entry_id_in_two_sessions_is_two_entries(store: Store) -> None:
    await with_entries(store, "s1", 2)
    await new_session(store, "s2")
    result = await store.append_entries(TENANT, "s2", [draft("e2", other=True)])
    assert not result.replayed
    assert [(e.seq, e.payload) for e in result.entries] == [(1, {"text": "e2", "other": True})]
    assert (await store.get_entry(TENANT, "s1", "e2")).payload == {"text": "e2"}


# -- reading -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ({}, list(range(1, 11))),
        ({"after_seq": 3}, list(range(4, 11))),
        ({"until_seq": 5}, [1, 2, 3, 4, 5]),
        ({"after_seq": 3, "until_seq": 7}, [4, 5, 6, 7]),
        ({"after_seq": 3, "until_seq": 7, "limit": 2}, [4, 5]),
        ({"limit": 3}, [1, 2, 3]),
        ({"after_seq": 8, "limit": 5}, [9, 10]),
        ({"after_seq": 10}, []),
        ({"after_seq": 50}, []),
        ({"until_seq": 50}, list(range(1, 11))),
        ({"after_seq": 6, "until_seq": 4}, []),
        ({"until_seq": 0}, []),
    ],
    ids=lambda v: (
        ",".join(f"{k}={n}" for k, n in v.items()) or "all" if isinstance(v, dict) else ""
    ),
)
async def test_read_entries_window(
    store: Store, window: dict[str, int], expected: list[int]
) -> None:
    await with_entries(store, "s1", 10)
    entries = await store.read_entries(TENANT, "s1", **window)
    assert [e.seq for e in entries] == expected
    assert [e.id for e in entries] == [f"e{seq}" for seq in expected]


async def test_read_entries_with_limit_zero_returns_nothing(store: Store) -> None:
    await with_entries(store, "s1", 3)
    assert await store.read_entries(TENANT, "s1", limit=0) == []


async def test_read_entries_with_a_negative_limit_is_refused(store: Store) -> None:
    await with_entries(store, "s1", 3)
    with pytest.raises(InvalidInputError):
        await store.read_entries(TENANT, "s1", limit=-1)


@pytest.mark.parametrize("window", [{"after_seq": 2**63}, {"until_seq": 10**20}, {"limit": 2**63}])
async def test_read_entries_with_a_number_of_2_63_or_more_is_refused(
    store: Store, window: dict[str, int]
) -> None:
    await with_entries(store, "s1", 3)
    with pytest.raises(InvalidInputError, match="2\\*\\*63"):
        await store.read_entries(TENANT, "s1", **window)
    assert await seqs_of(store, "s1") == [1, 2, 3]


async def test_get_entry_by_id(store: Store) -> None:
    await with_entries(store, "s1", 3)
    await with_entries(store, "s2", 1)
    entries = await store.read_entries(TENANT, "s1")
    for entry in entries:
        assert await store.get_entry(TENANT, "s1", entry.id) == entry
    with pytest.raises(NotFoundError):
        await store.get_entry(TENANT, "s1", "e9")
    with pytest.raises(NotFoundError):
        await store.get_entry(TENANT, "s2", "e2")
