"""Concurrent callers in one process: no lost, duplicated or interleaved writes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from statekeeper.errors import AlreadyExistsError, ConflictError
from statekeeper.stores import Store
from statekeeper.stores.base import EventDraft, SessionPatch, SessionRecord

from .support import TENANT, draft, new_session

T = TypeVar("T")


async def settle(calls: list[Awaitable[T]]) -> tuple[list[T], list[BaseException]]:
    """Run the calls concurrently; their results and their errors."""
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    results: list[T] = []
    errors: list[BaseException] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            errors.append(outcome)
        else:
            results.append(outcome)
    return results, errors


async def test_concurrent_appends_all_land_in_one_valid_chain(store: Store) -> None:
    created = await new_session(store, "s1")
    patch = SessionPatch(add={"message_count": 1, "total_tokens": 3})
    results, errors = await settle(
        [store.append_entries(TENANT, "s1", [draft(f"e{i}")], patch=patch) for i in range(50)]
    )
    assert errors == []
    assert sorted(e.seq for r in results for e in r.entries) == list(range(1, 51))
    entries = await store.read_entries(TENANT, "s1")
    assert [e.seq for e in entries] == list(range(1, 51))
    assert [e.parent_seq for e in entries] == [None, *range(1, 50)]
    assert sorted(e.id for e in entries) == sorted(f"e{i}" for i in range(50))
    session = await store.get_session(TENANT, "s1")
    assert (session.head_seq, session.last_seq) == (50, 50)
    assert (session.message_count, session.total_tokens) == (50, 150)
    assert session.version == created.version + 50


async def test_concurrent_batches_never_interleave(store: Store) -> None:
    await new_session(store, "s1")
    results, errors = await settle(
        [
            store.append_entries(TENANT, "s1", [draft(f"b{b}-{i}") for i in range(5)])
            for b in range(10)
        ]
    )
    assert errors == []
    for result in results:
        seqs = [e.seq for e in result.entries]
        assert seqs == list(range(seqs[0], seqs[0] + 5))
    entries = await store.read_entries(TENANT, "s1")
    assert [e.seq for e in entries] == list(range(1, 51))
    for batch_start in range(0, 50, 5):
        prefixes = {e.id.split("-")[0] for e in entries[batch_start : batch_start + 5]}
        assert len(prefixes) == 1


async def test_concurrent_updates_with_one_expected_version_let_one_win(store: Store) -> None:
    created = await new_session(store, "s1")
    results, errors = await settle(
        [
            store.update_session(
                TENANT,
                "s1",
                SessionPatch(set={"title": f"writer {i}"}, add={"message_count": 1}),
                expected_version=created.version,
            )
            for i in range(20)
        ]
    )
    assert len(results) == 1
    assert len(errors) == 19
    assert all(isinstance(e, ConflictError) for e in errors)
    session = await store.get_session(TENANT, "s1")
    assert session == results[0]
    assert (session.version, session.message_count) == (created.version + 1, 1)


async def test_concurrent_appends_with_one_expected_version_let_one_win(store: Store) -> None:
    created = await new_session(store, "s1")
    results, errors = await settle(
        [
            store.append_entries(
                TENANT, "s1", [draft(f"e{i}"), draft(f"f{i}")], expected_version=created.version
            )
            for i in range(20)
        ]
    )
    assert len(results) == 1
    assert len(errors) == 19
    assert all(isinstance(e, ConflictError) for e in errors)
    assert await store.read_entries(TENANT, "s1") == results[0].entries


async def test_concurrent_creates_of_one_id_let_one_win(store: Store) -> None:
    results, errors = await settle(
        [
            store.create_session(SessionRecord(id="s1", tenant=TENANT, title=str(i)))
            for i in range(20)
        ]
    )
    assert len(results) == 1
    assert all(isinstance(e, AlreadyExistsError) for e in errors)
    assert len(errors) == 19
    assert (await store.get_session(TENANT, "s1")).title == results[0].title


async def test_concurrent_create_only_puts_let_one_win(store: Store) -> None:
    results, errors = await settle(
        [store.put_record(TENANT, "ns", "k", i, expected_version=0) for i in range(20)]
    )
    assert len(results) == 1
    assert len(errors) == 19
    assert all(isinstance(e, ConflictError) for e in errors)
    assert await store.get_record(TENANT, "ns", "k") == results[0]


async def test_concurrent_record_updates_are_not_lost(store: Store) -> None:
    results, errors = await settle([store.put_record(TENANT, "ns", "k", i) for i in range(30)])
    assert errors == []
    assert sorted(r.version for r in results) == list(range(1, 31))
    assert (await store.get_record(TENANT, "ns", "k")).version == 30


async def test_concurrent_event_appends_get_distinct_contiguous_seqs(store: Store) -> None:
    results, errors = await settle(
        [
            store.append_events(TENANT, "log", [EventDraft(stream="s", kind=f"k{i}")] * 3)
            for i in range(20)
        ]
    )
    assert errors == []
    for batch in results:
        assert [e.seq for e in batch] == list(range(batch[0].seq, batch[0].seq + 3))
    assert sorted(e.seq for batch in results for e in batch) == list(range(1, 61))
    assert [e.seq for e in await store.read_events(TENANT, "log")] == list(range(1, 61))


async def test_concurrent_appends_to_many_sessions(store: Store) -> None:
    for i in range(10):
        await new_session(store, f"s{i}")
    _, errors = await settle(
        [store.append_entries(TENANT, f"s{i % 10}", [draft(f"e{i}")]) for i in range(60)]
    )
    assert errors == []
    for i in range(10):
        entries = await store.read_entries(TENANT, f"s{i}")
        assert [e.seq for e in entries] == [1, 2, 3, 4, 5, 6]
        assert [e.parent_seq for e in entries] == [None, 1, 2, 3, 4, 5]
