"""`StatekeeperSessionService` behaves like ADK's own session services.

The same scenario runs on ADK's `InMemorySessionService` (the reference), ADK's
`DatabaseSessionService` and `SqliteSessionService` on SQLite files, and ours on every
statekeeper backend; what each returns is compared. Then what the scenario cannot
compare: the stale-session check (against ADK's database services, the in-memory one
has none), event round trips, tenants, and failed calls changing nothing.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from adk_events import BASE, event, full_event
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.sessions import (
    BaseSessionService,
    DatabaseSessionService,
    InMemorySessionService,
    Session,
)
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.sqlite_session_service import SqliteSessionService

from statekeeper.errors import ConflictError, InvalidInputError, InvalidPayloadError
from statekeeper.integrations.adk import StatekeeperSessionService
from statekeeper.integrations.adk._codec import session_key
from statekeeper.stores import Store
from statekeeper.stores.base import EntryDraft, SessionQuery


def view(session: Session | None) -> Any:
    """What a caller can observe of a session (creation times differ between services,
    event times do not: they come from the events)."""
    if session is None:
        return None
    return {
        "id": session.id,
        "app": session.app_name,
        "user": session.user_id,
        "state": session.state,
        "events": [e.model_dump() for e in session.events],
        "updated": session.last_update_time if session.last_update_time >= BASE else "created",
    }


async def scenario(svc: BaseSessionService) -> list[Any]:
    """Every operation of the session service, with the results noted in order."""
    seen: list[Any] = []
    s1 = await svc.create_session(
        app_name="app",
        user_id="u1",
        session_id="s1",
        state={"app:theme": "dark", "user:lang": "en", "temp:scratch": 1, "draft": "x"},
    )
    seen.append(view(s1))
    seen.append(view(await svc.create_session(app_name="app", user_id="u2", session_id="s1")))
    seen.append(
        view(
            await svc.create_session(
                app_name="zoo", user_id="u1", session_id="s9", state={"app:theme": "light"}
            )
        )
    )
    try:
        await svc.create_session(
            app_name="app", user_id="u1", session_id="s1", state={"app:theme": "red"}
        )
    except AlreadyExistsError as exc:
        seen.append(("duplicate refused", type(exc).__mro__.index(AlreadyExistsError) >= 0))
    seen.append(await svc.get_user_state(app_name="app", user_id="u1"))

    delta = {"count": 1, "app:theme": "blue", "user:lang": "de", "temp:scratch": "z"}
    await svc.append_event(s1, event(1, delta=delta))
    seen.append(view(s1))  # the caller's object has the temp key, storage will not
    await svc.append_event(s1, event(2, author="keeper", partial=True, delta={"lost": True}))
    for n in range(3, 8):
        await svc.append_event(
            s1, event(n, author="user" if n % 2 else "keeper", delta={"count": n})
        )
    seen.append(view(s1))
    for config in (
        None,
        GetSessionConfig(num_recent_events=2),
        GetSessionConfig(num_recent_events=0),
        GetSessionConfig(num_recent_events=100),
        GetSessionConfig(after_timestamp=BASE + 5),
        GetSessionConfig(num_recent_events=1, after_timestamp=BASE + 4),
        GetSessionConfig(after_timestamp=BASE + 99),
    ):
        got = await svc.get_session(app_name="app", user_id="u1", session_id="s1", config=config)
        seen.append(view(got))
    s2 = await svc.get_session(app_name="app", user_id="u2", session_id="s1")
    seen.append(view(s2))  # app state shared, user state not
    for app, user, sid in (("app", "u3", "s1"), ("zoo", "u2", "s1"), ("app", "u1", "nope")):
        seen.append(view(await svc.get_session(app_name=app, user_id=user, session_id=sid)))
    for app, user in (("app", "u1"), ("app", None), ("zoo", None), ("app", "u9"), ("none", None)):
        listed = await svc.list_sessions(app_name=app, user_id=user)
        seen.append([view(s) for s in listed.sessions])
    seen.append(await svc.get_user_state(app_name="app", user_id="u1"))
    seen.append(await svc.get_user_state(app_name="app", user_id="u9"))
    await svc.delete_session(app_name="app", user_id="u1", session_id="s1")
    await svc.delete_session(app_name="app", user_id="u1", session_id="s1")  # no error
    seen.append(view(await svc.get_session(app_name="app", user_id="u1", session_id="s1")))
    seen.append([view(s) for s in (await svc.list_sessions(app_name="app")).sessions])
    try:
        await svc.append_event(s1, event(8))
    except SessionNotFoundError:
        seen.append("append to a deleted session refused")
    fresh = await svc.create_session(app_name="app", user_id="u1")
    seen.append(len(fresh.id) == 36 and fresh.id.count("-") == 4)  # a uuid4
    return seen


async def ours(store: Store) -> StatekeeperSessionService:
    return StatekeeperSessionService(store, tenant="acme")


@pytest.fixture
async def reference() -> list[Any]:
    return await scenario(InMemorySessionService())


async def test_ours_matches_the_in_memory_service(store: Store, reference: list[Any]) -> None:
    assert await scenario(await ours(store)) == reference


@pytest.fixture(params=["database", "sqlite"])
async def adk_db(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BaseSessionService]:
    """ADK's own services that persist: DatabaseSessionService (SQLAlchemy on
    aiosqlite) and SqliteSessionService, each on a fresh SQLite file."""
    if request.param == "database":
        service = DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}")
        yield service
        await service.close()
    else:
        sqlite_service = SqliteSessionService(str(tmp_path / "adk.db"))
        yield sqlite_service
        await sqlite_service.close()


async def test_adk_database_services_agree_with_the_reference(
    adk_db: BaseSessionService, reference: list[Any]
) -> None:
    # The scenario's expectations are ADK's, not ours: its persistent services agree.
    assert await scenario(adk_db) == reference


# -- the stale-session check ---------------------------------------------------------------


async def stale_scenario(svc: BaseSessionService) -> list[Any]:
    """Two copies of one session, and a session object built by hand."""
    seen: list[Any] = []

    async def attempt(session: Session, n: int) -> str:
        try:
            await svc.append_event(session, event(n, delta={"by": n}))
        except StaleSessionError:
            return "stale"
        return "ok"

    await svc.create_session(app_name="app", user_id="u", session_id="s")
    first = await svc.get_session(app_name="app", user_id="u", session_id="s")
    second = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert first is not None
    assert second is not None
    seen.append(await attempt(first, 1))
    seen.append(await attempt(second, 2))  # loaded before event 1 was appended
    seen.append(await attempt(first, 3))  # the first copy is current
    reloaded = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert reloaded is not None
    seen.append(view(reloaded))
    seen.append(await attempt(reloaded, 4))
    by_hand = Session(
        id="s", app_name="app", user_id="u", events=list(reloaded.events), last_update_time=BASE + 3
    )
    seen.append(await attempt(by_hand, 5))  # storage moved on past it (event 4)
    by_hand = Session(id="s", app_name="app", user_id="u", last_update_time=BASE + 99)
    seen.append(await attempt(by_hand, 6))  # newer than storage: accepted, as ADK does
    final = await svc.get_session(app_name="app", user_id="u", session_id="s")
    seen.append(view(final))
    return seen


async def test_stale_sessions_are_refused_like_adks_database_service(
    store: Store, tmp_path: Path
) -> None:
    database = DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}")
    try:
        expected = await stale_scenario(database)
    finally:
        await database.close()
    assert expected[:3] == ["ok", "stale", "ok"]  # the premise: ADK refuses a stale copy
    assert await stale_scenario(await ours(store)) == expected


async def test_a_stale_append_raises_both_error_types_and_stores_nothing(store: Store) -> None:
    svc = await ours(store)
    await svc.create_session(app_name="app", user_id="u", session_id="s")
    first = await svc.get_session(app_name="app", user_id="u", session_id="s")
    second = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert first is not None
    assert second is not None
    await svc.append_event(first, event(1))
    with pytest.raises(StaleSessionError) as caught:
        await svc.append_event(second, event(2, delta={"app:x": 1, "user:y": 2, "z": 3}))
    assert isinstance(caught.value, ConflictError)  # and statekeeper's own type
    stored = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert stored is not None
    assert [e.id for e in stored.events] == ["e1"]
    assert stored.state == {}  # neither app, user nor session state was written
    assert [e.id for e in second.events] == []  # the caller's object is untouched too


async def test_another_service_on_the_same_store_makes_a_loaded_session_stale(store: Store) -> None:
    mine, theirs = await ours(store), await ours(store)
    session = await mine.create_session(app_name="app", user_id="u", session_id="s")
    other = await theirs.get_session(app_name="app", user_id="u", session_id="s")
    assert other is not None
    await theirs.append_event(other, event(1))
    with pytest.raises(StaleSessionError):
        await mine.append_event(session, event(2))


async def test_concurrent_appends_through_one_session_object_are_serialised(store: Store) -> None:
    # The parallel branches of one ADK invocation share a session object.
    svc = await ours(store)
    session = await svc.create_session(app_name="app", user_id="u", session_id="s")
    await asyncio.gather(
        *(svc.append_event(session, event(n, delta={f"k{n}": n})) for n in range(8))
    )
    stored = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert stored is not None
    assert sorted(e.id for e in stored.events) == [f"e{n}" for n in range(8)]
    assert stored.state == {f"k{n}": n for n in range(8)}
    assert svc._locks == {}  # no lock kept once nobody waits


# -- events round trip -----------------------------------------------------------------------


async def test_every_event_field_round_trips(store: Store, tmp_path: Path) -> None:
    svc = await ours(store)
    session = await svc.create_session(app_name="app", user_id="u", session_id="s")
    await svc.append_event(session, full_event())
    stored = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert stored is not None
    assert [e.model_dump(mode="json") for e in stored.events] == [
        full_event().model_dump(mode="json")
    ]
    # Field by field as Python values, ours reads back exactly what ADK's own database
    # service does (both give back one enum of an auth scheme as its string).
    database = DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}")
    try:
        theirs = await database.create_session(app_name="app", user_id="u", session_id="s")
        await database.append_event(theirs, full_event())
        reference = await database.get_session(app_name="app", user_id="u", session_id="s")
    finally:
        await database.close()
    assert reference is not None
    assert [e.model_dump() for e in stored.events] == [e.model_dump() for e in reference.events]
    assert stored.state == reference.state == {"k": [1, {"x": None}], "app:a": 1.5, "user:u": "ü"}


async def test_an_equal_redelivery_is_stored_once(store: Store) -> None:
    svc = await ours(store)
    session = await svc.create_session(app_name="app", user_id="u", session_id="s")
    await svc.append_event(session, event(1, delta={"n": 1}))
    await svc.append_event(session, event(1, delta={"n": 1}))  # a retried call
    stored = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert stored is not None
    assert [e.id for e in stored.events] == ["e1"] == [e.id for e in session.events]


async def test_event_ids_that_are_not_statekeeper_ids_are_stored(store: Store) -> None:
    svc = await ours(store)
    session = await svc.create_session(
        app_name="an app/with spaces", user_id="ü ser", session_id=" s/1 "
    )
    assert session.id == "s/1"  # stripped, as ADK's in-memory service does
    odd = event(1).model_copy(update={"id": "../" + "x" * 200})
    await svc.append_event(session, odd)
    stored = await svc.get_session(app_name="an app/with spaces", user_id="ü ser", session_id="s/1")
    assert stored is not None
    assert [e.id for e in stored.events] == [odd.id]


# -- tenants ---------------------------------------------------------------------------------


async def test_tenants_do_not_see_each_others_apps_users_or_state(store: Store) -> None:
    acme = StatekeeperSessionService(store, tenant="acme")
    globex = StatekeeperSessionService(store, tenant="globex")
    mine = await acme.create_session(
        app_name="app", user_id="u", session_id="s", state={"app:plan": "gold", "user:vip": True}
    )
    await acme.append_event(mine, event(1))
    assert await globex.get_session(app_name="app", user_id="u", session_id="s") is None
    assert (await globex.list_sessions(app_name="app")).sessions == []
    assert await globex.get_user_state(app_name="app", user_id="u") == {}
    theirs = await globex.create_session(app_name="app", user_id="u", session_id="s")
    assert theirs.state == {}  # the same app name in another tenant is another app
    await globex.delete_session(app_name="app", user_id="u", session_id="s")
    kept = await acme.get_session(app_name="app", user_id="u", session_id="s")
    assert kept is not None
    assert [e.id for e in kept.events] == ["e1"]
    assert kept.state == {"app:plan": "gold", "user:vip": True}


async def test_sessions_are_plain_statekeeper_sessions_of_the_tenant(store: Store) -> None:
    svc = await ours(store)
    await svc.create_session(app_name="app", user_id="u", session_id="s", state={"k": 1})
    page = await store.list_sessions("acme", SessionQuery())
    [record] = page.items
    assert record.metadata["adk.app"] == "app"
    assert record.metadata["adk.user"] == "u"
    assert record.metadata["adk.id"] == "s"
    assert record.state == {"k": 1}


# -- bad input and failed calls ----------------------------------------------------------------


@pytest.mark.parametrize(
    "names",
    [
        {"app_name": "", "user_id": "u"},
        {"app_name": "a", "user_id": ""},
        {"app_name": 3, "user_id": "u"},
    ],
)
async def test_bad_names_are_refused(store: Store, names: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError, match="must be a non-empty string"):
        await (await ours(store)).create_session(**names)


async def test_a_bad_tenant_is_refused(store: Store) -> None:
    with pytest.raises(InvalidInputError, match="tenant"):
        StatekeeperSessionService(store, tenant="../other")


async def test_a_failed_append_changes_nothing(store: Store) -> None:
    svc = await ours(store)
    session = await svc.create_session(
        app_name="app", user_id="u", session_id="s", state={"app:a": 0, "user:b": 0, "c": 0}
    )
    before = await svc.get_session(app_name="app", user_id="u", session_id="s")
    bad: list[Callable[[], Awaitable[Any]]] = [
        # app and user state are written first, then the session refuses NaN
        lambda: svc.append_event(session, event(1, delta={"app:a": 1, "user:b": 1, "c": math.nan})),
        lambda: svc.append_event(session, event(2, delta={"app:a": 2, "c": object()})),
    ]
    for call in bad:
        with pytest.raises(InvalidPayloadError):
            await call()
    after = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert view(after) == view(before)
    assert await svc.get_user_state(app_name="app", user_id="u") == {"b": 0}


async def test_append_event_refuses_what_is_not_a_session_or_an_event(store: Store) -> None:
    svc = await ours(store)
    session = await svc.create_session(app_name="app", user_id="u", session_id="s")
    for call in (
        lambda: svc.append_event(session, None),  # type: ignore[arg-type]
        lambda: svc.append_event(session, {"author": "user"}),  # type: ignore[arg-type]
        lambda: svc.append_event(None, event(1)),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidInputError, match="append_event"):
            await call()
    after = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert after is not None
    assert after.events == []


async def test_a_refused_duplicate_changes_no_state(store: Store) -> None:
    svc = await ours(store)
    await svc.create_session(app_name="app", user_id="u", session_id="s", state={"app:a": 1})
    with pytest.raises(AlreadyExistsError):
        await svc.create_session(
            app_name="app", user_id="u", session_id="s", state={"app:a": 2, "user:b": 1}
        )
    other = await svc.create_session(app_name="app", user_id="v")
    assert other.state == {"app:a": 1}
    assert await svc.get_user_state(app_name="app", user_id="u") == {}


async def test_a_stale_append_puts_app_and_user_state_back(store: Store) -> None:
    # No session-state change: the version check happens in the append itself, the
    # commit that would also log the app and user deltas, so none of them is stored.
    svc = await ours(store)
    await svc.create_session(app_name="app", user_id="u", session_id="s", state={"app:x": 0})
    first = await svc.get_session(app_name="app", user_id="u", session_id="s")
    second = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert first is not None
    assert second is not None
    await svc.append_event(first, event(1))
    with pytest.raises(StaleSessionError):
        await svc.append_event(second, event(2, delta={"app:x": 1, "user:y": 2}))
    stored = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert stored is not None
    assert stored.state == {"app:x": 0}
    assert await svc.get_user_state(app_name="app", user_id="u") == {}


async def test_unreadable_entries_are_reported_in_place_not_skipped(store: Store) -> None:
    svc = await ours(store)
    session = await svc.create_session(app_name="app", user_id="u", session_id="s")
    await svc.append_event(session, event(1))
    key = session_key("app", "u", "s")
    # Written past the adapter: an event ADK cannot read, and an entry of another kind.
    await store.append_entries(
        "acme", key, [EntryDraft(id="bad", kind="adk.event", payload={"timestamp": "noon"})]
    )
    await store.append_entries("acme", key, [EntryDraft(id="note", kind="marker", payload={})])
    fresh = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert fresh is not None
    await svc.append_event(fresh, event(4))
    stored = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert stored is not None
    assert [e.id for e in stored.events] == ["e1", "bad", "note", "e4"]
    assert [e.error_code for e in stored.events] == [
        None,
        "STATEKEEPER_UNREADABLE_ENTRY",
        "STATEKEEPER_UNREADABLE_ENTRY",
        None,
    ]
    assert "is invalid" in (stored.events[1].error_message or "")
    assert "not an event" in (stored.events[2].error_message or "")
    recent = await svc.get_session(
        app_name="app", user_id="u", session_id="s", config=GetSessionConfig(num_recent_events=3)
    )
    assert recent is not None
    assert [e.id for e in recent.events] == ["bad", "note", "e4"]


async def test_a_listing_never_shows_another_apps_or_users_sessions(store: Store) -> None:
    # SQLite's metadata filter cuts strings at a NUL, so "a\x00b" would match "a".
    svc = await ours(store)
    await svc.create_session(app_name="a\x00b", user_id="u", session_id="s")
    await svc.create_session(app_name="a", user_id="u\x00v", session_id="s")
    assert [s.user_id for s in (await svc.list_sessions(app_name="a")).sessions] == ["u\x00v"]
    assert (await svc.list_sessions(app_name="a", user_id="u")).sessions == []
