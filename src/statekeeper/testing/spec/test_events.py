"""Event logs: gap-free sequence numbers, reading from a position, deletion, bad payloads."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.errors import InvalidInputError, InvalidPayloadError, PayloadTooLargeError
from statekeeper.stores import Store
from statekeeper.stores.base import EventDraft
from statekeeper.testing.plugin import StoreOpener

from .support import (
    SAMPLE_PAYLOAD,
    TENANT,
    assert_same_json,
    fresh_id,
    hypothesis_settings,
)

LOG = "run-1"


def event(n: int, **payload: Any) -> EventDraft:
    return EventDraft(stream="lifecycle", kind=f"k{n}", payload={"n": n, **payload})


async def seqs(store: Store, log_id: str = LOG, **options: Any) -> list[int]:
    return [e.seq for e in await store.read_events(TENANT, log_id, **options)]


async def test_appends_number_events_from_1_without_gaps(store: Store) -> None:
    first = await store.append_events(TENANT, LOG, [event(1)])
    second = await store.append_events(TENANT, LOG, [event(2), event(3), event(4)])
    third = await store.append_events(TENANT, LOG, [event(5)])
    assert [e.seq for e in first + second + third] == [1, 2, 3, 4, 5]
    assert [e.payload["n"] for e in first + second + third] == [1, 2, 3, 4, 5]
    assert await store.read_events(TENANT, LOG) == first + second + third


async def test_an_event_round_trips(store: Store) -> None:
    stamp = datetime(2031, 5, 6, 7, 8, 9, 101112, tzinfo=timezone(timedelta(hours=-5)))
    sent = EventDraft(
        stream="tool", kind="call.start", payload=copy.deepcopy(SAMPLE_PAYLOAD), ts=stamp
    )
    [stored] = await store.append_events(TENANT, LOG, [sent])
    [read] = await store.read_events(TENANT, LOG)
    for got in (stored, read):
        assert (got.log_id, got.seq, got.stream, got.kind, got.ts) == (
            LOG,
            1,
            "tool",
            "call.start",
            stamp,
        )
        assert got.ts.tzinfo is not None
        assert_same_json(got.payload, SAMPLE_PAYLOAD)


async def test_an_event_has_a_default_timestamp_and_empty_payload(store: Store) -> None:
    before = datetime.now(UTC)
    [stored] = await store.append_events(TENANT, LOG, [EventDraft(stream="s", kind="k")])
    assert stored.payload == {}
    assert before - timedelta(seconds=1) <= stored.ts <= datetime.now(UTC) + timedelta(seconds=1)


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ({}, [1, 2, 3, 4, 5, 6]),
        ({"after_seq": 2}, [3, 4, 5, 6]),
        ({"after_seq": 2, "limit": 2}, [3, 4]),
        ({"limit": 1}, [1]),
        ({"after_seq": 5, "limit": 10}, [6]),
        ({"after_seq": 6}, []),
        ({"after_seq": 60}, []),
    ],
    ids=lambda v: (
        ",".join(f"{k}={n}" for k, n in v.items()) or "all" if isinstance(v, dict) else ""
    ),
)
async def test_read_from_a_position(
    store: Store, window: dict[str, int], expected: list[int]
) -> None:
    await store.append_events(TENANT, LOG, [event(n) for n in range(1, 7)])
    events = await store.read_events(TENANT, LOG, **window)
    assert [e.seq for e in events] == expected
    assert [e.payload["n"] for e in events] == expected


async def test_read_with_limit_zero_returns_nothing(store: Store) -> None:
    await store.append_events(TENANT, LOG, [event(1), event(2)])
    assert await store.read_events(TENANT, LOG, limit=0) == []


async def test_read_with_a_negative_limit_is_refused(store: Store) -> None:
    await store.append_events(TENANT, LOG, [event(1), event(2)])
    with pytest.raises(InvalidInputError):
        await store.read_events(TENANT, LOG, limit=-1)


@pytest.mark.parametrize(
    "window", [{"after_seq": 2**63}, {"after_seq": 10**20}, {"limit": 2**63}, {"limit": 10**20}]
)
async def test_a_seq_or_limit_of_2_63_or_more_is_bad_input(
    store: Store, window: dict[str, int]
) -> None:
    """No backend holds such a number: it is a typed input error, not a driver's
    overflow or a store failure."""
    await store.append_events(TENANT, LOG, [event(1)])
    with pytest.raises(InvalidInputError, match="2\\*\\*63"):
        await store.read_events(TENANT, LOG, **window)
    assert [e.seq for e in await store.read_events(TENANT, LOG)] == [1]


async def test_logs_are_independent(store: Store) -> None:
    await store.append_events(TENANT, "a", [event(1), event(2)])
    [b1] = await store.append_events(TENANT, "b", [event(10)])
    [a3] = await store.append_events(TENANT, "a", [event(3)])
    assert (b1.seq, b1.log_id, a3.seq, a3.log_id) == (1, "b", 3, "a")
    assert await seqs(store, "a") == [1, 2, 3]
    assert [e.payload["n"] for e in await store.read_events(TENANT, "b")] == [10]
    assert await store.read_events(TENANT, "never-written") == []


async def test_delete_a_log(store: Store) -> None:
    await store.append_events(TENANT, LOG, [event(1), event(2)])
    await store.append_events(TENANT, "other", [event(1)])
    await store.delete_event_log(TENANT, LOG)
    assert await store.read_events(TENANT, LOG) == []
    assert await seqs(store, "other") == [1]
    await store.delete_event_log(TENANT, LOG)
    await store.delete_event_log(TENANT, "never-written")
    [again] = await store.append_events(TENANT, LOG, [event(3)])
    assert again.seq == 1


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), object(), b"bytes", {1}],
    ids=["nan", "inf", "object", "bytes", "set"],
)
async def test_a_non_json_payload_fails_the_batch_and_uses_no_seq(store: Store, value: Any) -> None:
    await store.append_events(TENANT, LOG, [event(1)])
    with pytest.raises(InvalidPayloadError):
        await store.append_events(TENANT, LOG, [event(2), event(3, bad=[value]), event(4)])
    assert await seqs(store) == [1]
    [next_event] = await store.append_events(TENANT, LOG, [event(5)])
    assert next_event.seq == 2


async def test_an_oversized_payload_fails_the_batch(open_test_store: StoreOpener) -> None:
    small = await open_test_store(max_payload_bytes=1000)
    await small.append_events(TENANT, LOG, [event(1)])
    with pytest.raises(PayloadTooLargeError):
        await small.append_events(TENANT, LOG, [event(2), event(3, blob="x" * 2000)])
    assert [e.seq for e in await small.read_events(TENANT, LOG)] == [1]


def test_a_draft_refuses_a_naive_timestamp() -> None:
    with pytest.raises(ValueError, match="timezone"):
        EventDraft(stream="s", kind="k", ts=datetime(2030, 1, 1))


async def test_a_lone_surrogate_is_refused(store: Store) -> None:
    with pytest.raises(InvalidPayloadError):
        await store.append_events(TENANT, LOG, [event(1, bad="\ud800")])
    assert await store.read_events(TENANT, LOG) == []


async def test_returned_payloads_are_copies(store: Store) -> None:
    sent: dict[str, Any] = {"list": [1]}
    [stored] = await store.append_events(
        TENANT, LOG, [EventDraft(stream="s", kind="k", payload=sent)]
    )
    sent["list"].append("caller")
    stored.payload["list"].append("returned")
    (await store.read_events(TENANT, LOG))[0].payload["new"] = True
    assert (await store.read_events(TENANT, LOG))[0].payload == {"list": [1]}


@hypothesis_settings
@given(batches=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=6))
async def test_any_sequence_of_batches_numbers_events_contiguously(
    store: Store, batches: list[int]
) -> None:
    log_id = fresh_id("log")
    returned: list[int] = []
    for size in batches:
        returned += [e.seq for e in await store.append_events(TENANT, log_id, [event(0)] * size)]
    assert returned == list(range(1, sum(batches) + 1))
    assert await seqs(store, log_id) == returned
