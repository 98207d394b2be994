"""Transcript entries as data: exact payloads, timestamps, copies, counters, any history."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.errors import InvalidInputError, InvalidPayloadError, NotFoundError
from statekeeper.stores import Store
from statekeeper.stores.base import EntryDraft, SessionPatch

from .support import (
    SAMPLE_PAYLOAD,
    TENANT,
    assert_same_json,
    draft,
    fresh_id,
    hypothesis_settings,
    json_objects,
    new_session,
    seqs_of,
)


async def test_payloads_round_trip_exactly(store: Store) -> None:
    await new_session(store, "s1")
    result = await store.append_entries(
        TENANT, "s1", [EntryDraft(id="e1", payload=copy.deepcopy(SAMPLE_PAYLOAD))]
    )
    assert_same_json(result.entries[0].payload, SAMPLE_PAYLOAD)
    assert_same_json((await store.read_entries(TENANT, "s1"))[0].payload, SAMPLE_PAYLOAD)
    assert_same_json((await store.get_entry(TENANT, "s1", "e1")).payload, SAMPLE_PAYLOAD)


@hypothesis_settings
@given(payloads=st.lists(json_objects, min_size=1, max_size=3))
async def test_any_json_object_payload_round_trips(
    store: Store, payloads: list[dict[str, Any]]
) -> None:
    session_id = fresh_id("s")
    await new_session(store, session_id)
    drafts = [EntryDraft(id=f"e{i}", payload=p) for i, p in enumerate(payloads)]
    await store.append_entries(TENANT, session_id, drafts)
    for entry, sent in zip(await store.read_entries(TENANT, session_id), payloads, strict=True):
        assert_same_json(entry.payload, sent)


async def test_append_returns_the_entries_as_a_read_returns_them(store: Store) -> None:
    await new_session(store, "s1")
    sent = EntryDraft(id="e1", payload={"pair": (1, 2), "nested": {"t": ("a",)}})
    result = await store.append_entries(TENANT, "s1", [sent])
    assert result.entries == await store.read_entries(TENANT, "s1")
    assert result.entries[0].payload == {"pair": [1, 2], "nested": {"t": ["a"]}}
    assert result.entries[0].payload is not sent.payload


async def test_kind_and_created_at_round_trip(store: Store) -> None:
    await new_session(store, "s1")
    plus_two = timezone(timedelta(hours=2))
    stamps = [
        datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=plus_two),
    ]
    drafts = [
        EntryDraft(id="e1", kind="tool-result", payload={}, created_at=stamps[0]),
        EntryDraft(id="e2", kind="compaction", payload={"n": 1}, created_at=stamps[1]),
    ]
    await store.append_entries(TENANT, "s1", drafts)
    entries = await store.read_entries(TENANT, "s1")
    assert [e.kind for e in entries] == ["tool-result", "compaction"]
    assert [e.created_at for e in entries] == stamps
    assert all(e.created_at.tzinfo is not None for e in entries)


def test_a_draft_refuses_a_naive_created_at() -> None:
    with pytest.raises(ValueError, match="timezone"):
        EntryDraft(id="e1", payload={}, created_at=datetime(2030, 1, 1))


async def test_a_lone_surrogate_is_not_json_text(store: Store) -> None:
    """Not valid Unicode, so not storable as UTF-8 by any durable backend: refuse it."""
    await new_session(store, "s1")
    with pytest.raises(InvalidPayloadError):
        await store.append_entries(TENANT, "s1", [draft("e1", bad="\ud800")])
    assert await seqs_of(store, "s1") == []


# -- copies ------------------------------------------------------------------------------


async def test_returned_payloads_are_copies(store: Store) -> None:
    await new_session(store, "s1")
    sent = {"list": [1, 2], "map": {"k": "v"}}
    result = await store.append_entries(TENANT, "s1", [EntryDraft(id="e1", payload=sent)])
    result.entries[0].payload["map"]["k"] = "changed by the caller"
    read = await store.read_entries(TENANT, "s1")
    read[0].payload["list"].append(3)
    got = await store.get_entry(TENANT, "s1", "e1")
    got.payload["new"] = True
    assert (await store.get_entry(TENANT, "s1", "e1")).payload == {
        "list": [1, 2],
        "map": {"k": "v"},
    }


async def test_changing_a_draft_after_append_does_not_change_the_entry(store: Store) -> None:
    await new_session(store, "s1")
    payload: dict[str, Any] = {"list": [1], "map": {"k": "v"}}
    sent = EntryDraft(id="e1", payload=payload)
    await store.append_entries(TENANT, "s1", [sent])
    payload["list"].append(2)
    sent.payload["map"]["k"] = "changed"
    assert (await store.get_entry(TENANT, "s1", "e1")).payload == {"list": [1], "map": {"k": "v"}}


# -- the head changes with the append --------------------------------------------------------


async def test_a_patch_applies_with_the_append(store: Store) -> None:
    created = await new_session(store, "s1")
    patch = SessionPatch(
        set={"title": "chat", "state": {"step": 1}},
        add={"message_count": 2, "total_tokens": 30, "fresh_tokens": 30},
    )
    result = await store.append_entries(TENANT, "s1", [draft("e1"), draft("e2")], patch=patch)
    session = result.session
    assert (session.title, session.state) == ("chat", {"step": 1})
    assert (session.message_count, session.total_tokens, session.fresh_tokens) == (2, 30, 30)
    assert (session.head_seq, session.last_seq, session.version) == (2, 2, created.version + 1)
    assert await store.get_session(TENANT, "s1") == session


async def test_a_failed_append_applies_no_part_of_its_patch(store: Store) -> None:
    await new_session(store, "s1")
    before = (await store.append_entries(TENANT, "s1", [draft("e1")])).session
    patch = SessionPatch(set={"title": "never"}, add={"message_count": 1})
    with pytest.raises(InvalidPayloadError):
        await store.append_entries(TENANT, "s1", [draft("e2", bad=float("nan"))], patch=patch)
    with pytest.raises(InvalidInputError):
        await store.append_entries(TENANT, "s1", [draft("e2", parent=7)], patch=patch)
    assert await store.get_session(TENANT, "s1") == before
    with pytest.raises(NotFoundError):
        await store.get_entry(TENANT, "s1", "e2")


# -- any history -------------------------------------------------------------------------


@hypothesis_settings
@given(data=st.data())
async def test_any_sequence_of_appends_keeps_a_contiguous_linked_log(
    store: Store, data: st.DataObject
) -> None:
    session_id = fresh_id("s")
    created = await new_session(store, session_id)
    head = last = 0
    expected: list[tuple[int, int | None]] = []
    for batch_number in range(1, data.draw(st.integers(1, 5), label="batches") + 1):
        move_head = data.draw(st.booleans(), label="move_head")
        drafts: list[EntryDraft] = []
        previous = head or None
        tip = head
        seq = last
        for _ in range(data.draw(st.integers(1, 4), label="batch size")):
            seq += 1
            choices: list[Any] = ["head", None] + ([seq - 1, 1] if seq > 1 else [])
            parent = data.draw(st.sampled_from(choices), label="parent")
            # A side entry (a checkpoint) never becomes the tip nor a "head" parent.
            is_side = data.draw(st.sampled_from([False, False, True]), label="side")
            drafts.append(
                EntryDraft(id=f"e{seq}", parent=parent, side=is_side, payload={"seq": seq})
            )
            expected.append((seq, previous if parent == "head" else parent))
            if not is_side:
                previous = tip = seq
        result = await store.append_entries(TENANT, session_id, drafts, move_head=move_head)
        last = seq
        head = tip if move_head else head
        assert [(e.seq, e.parent_seq) for e in result.entries] == expected[-len(drafts) :]
        session = result.session
        assert (session.head_seq, session.last_seq) == (head, last)
        assert session.version == created.version + batch_number
    entries = await store.read_entries(TENANT, session_id)
    assert [(e.seq, e.parent_seq) for e in entries] == expected
    assert [e.payload["seq"] for e in entries] == list(range(1, last + 1))
    assert await store.get_session(TENANT, session_id) == session
