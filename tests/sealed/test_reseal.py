"""Key rotation without downtime and the reseal job, on every backend: new writes use the
new key, old rows open with the old one, `reseal` moves heads, entries, events and
records forward (keeping listings' order and every row's seq, id and times), so the old
key can then be dropped; appends meanwhile are kept; plain rows get sealed."""

from __future__ import annotations

import asyncio
from typing import Any

from statekeeper.stores.base import EntryDraft, EventDraft, SessionPatch, SessionRecord
from statekeeper.stores.sealed import SealedStore
from statekeeper.stores.sealed.reseal import reseal

T = "tenant-a"


async def fill(store: SealedStore, session_id: str) -> None:
    await store.create_session(
        SessionRecord(
            id=session_id, tenant=T, title=f"title {session_id}", metadata={"n": session_id}
        )
    )
    await store.update_session(T, session_id, SessionPatch(set={"state": {"s": session_id}}))
    await store.append_entries(T, session_id, [EntryDraft(id="e1", payload={"t": session_id})])
    await store.put_record(T, "runs", f"run-{session_id}", {"r": session_id})
    await store.append_events(T, f"run-{session_id}", [EventDraft(stream="tool", kind="k")])


async def everything(store: SealedStore, session_id: str) -> list[Any]:
    """What a reader gets of a session filled by `fill` (opening every row)."""
    head = await store.get_session(T, session_id)
    return [
        (head.title, head.metadata, head.state),
        [
            (e.seq, e.id, e.kind, e.created_at, e.payload)
            for e in await store.read_entries(T, session_id)
        ],
        [(e.seq, e.ts, e.payload) for e in await store.read_events(T, f"run-{session_id}")],
        (await store.get_record(T, "runs", f"run-{session_id}")).value,
    ]


def key_of_head(store: SealedStore, raw: SessionRecord) -> set[str]:
    assert raw.title is not None
    return {
        store.keyring.key_id_of(raw.title.removeprefix("~sealed:")),
        store.keyring.key_id_of(raw.metadata["~sealed"]),
        store.keyring.key_id_of(raw.state["~sealed"]),
    }


async def test_rotation_then_reseal(sealed_store: SealedStore) -> None:
    old = sealed_store.keyring.current
    await fill(sealed_store, "s1")
    rotated = SealedStore(sealed_store.wrapped, sealed_store.keyring.rotated("k-new"))
    await fill(rotated, "s2")  # new writes: the new key
    raw2 = await rotated.wrapped.get_session(T, "s2")
    assert key_of_head(rotated, raw2) == {"k-new"}
    assert (await rotated.get_session(T, "s1")).title == "title s1"  # old rows: old key
    before = await rotated.wrapped.get_session(T, "s1")

    seen = [await everything(rotated, "s1"), await everything(rotated, "s2")]
    calls: list[tuple[int, int, int]] = []
    report = await reseal(
        rotated, T, progress=lambda done, total, r: calls.append((done, total, r.entries))
    )
    assert (report.sessions, report.sessions_resealed) == (2, 1)
    assert (report.entries, report.entries_resealed) == (2, 1)
    assert (report.events, report.events_resealed) == (2, 1)
    assert (report.records, report.records_resealed) == (2, 1)
    assert (report.raced, report.left) == (0, {})
    assert calls == [(1, 4, 1), (2, 4, 2), (3, 4, 2), (4, 4, 2)]  # sessions, then event logs
    after = await rotated.wrapped.get_session(T, "s1")
    assert key_of_head(rotated, after) == {"k-new"}
    assert after.last_active == before.last_active  # listings keep their order
    assert after.version == before.version + 1
    raw_record = await rotated.wrapped.get_record(T, "runs", "run-s1")
    assert rotated.keyring.key_id_of(raw_record.value["~sealed"]) == "k-new"  # type: ignore[index,call-overload]

    raw_entry = (await rotated.wrapped.read_entries(T, "s1"))[0]
    assert rotated.keyring.key_id_of(raw_entry.payload["~sealed"]) == "k-new"

    # Without the old key every row opens, and reads the same.
    only_new = SealedStore(rotated.wrapped, rotated.keyring.without(old))
    assert [await everything(only_new, "s1"), await everything(only_new, "s2")] == seen
    assert seen[0][0] == ("title s1", {"n": "s1"}, {"s": "s1"})

    again = await reseal(rotated, T)
    resealed = (again.sessions_resealed, again.entries_resealed, again.events_resealed)
    assert (*resealed, again.records_resealed) == (0, 0, 0, 0)


async def test_appends_during_a_reseal_are_kept(sealed_store: SealedStore) -> None:
    old = sealed_store.keyring.current
    for n in range(3):
        await fill(sealed_store, f"s{n}")
    rotated = SealedStore(sealed_store.wrapped, sealed_store.keyring.rotated("k-new"))

    async def append(n: int) -> None:
        for i in range(4):
            await rotated.append_entries(T, "s1", [EntryDraft(id=f"a{n}-{i}", payload={"n": n})])
            await rotated.append_events(T, "run-s1", [EventDraft(stream="s", kind=f"{n}-{i}")])
            await asyncio.sleep(0)

    await asyncio.gather(reseal(rotated, T), append(0), append(1))
    ids = [e.id for e in await rotated.read_entries(T, "s1")]
    assert sorted(ids) == sorted(["e1", *(f"a{n}-{i}" for n in range(2) for i in range(4))])
    assert len(await rotated.read_events(T, "run-s1")) == 9
    # What the first run did not reach is moved by the next; then the old key can go.
    await reseal(rotated, T)
    only_new = SealedStore(rotated.wrapped, rotated.keyring.without(old))
    for n in range(3):
        assert (await everything(only_new, f"s{n}"))[1][0][4] == {"t": f"s{n}"}
    entries = await only_new.read_entries(T, "s1")
    assert {e.kind for e in entries} == {"message"}
    assert [e.payload for e in entries if e.id.startswith("a0")] == [{"n": 0}] * 4
    assert {e.stream for e in await only_new.read_events(T, "run-s1")} == {"tool", "s"}


async def test_reseal_seals_rows_from_before_encryption(sealed_store: SealedStore) -> None:
    plain = sealed_store.wrapped
    await plain.create_session(SessionRecord(id="old", tenant=T, title="plain", state={"a": 1}))
    await plain.put_record(T, "runs", "r1", {"v": 1})
    await plain.append_entries(T, "old", [EntryDraft(id="e1", payload={"p": 1})])
    await plain.append_events(T, "r1", [EventDraft(stream="s", kind="k", payload={"q": 1})])
    migrating = SealedStore(plain, sealed_store.keyring, allow_plain=True)
    report = await reseal(migrating, T)
    assert (report.sessions_resealed, report.records_resealed) == (1, 1)
    assert (report.entries_resealed, report.events_resealed, report.left) == (1, 1, {})
    strict = SealedStore(plain, sealed_store.keyring)
    assert (await strict.get_session(T, "old")).title == "plain"
    assert (await strict.get_entry(T, "old", "e1")).payload == {"p": 1}
    assert [e.payload for e in await strict.read_events(T, "r1")] == [{"q": 1}]
    assert (await strict.get_record(T, "runs", "r1")).value == {"v": 1}
    raw = await plain.get_session(T, "old")
    assert raw.title is not None
    assert raw.title.startswith("~sealed:")


async def test_a_session_deleted_during_a_reseal_is_passed_over(
    sealed_store: SealedStore, monkeypatch: Any
) -> None:
    for n in range(3):
        await fill(sealed_store, f"s{n}")
    rotated = SealedStore(sealed_store.wrapped, sealed_store.keyring.rotated("k-new"))
    inner = rotated.wrapped
    read = inner.read_entries

    async def deleted_first(tenant: str, session_id: str, **window: Any) -> Any:
        if session_id == "s1":
            await inner.delete_session(tenant, session_id)  # another writer, meanwhile
        return await read(tenant, session_id, **window)

    monkeypatch.setattr(inner, "read_entries", deleted_first)
    report = await reseal(rotated, T)
    assert (report.sessions_resealed, report.entries_resealed) == (3, 2)
    assert report.events_resealed == 3
    monkeypatch.undo()
    only_new = SealedStore(rotated.wrapped, rotated.keyring.without(sealed_store.keyring.current))
    for n in (0, 2):
        assert (await everything(only_new, f"s{n}"))[1][0][4] == {"t": f"s{n}"}


async def test_payload_rewrites_are_not_offered_through_the_seal(
    sealed_store: SealedStore,
) -> None:
    # They write raw payloads: through the wrapper they would bypass sealing.
    for name in ("rewrite_entry_payloads", "rewrite_event_payloads", "rewrite_session_fields"):
        assert not hasattr(sealed_store, name)


async def test_named_namespaces_add_to_the_defaults_and_left_counts_every_row(
    sealed_store: SealedStore,
) -> None:
    old = sealed_store.keyring.current
    await fill(sealed_store, "s1")
    await sealed_store.put_record(T, "ltm.default", "m1", {"fact": "tea"})
    rotated = SealedStore(sealed_store.wrapped, sealed_store.keyring.rotated("k-new"))

    check = await reseal(rotated, T, namespaces=["ltm.default"], check=True)
    assert check.checked
    assert check.left == {old: 5}
    assert check.left_kinds == {old: {"sessions": 1, "entries": 1, "events": 1, "records": 2}}
    assert check.old_keys("k-new") == [old]
    assert (check.sessions_resealed, check.entries_resealed, check.records_resealed) == (0, 0, 0)
    assert await everything(rotated, "s1") == await everything(sealed_store, "s1")

    report = await reseal(rotated, T, namespaces=["ltm.default"])
    assert (report.records, report.records_resealed, report.left) == (2, 2, {})
    assert report.sealed_with == {"k-new": 5}
    assert (report.namespaces[0], report.namespaces[-1]) == ("runs", "ltm.default")
    only_new = SealedStore(rotated.wrapped, rotated.keyring.without(old))
    assert (await only_new.get_record(T, "runs", "run-s1")).value == {"r": "s1"}
    assert (await only_new.get_record(T, "ltm.default", "m1")).value == {"fact": "tea"}
    assert (await reseal(only_new, T, check=True)).old_keys("k-new") == []
