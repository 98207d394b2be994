"""``get_session`` with a `GetSessionConfig` reads only the events it returns (and a
few more), not the whole log, and returns what ADK's in-memory service returns, whether
the events were appended in timestamp order or not."""

from __future__ import annotations

from typing import Any

import pytest
from adk_events import BASE, event
from google.adk.sessions import BaseSessionService, InMemorySessionService, Session
from google.adk.sessions.base_session_service import GetSessionConfig

from statekeeper.integrations.adk import StatekeeperSessionService
from statekeeper.integrations.adk._codec import ORDER_KEY, session_key
from statekeeper.stores import Store
from statekeeper.stores.base import EntryDraft

EVENTS = 200


def count_reads(monkeypatch: pytest.MonkeyPatch, store: Store) -> list[int]:
    """The number of entries each ``read_entries`` call of the store returns, from now."""
    counts: list[int] = []
    read = store.read_entries

    async def counted(*args: Any, **kwargs: Any) -> Any:
        found = await read(*args, **kwargs)
        counts.append(len(found))
        return found

    monkeypatch.setattr(store, "read_entries", counted)
    return counts


async def filled(svc: BaseSessionService, stamps: list[float]) -> Session:
    session = await svc.create_session(app_name="app", user_id="u", session_id="s")
    for n, stamp in enumerate(stamps):
        appended = event(n, delta={"n": n}).model_copy(update={"timestamp": stamp})
        await svc.append_event(session, appended)
    return session


async def ids(svc: BaseSessionService, config: GetSessionConfig) -> list[str]:
    got = await svc.get_session(app_name="app", user_id="u", session_id="s", config=config)
    assert got is not None
    return [e.id for e in got.events]


CONFIGS = [
    GetSessionConfig(after_timestamp=BASE + 190),
    GetSessionConfig(after_timestamp=BASE + 189.5),
    GetSessionConfig(after_timestamp=BASE),
    GetSessionConfig(after_timestamp=BASE - 1),
    GetSessionConfig(after_timestamp=BASE + 10_000),
    GetSessionConfig(after_timestamp=BASE + 150, num_recent_events=5),
    GetSessionConfig(after_timestamp=BASE + 198, num_recent_events=5),
    GetSessionConfig(num_recent_events=7),
]


@pytest.mark.parametrize("first", [190, 150, 20])
async def test_after_timestamp_reads_a_few_entries_when_events_are_in_order(
    store: Store, monkeypatch: pytest.MonkeyPatch, first: int
) -> None:
    svc = StatekeeperSessionService(store, tenant="acme")
    await filled(svc, [BASE + n for n in range(EVENTS)])
    record = await store.get_session("acme", session_key("app", "u", "s"))
    assert record.metadata[ORDER_KEY] is True
    counts = count_reads(monkeypatch, store)
    assert await ids(svc, GetSessionConfig(after_timestamp=BASE + first)) == [
        f"e{n}" for n in range(first, EVENTS)
    ]
    # Pages back from the end, doubling: at most twice the events returned, plus 8.
    assert sum(counts) <= 2 * (EVENTS - first) + 8
    assert len(counts) <= 6


def expected(stamps: list[float], config: GetSessionConfig) -> list[str]:
    """The events at or after the time, in append order, then the last n of them (what
    ADK's database services select, ordered as appended)."""
    after, recent = config.after_timestamp, config.num_recent_events
    chosen = [f"e{n}" for n, s in enumerate(stamps) if after is None or s >= after]
    return chosen[-recent:] if recent else chosen


@pytest.mark.parametrize("order", ["in order", "one out of order", "equal stamps"])
async def test_configured_reads_select_what_adks_services_select(store: Store, order: str) -> None:
    stamps = [BASE + n for n in range(EVENTS)]
    if order == "one out of order":
        stamps[120] = BASE + 195.5  # later than its successors: the log is not in order
    elif order == "equal stamps":
        stamps = [BASE + n // 10 for n in range(EVENTS)]
    ours = StatekeeperSessionService(store, tenant="acme")
    await filled(ours, stamps)
    record = await store.get_session("acme", session_key("app", "u", "s"))
    assert record.metadata[ORDER_KEY] is (order != "one out of order")
    reference = InMemorySessionService()  # assumes order: compared only when in order
    await filled(reference, stamps)
    for config in CONFIGS:
        assert await ids(ours, config) == expected(stamps, config), config
        if order != "one out of order":
            assert await ids(reference, config) == expected(stamps, config), config


async def test_order_is_kept_by_appends_through_any_session_object(store: Store) -> None:
    svc = StatekeeperSessionService(store, tenant="acme")
    await filled(svc, [BASE + n for n in range(3)])
    # A second service (another process, say) appends through the object it loaded, and
    # through one it never loaded (no marker): the flag follows every append.
    other = StatekeeperSessionService(store, tenant="acme")
    loaded = await other.get_session(app_name="app", user_id="u", session_id="s")
    assert loaded is not None
    await other.append_event(loaded, event(3).model_copy(update={"timestamp": BASE + 3}))
    key = session_key("app", "u", "s")
    assert (await store.get_session("acme", key)).metadata[ORDER_KEY] is True
    by_hand = Session(
        id="s", app_name="app", user_id="u", last_update_time=BASE + 3, events=loaded.events
    )
    await other.append_event(by_hand, event(4).model_copy(update={"timestamp": BASE + 1}))
    assert (await store.get_session("acme", key)).metadata[ORDER_KEY] is False
    fresh = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert fresh is not None
    await svc.append_event(fresh, event(5).model_copy(update={"timestamp": BASE + 9}))
    assert (await store.get_session("acme", key)).metadata[ORDER_KEY] is False  # for good
    assert await ids(svc, GetSessionConfig(after_timestamp=BASE + 2)) == ["e2", "e3", "e5"]


async def test_entries_that_are_not_events_are_read_as_before(store: Store) -> None:
    # An entry written past the service (with the store's API) in the log: it reads as
    # an error event stamped with its write time (now, long before BASE), wherever the
    # pages start (the first page, the last 8 entries, starts at it).
    svc = StatekeeperSessionService(store, tenant="acme")
    session = await filled(svc, [BASE + n for n in range(33)])
    key = session_key("app", "u", "s")
    await store.append_entries("acme", key, [EntryDraft(id="note", kind="marker", payload={})])
    fresh = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert fresh is not None
    for n in range(33, 40):
        await svc.append_event(fresh, event(n).model_copy(update={"timestamp": BASE + n}))
    assert session.events[-1].id == "e32"
    for first in (38, 33, 31, 30, 20, 0):
        got = await ids(svc, GetSessionConfig(after_timestamp=BASE + first))
        assert got == [f"e{n}" for n in range(first, 40)], first
    everything = await ids(svc, GetSessionConfig(after_timestamp=0))
    assert everything[33] == "note"
    assert len(everything) == 41
