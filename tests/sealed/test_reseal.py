"""Key rotation without downtime and the reseal job, on every backend: new writes use the
new key, old rows open with the old one, `reseal` moves heads and records forward (keeping
listings' order) and counts the entries left on each key; plain rows get sealed."""

from __future__ import annotations

from statekeeper.stores.base import EntryDraft, SessionPatch, SessionRecord
from statekeeper.stores.sealed import SealedStore
from statekeeper.stores.sealed.reseal import PLAIN, reseal

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

    calls: list[tuple[int, int]] = []
    report = await reseal(rotated, T, progress=lambda done, total: calls.append((done, total)))
    assert (report.sessions, report.sessions_resealed) == (2, 1)
    assert (report.records, report.records_resealed) == (2, 1)
    assert report.entries == {old: 1, "k-new": 1}  # entries stay on the key they were written
    assert calls == [(1, 2), (2, 2)]
    after = await rotated.wrapped.get_session(T, "s1")
    assert key_of_head(rotated, after) == {"k-new"}
    assert after.last_active == before.last_active  # listings keep their order
    assert after.version == before.version + 1
    raw_record = await rotated.wrapped.get_record(T, "runs", "run-s1")
    assert rotated.keyring.key_id_of(raw_record.value["~sealed"]) == "k-new"  # type: ignore[index,call-overload]

    # Without the old key, heads and records open; entries written with it do not.
    only_new = SealedStore(rotated.wrapped, rotated.keyring.without(old))
    opened = await only_new.get_session(T, "s1")
    assert (opened.title, opened.metadata, opened.state) == ("title s1", {"n": "s1"}, {"s": "s1"})
    assert (await only_new.get_record(T, "runs", "run-s1")).value == {"r": "s1"}

    again = await reseal(rotated, T)
    assert (again.sessions_resealed, again.records_resealed) == (0, 0)


async def test_reseal_seals_rows_from_before_encryption(sealed_store: SealedStore) -> None:
    plain = sealed_store.wrapped
    await plain.create_session(SessionRecord(id="old", tenant=T, title="plain", state={"a": 1}))
    await plain.put_record(T, "runs", "r1", {"v": 1})
    migrating = SealedStore(plain, sealed_store.keyring, allow_plain=True)
    report = await reseal(migrating, T)
    assert (report.sessions_resealed, report.records_resealed) == (1, 1)
    assert report.entries == {}
    strict = SealedStore(plain, sealed_store.keyring)
    assert (await strict.get_session(T, "old")).title == "plain"
    assert (await strict.get_record(T, "runs", "r1")).value == {"v": 1}
    raw = await plain.get_session(T, "old")
    assert raw.title is not None
    assert raw.title.startswith("~sealed:")
    assert PLAIN not in report.entries
