"""Tenant isolation, and ids that must be refused before anything is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from statekeeper.errors import InvalidIdError, NotFoundError
from statekeeper.stores import Store
from statekeeper.stores.base import (
    EntryDraft,
    EventDraft,
    ForkPoint,
    SessionPatch,
    SessionQuery,
    SessionRecord,
)

from .support import OTHER_TENANT, TENANT, draft, new_session, seqs_of

NS = "ns"
LOG = "log"


async def fill(store: Store, tenant: str, label: str) -> None:
    """One of everything for ``tenant``, under the same ids for every tenant."""
    await new_session(store, "s1", tenant=tenant, title=label)
    await store.append_entries(tenant, "s1", [draft("e1", owner=label), draft("e2")])
    await store.put_record(tenant, NS, "k", {"owner": label})
    await store.append_events(tenant, LOG, [EventDraft(stream="s", kind=label)])


async def assert_owned_by(store: Store, tenant: str, label: str) -> None:
    """``tenant`` sees exactly what `fill` stored for it."""
    session = await store.get_session(tenant, "s1")
    assert (session.title, session.last_seq) == (label, 2)
    assert [s.id for s in (await store.list_sessions(tenant, SessionQuery())).items] == ["s1"]
    assert (await store.get_entry(tenant, "s1", "e1")).payload["owner"] == label
    assert await seqs_of(store, "s1", tenant) == [1, 2]
    assert (await store.get_record(tenant, NS, "k")).value == {"owner": label}
    assert [r.key for r in await store.list_records(tenant, NS)] == ["k"]
    assert [e.kind for e in await store.read_events(tenant, LOG)] == [label]


async def test_another_tenants_data_is_invisible(store: Store) -> None:
    await fill(store, TENANT, "a")
    b = OTHER_TENANT
    with pytest.raises(NotFoundError):
        await store.get_session(b, "s1")
    with pytest.raises(NotFoundError):
        await store.read_entries(b, "s1")
    with pytest.raises(NotFoundError):
        await store.get_entry(b, "s1", "e1")
    with pytest.raises(NotFoundError):
        await store.append_entries(b, "s1", [draft("e3")])
    with pytest.raises(NotFoundError):
        await store.update_session(b, "s1", SessionPatch(set={"title": "stolen"}))
    with pytest.raises(NotFoundError):
        await store.delete_session(b, "s1")
    with pytest.raises(NotFoundError):
        await store.prune_entries(b, "s1", kind="checkpoint", before_seq=9)
    assert (await store.list_sessions(b, SessionQuery())).items == []
    with pytest.raises(NotFoundError):
        await store.get_record(b, NS, "k")
    with pytest.raises(NotFoundError):
        await store.delete_record(b, NS, "k")
    assert await store.list_records(b, NS) == []
    assert await store.read_events(b, LOG) == []
    await store.delete_event_log(b, LOG)
    await assert_owned_by(store, TENANT, "a")


async def test_tenants_use_the_same_ids_independently(store: Store) -> None:
    await fill(store, TENANT, "a")
    await fill(store, OTHER_TENANT, "b")
    b_session = await store.get_session(OTHER_TENANT, "s1")
    assert b_session.last_seq == 2
    assert (await store.get_record(OTHER_TENANT, NS, "k")).version == 1
    assert [e.seq for e in await store.read_events(OTHER_TENANT, LOG)] == [1]
    created = await store.put_record(OTHER_TENANT, "b-only", "k", 1, expected_version=0)
    assert created.version == 1
    assert await store.list_records(TENANT, "b-only") == []
    await assert_owned_by(store, TENANT, "a")
    await assert_owned_by(store, OTHER_TENANT, "b")
    await store.delete_session(OTHER_TENANT, "s1")
    await store.delete_record(OTHER_TENANT, NS, "k")
    await store.delete_event_log(OTHER_TENANT, LOG)
    await assert_owned_by(store, TENANT, "a")


# -- hostile ids -----------------------------------------------------------------------------

HOSTILE = {
    "dotdot-slash": "../x",
    "slash": "a/b",
    "backslash": "a\\b",
    "empty": "",
    "huge": "x" * 10_000,
    "over-limit": "x" * 129,
    "dotdot": "..",
    "hidden": ".hidden",
    "nul": "a\x00b",
    "space": "a b",
    "newline": "a\nb",
}
hostile = pytest.mark.parametrize("bad", list(HOSTILE.values()), ids=list(HOSTILE))

# Names a backend that "cleaned" a hostile id instead of refusing it might have used.
CLEANED = ["x", "a", "b", "ab", "a_b", "hidden", "a-b", "a.b"]

Call = Callable[[], Awaitable[object]]


async def refused(**calls: Call) -> None:
    """Every call raises `InvalidIdError` (and nothing else)."""
    for name, call in calls.items():
        try:
            await call()
        except InvalidIdError:
            continue
        except Exception as exc:
            pytest.fail(f"{name} raised {type(exc).__name__} ({exc}), not InvalidIdError")
        pytest.fail(f"{name} accepted a hostile id")


def files_under(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


@pytest.fixture
async def baseline(store: Store, tmp_path: Path) -> AsyncIterator[None]:
    """Valid data to compare with, and a check that the hostile calls changed nothing."""
    await fill(store, TENANT, "a")
    files = files_under(tmp_path)
    yield
    await assert_owned_by(store, TENANT, "a")
    for tenant in CLEANED:
        assert (await store.list_sessions(tenant, SessionQuery())).items == [], tenant
        assert await store.list_records(tenant, NS) == [], tenant
    for log_id in CLEANED:
        assert await store.read_events(TENANT, log_id) == [], log_id
    for namespace in CLEANED:
        assert await store.list_records(TENANT, namespace) == [], namespace
    assert files_under(tmp_path) == files, "a refused call created or removed files"


@pytest.mark.usefixtures("baseline")
@hostile
async def test_a_hostile_tenant_is_refused(store: Store, bad: str) -> None:
    await refused(
        create_session=lambda: store.create_session(SessionRecord(id="s2", tenant=bad)),
        get_session=lambda: store.get_session(bad, "s1"),
        update_session=lambda: store.update_session(bad, "s1", SessionPatch()),
        delete_session=lambda: store.delete_session(bad, "s1"),
        list_sessions=lambda: store.list_sessions(bad, SessionQuery()),
        append_entries=lambda: store.append_entries(bad, "s1", [draft("e9")]),
        read_entries=lambda: store.read_entries(bad, "s1"),
        get_entry=lambda: store.get_entry(bad, "s1", "e1"),
        prune_entries=lambda: store.prune_entries(bad, "s1", kind="checkpoint", before_seq=9),
        put_record=lambda: store.put_record(bad, NS, "k2", 1),
        get_record=lambda: store.get_record(bad, NS, "k"),
        list_records=lambda: store.list_records(bad, NS),
        delete_record=lambda: store.delete_record(bad, NS, "k"),
        append_events=lambda: store.append_events(bad, LOG, [EventDraft(stream="s", kind="k")]),
        read_events=lambda: store.read_events(bad, LOG),
        delete_event_log=lambda: store.delete_event_log(bad, LOG),
    )


@pytest.mark.usefixtures("baseline")
@hostile
async def test_a_hostile_session_id_is_refused(store: Store, bad: str) -> None:
    await refused(
        create_session=lambda: store.create_session(SessionRecord(id=bad, tenant=TENANT)),
        get_session=lambda: store.get_session(TENANT, bad),
        update_session=lambda: store.update_session(TENANT, bad, SessionPatch()),
        delete_session=lambda: store.delete_session(TENANT, bad),
        append_entries=lambda: store.append_entries(TENANT, bad, [draft("e9")]),
        read_entries=lambda: store.read_entries(TENANT, bad),
        get_entry=lambda: store.get_entry(TENANT, bad, "e1"),
        prune_entries=lambda: store.prune_entries(TENANT, bad, kind="checkpoint", before_seq=9),
    )


@pytest.mark.usefixtures("baseline")
@hostile
async def test_a_hostile_entry_id_is_refused(store: Store, bad: str) -> None:
    await refused(
        alone=lambda: store.append_entries(TENANT, "s1", [EntryDraft(id=bad, payload={})]),
        in_a_batch=lambda: store.append_entries(
            TENANT, "s1", [draft("e9"), EntryDraft(id=bad, payload={}), draft("e10")]
        ),
    )


@pytest.mark.parametrize("bad", ["../x", "a/b", ""], ids=["dotdot-slash", "slash", "empty"])
async def test_get_entry_refuses_a_hostile_entry_id(store: Store, bad: str) -> None:
    await new_session(store, "s1")
    with pytest.raises(InvalidIdError):
        await store.get_entry(TENANT, "s1", bad)


@pytest.mark.usefixtures("baseline")
@hostile
async def test_a_hostile_namespace_is_refused(store: Store, bad: str) -> None:
    await refused(
        put_record=lambda: store.put_record(TENANT, bad, "k", 1),
        create_record=lambda: store.put_record(TENANT, bad, "k", 1, expected_version=0),
        get_record=lambda: store.get_record(TENANT, bad, "k"),
        list_records=lambda: store.list_records(TENANT, bad),
        delete_record=lambda: store.delete_record(TENANT, bad, "k"),
    )


@pytest.mark.usefixtures("baseline")
@hostile
async def test_a_hostile_record_key_is_refused(store: Store, bad: str) -> None:
    await refused(
        put_record=lambda: store.put_record(TENANT, NS, bad, 1),
        create_record=lambda: store.put_record(TENANT, NS, bad, 1, expected_version=0),
        get_record=lambda: store.get_record(TENANT, NS, bad),
        delete_record=lambda: store.delete_record(TENANT, NS, bad),
    )


@pytest.mark.usefixtures("baseline")
@hostile
async def test_a_hostile_log_id_is_refused(store: Store, bad: str) -> None:
    await refused(
        append_events=lambda: store.append_events(TENANT, bad, [EventDraft(stream="s", kind="k")]),
        read_events=lambda: store.read_events(TENANT, bad),
        delete_event_log=lambda: store.delete_event_log(TENANT, bad),
    )


@pytest.mark.usefixtures("baseline")
@hostile
async def test_hostile_ids_inside_a_session_record_are_refused(store: Store, bad: str) -> None:
    await refused(
        continued_from=lambda: new_session(store, "s2", continued_from=bad),
        continued_to=lambda: new_session(store, "s3", continued_to=bad),
        forked_from=lambda: new_session(store, "s4", forked_from=ForkPoint(session_id=bad, seq=1)),
        patch_continued_to=lambda: store.update_session(
            TENANT, "s1", SessionPatch(set={"continued_to": bad})
        ),
    )


VALID = ["a", "9", "A.b_c:d@e-f", "user@example.com", "x" * 128, "-".join(["a"] * 64)]


@pytest.mark.parametrize(
    "ok", VALID, ids=["one-letter", "digit", "punctuation", "email", "max-length", "dashes"]
)
async def test_unusual_valid_ids_work_in_every_role(store: Store, ok: str) -> None:
    await store.create_session(SessionRecord(id=ok, tenant=ok))
    await store.append_entries(ok, ok, [EntryDraft(id=ok, payload={"v": 1})])
    assert (await store.get_entry(ok, ok, ok)).seq == 1
    assert [s.id for s in (await store.list_sessions(ok, SessionQuery())).items] == [ok]
    await store.put_record(ok, ok, ok, "v")
    assert [r.key for r in await store.list_records(ok, ok, prefix=ok)] == [ok]
    await store.append_events(ok, ok, [EventDraft(stream="s", kind="k")])
    assert [e.seq for e in await store.read_events(ok, ok)] == [1]
    await store.delete_record(ok, ok, ok)
    await store.delete_event_log(ok, ok)
    await store.delete_session(ok, ok)
    assert (await store.list_sessions(ok, SessionQuery())).items == []
