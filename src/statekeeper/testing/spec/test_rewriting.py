"""Rewriting stored payloads in place (the `REWRITE` capability): what `statekeeper reseal`
uses to move transcript entries and events to a new key.

``rewrite_entry_payloads(tenant, session_id, {entry_id: (expected, new)})`` and
``rewrite_event_payloads(tenant, log_id, {seq: (expected, new)})`` replace the payload of
each row still holding ``expected``; everything else about the row (seq, id, parent,
kind, timestamps, side flag) and the session head stay as they were, and appends go on.
See ``docs/stores.md``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from statekeeper.errors import (
    ConflictError,
    InvalidIdError,
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
)
from statekeeper.stores import Store
from statekeeper.stores.base import EntryDraft, Event, EventDraft
from statekeeper.testing.registry import REWRITE, needs

from .support import OTHER_TENANT, SAMPLE_PAYLOAD, TENANT, at, draft, new_session

NEW = {"sealed": "v2", "nested": SAMPLE_PAYLOAD}


async def rewrite_entries(store: Any, session_id: str, rewrites: dict[str, Any]) -> int:
    done: int = await store.rewrite_entry_payloads(TENANT, session_id, rewrites)
    return done


async def with_entries(store: Store) -> list[Any]:
    await new_session(store, "s1")
    side = EntryDraft(id="c1", kind="checkpoint", side=True, payload={"at": "c1"})
    result = await store.append_entries(TENANT, "s1", [draft("m1"), side, draft("m2")])
    return list(result.entries)


@needs(REWRITE)
async def test_an_entry_payload_is_rewritten_and_nothing_else(store: Store) -> None:
    before = await with_entries(store)
    head = await store.get_session(TENANT, "s1")
    done = await rewrite_entries(
        store, "s1", {"m1": (before[0].payload, NEW), "c1": (before[1].payload, {"x": 1})}
    )
    assert done == 2
    after = await store.read_entries(TENANT, "s1")
    assert [e._replace(payload={}) for e in after] == [e._replace(payload={}) for e in before]
    assert [e.payload for e in after] == [NEW, {"x": 1}, before[2].payload]
    assert (await store.get_entry(TENANT, "s1", "m1")).payload == NEW
    assert await store.get_session(TENANT, "s1") == head
    # Appends go on after it: next seq, the head's branch, idempotent retries judged on the
    # payload now stored.
    more = await store.append_entries(TENANT, "s1", [draft("m3")])
    assert [(e.seq, e.parent_seq) for e in more.entries] == [(4, 3)]
    again = await store.append_entries(
        TENANT, "s1", [EntryDraft(id="m1", payload=NEW)], move_head=False
    )
    assert again.replayed
    with pytest.raises(ConflictError):
        await store.append_entries(TENANT, "s1", [draft("m1")])


@needs(REWRITE)
async def test_a_changed_or_unknown_entry_is_left_alone(store: Store) -> None:
    before = await with_entries(store)
    rewrites = {"m1": ({"text": "something else"}, NEW), "gone": ({}, NEW)}
    assert await rewrite_entries(store, "s1", rewrites) == 0
    assert await rewrite_entries(store, "s1", {}) == 0
    assert await store.read_entries(TENANT, "s1") == before
    # Rewriting twice from the same expected payload: the second finds it changed.
    assert await rewrite_entries(store, "s1", {"m2": (before[2].payload, NEW)}) == 1
    assert await rewrite_entries(store, "s1", {"m2": (before[2].payload, {"y": 2})}) == 0
    assert (await store.get_entry(TENANT, "s1", "m2")).payload == NEW


@needs(REWRITE)
async def test_a_bad_entry_rewrite_is_refused_and_changes_nothing(store: Any) -> None:
    before = await with_entries(store)
    old = before[0].payload
    with pytest.raises(NotFoundError):
        await store.rewrite_entry_payloads(OTHER_TENANT, "s1", {"m1": (old, NEW)})
    with pytest.raises(NotFoundError):
        await rewrite_entries(store, "missing", {"m1": (old, NEW)})
    with pytest.raises(InvalidIdError):
        await rewrite_entries(store, "../s1", {"m1": (old, NEW)})
    with pytest.raises(InvalidIdError):
        await rewrite_entries(store, "s1", {"../m1": (old, NEW)})
    with pytest.raises(InvalidInputError):
        await rewrite_entries(store, "s1", {"m1": (old, ["not", "an", "object"])})
    with pytest.raises(InvalidInputError):
        await rewrite_entries(store, "s1", {"m1": NEW})
    big = {"text": "x" * (store.max_payload_bytes + 1)}
    with pytest.raises(PayloadTooLargeError):
        await rewrite_entries(store, "s1", {"m2": (before[2].payload, NEW), "m1": (old, big)})
    assert await store.read_entries(TENANT, "s1") == before


@needs(REWRITE)
async def test_appends_during_entry_rewrites_are_kept(store: Store) -> None:
    before = await with_entries(store)

    async def append(n: int) -> None:
        await store.append_entries(TENANT, "s1", [draft(f"n{n}")])

    async def rewrite(entry: Any) -> int:
        return await rewrite_entries(store, "s1", {entry.id: (entry.payload, NEW)})

    results = await asyncio.gather(*(append(n) for n in range(5)), *(rewrite(e) for e in before))
    assert results[5:] == [1, 1, 1]
    entries = {e.id: e for e in await store.read_entries(TENANT, "s1")}
    assert set(entries) == {"m1", "c1", "m2", *(f"n{n}" for n in range(5))}
    assert [entries[e.id].payload for e in before] == [NEW] * 3
    assert (await store.get_session(TENANT, "s1")).last_seq == 8


@needs(REWRITE)
async def test_appends_through_another_handle_survive_a_rewrite(
    store: Store, other_handle: Store
) -> None:
    before = await with_entries(store)
    await other_handle.append_entries(TENANT, "s1", [draft("o1")])
    assert await rewrite_entries(store, "s1", {"m1": (before[0].payload, NEW)}) == 1
    await other_handle.append_entries(TENANT, "s1", [draft("o2")])
    await store.append_entries(TENANT, "s1", [draft("m3")])
    entries = await other_handle.read_entries(TENANT, "s1")
    assert [(e.seq, e.id) for e in entries] == [
        (1, "m1"), (2, "c1"), (3, "m2"), (4, "o1"), (5, "o2"), (6, "m3"),
    ]  # fmt: skip
    assert entries[0].payload == NEW


# -- events ------------------------------------------------------------------------------


async def rewrite_events(store: Any, log_id: str, rewrites: dict[int, Any]) -> int:
    done: int = await store.rewrite_event_payloads(TENANT, log_id, rewrites)
    return done


def bare(stored: Event) -> tuple[Any, ...]:
    return (stored.log_id, stored.seq, stored.stream, stored.kind, stored.ts)


def event(n: int) -> EventDraft:
    return EventDraft(stream="tool", kind=f"k{n}", ts=at(n), payload={"n": n})


@needs(REWRITE)
async def test_an_event_payload_is_rewritten_and_nothing_else(store: Store) -> None:
    before = await store.append_events(TENANT, "log", [event(1), event(2), event(3)])
    assert await rewrite_events(store, "log", {2: ({"n": 2}, NEW), 3: ({"n": 0}, NEW)}) == 1
    after = await store.read_events(TENANT, "log")
    assert [bare(e) for e in after] == [bare(e) for e in before]
    assert [e.payload for e in after] == [{"n": 1}, NEW, {"n": 3}]
    more = await store.append_events(TENANT, "log", [event(4)])
    assert [e.seq for e in more] == [4]
    assert await rewrite_events(store, "log", {2: ({"n": 2}, {"again": 1})}) == 0
    assert await rewrite_events(store, "log", {9: ({}, NEW)}) == 0
    assert await rewrite_events(store, "empty", {1: ({}, NEW)}) == 0
    assert [e.payload for e in await store.read_events(TENANT, "log", after_seq=1)] == [
        NEW, {"n": 3}, {"n": 4},
    ]  # fmt: skip


@needs(REWRITE)
async def test_a_bad_event_rewrite_is_refused_and_changes_nothing(store: Any) -> None:
    before = await store.append_events(TENANT, "log", [event(1)])
    assert await store.rewrite_event_payloads(OTHER_TENANT, "log", {1: ({"n": 1}, NEW)}) == 0
    with pytest.raises(InvalidIdError):
        await rewrite_events(store, "../log", {1: ({"n": 1}, NEW)})
    with pytest.raises(InvalidInputError):
        await rewrite_events(store, "log", {0: ({"n": 1}, NEW)})
    with pytest.raises(InvalidInputError):
        await rewrite_events(store, "log", {1: ({"n": 1}, "text")})
    big = {"text": "x" * (store.max_payload_bytes + 1)}
    with pytest.raises(PayloadTooLargeError):
        await rewrite_events(store, "log", {1: ({"n": 1}, big)})
    assert await store.read_events(TENANT, "log") == before


@needs(REWRITE)
async def test_appends_during_event_rewrites_are_kept(store: Store) -> None:
    await store.append_events(TENANT, "log", [event(n) for n in range(1, 4)])

    async def rewrite(seq: int) -> int:
        return await rewrite_events(store, "log", {seq: ({"n": seq}, NEW)})

    async def append(n: int) -> None:
        await store.append_events(TENANT, "log", [event(n)])

    results = await asyncio.gather(
        *(rewrite(s) for s in (1, 2, 3)), *(append(n) for n in range(4, 9))
    )
    assert results[:3] == [1, 1, 1]
    events = await store.read_events(TENANT, "log")
    assert [e.seq for e in events] == list(range(1, 9))
    assert [e.payload for e in events[:3]] == [NEW] * 3
    assert sorted(e.payload["n"] for e in events[3:]) == list(range(4, 9))
