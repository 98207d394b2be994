"""Sealed rows are bound to where they live: a row copied to another session, entry,
tenant, record or log fails to open with a typed error, never as garbage; a changed row
too; a lost key is named; plain rows are refused unless allowed."""

from __future__ import annotations

from typing import Any

import pytest

from statekeeper.codec import StateTamperedError, WrongKeyError
from statekeeper.stores.base import EntryDraft, EventDraft, SessionRecord
from statekeeper.stores.sealed import Keyring, SealedStore

T, OTHER = "tenant-a", "tenant-b"


async def stored_entry_payload(store: SealedStore, session_id: str, entry_id: str) -> Any:
    return (await store.wrapped.get_entry(T, session_id, entry_id)).payload


async def two_sessions(store: SealedStore) -> None:
    for tenant, session_id in ((T, "s1"), (T, "s2"), (OTHER, "s1")):
        await store.create_session(SessionRecord(id=session_id, tenant=tenant))
    await store.append_entries(T, "s1", [EntryDraft(id="e1", payload={"text": "secret one"})])


@pytest.mark.parametrize(
    ("tenant", "session_id", "entry_id"),
    [(T, "s2", "e1"), (OTHER, "s1", "e1"), (T, "s1", "e2")],
    ids=["other-session", "other-tenant", "other-entry"],
)
async def test_entry_copied_elsewhere_reads_as_corrupt(
    sealed_store: SealedStore, tenant: str, session_id: str, entry_id: str
) -> None:
    await two_sessions(sealed_store)
    raw = await stored_entry_payload(sealed_store, "s1", "e1")
    await sealed_store.wrapped.append_entries(
        tenant, session_id, [EntryDraft(id=entry_id, payload=raw)]
    )
    [moved] = [e for e in await sealed_store.read_entries(tenant, session_id) if e.id == entry_id]
    assert moved.kind == "corrupt"
    assert "failed authentication" in moved.payload["error"]
    assert (await sealed_store.get_entry(tenant, session_id, entry_id)).kind == "corrupt"
    # The original still opens: one bad row hides nothing else.
    assert (await sealed_store.get_entry(T, "s1", "e1")).payload == {"text": "secret one"}


async def test_entry_kind_changed_reads_as_corrupt(sealed_store: SealedStore) -> None:
    await two_sessions(sealed_store)
    raw = await stored_entry_payload(sealed_store, "s1", "e1")
    await sealed_store.wrapped.append_entries(
        T, "s2", [EntryDraft(id="e1", kind="state", payload=raw)]
    )
    assert (await sealed_store.get_entry(T, "s2", "e1")).kind == "corrupt"


async def test_changed_entry_reads_as_corrupt(sealed_store: SealedStore) -> None:
    await two_sessions(sealed_store)
    raw = await stored_entry_payload(sealed_store, "s1", "e1")
    text = raw["~sealed"]
    flipped = text[:-6] + ("A" if text[-6] != "A" else "B") + text[-5:]
    await sealed_store.wrapped.append_entries(
        T, "s2", [EntryDraft(id="e1", payload={"~sealed": flipped})]
    )
    entry = await sealed_store.get_entry(T, "s2", "e1")
    assert entry.kind == "corrupt"


async def test_record_copied_to_another_key_or_tenant_raises(sealed_store: SealedStore) -> None:
    await sealed_store.put_record(T, "profiles", "alice", {"card": "4111"})
    raw = (await sealed_store.wrapped.get_record(T, "profiles", "alice")).value
    await sealed_store.wrapped.put_record(T, "profiles", "mallory", raw)
    await sealed_store.wrapped.put_record(OTHER, "profiles", "alice", raw)
    for tenant, key in ((T, "mallory"), (OTHER, "alice")):
        with pytest.raises(StateTamperedError, match="failed authentication"):
            await sealed_store.get_record(tenant, "profiles", key)
    assert (await sealed_store.get_record(T, "profiles", "alice")).value == {"card": "4111"}


async def test_event_copied_to_another_log_reads_as_corrupt(sealed_store: SealedStore) -> None:
    [event] = await sealed_store.append_events(
        T, "run-1", [EventDraft(stream="tool", kind="result", payload={"out": "secret"})]
    )
    [raw] = await sealed_store.wrapped.read_events(T, "run-1")
    copy = EventDraft(stream=raw.stream, kind=raw.kind, ts=raw.ts, payload=raw.payload)
    await sealed_store.wrapped.append_events(T, "run-2", [copy])
    [moved] = await sealed_store.read_events(T, "run-2")
    assert (moved.stream, moved.kind) == ("error", "corrupt")
    assert "failed authentication" in moved.payload["error"]
    assert (await sealed_store.read_events(T, "run-1"))[0].payload == event.payload


async def test_session_fields_copied_to_another_session_raise(sealed_store: SealedStore) -> None:
    await sealed_store.create_session(
        SessionRecord(id="s1", tenant=T, title="Divorce papers", state={"step": 3})
    )
    await sealed_store.create_session(SessionRecord(id="s2", tenant=T))
    raw = await sealed_store.wrapped.get_session(T, "s1")
    await sealed_store.wrapped.update_session(T, "s2", patch_of(raw, "title", "state"))
    with pytest.raises(StateTamperedError, match="failed authentication"):
        await sealed_store.get_session(T, "s2")


def patch_of(record: SessionRecord, *names: str) -> Any:
    from statekeeper.stores.base import SessionPatch

    return SessionPatch(set={n: getattr(record, n) for n in names})


async def test_lost_key_is_named_never_garbage(sealed_store: SealedStore) -> None:
    await two_sessions(sealed_store)
    await sealed_store.put_record(T, "ns", "k", {"v": 1})
    old = sealed_store.keyring.current
    stranger = SealedStore(sealed_store.wrapped, Keyring({"other": Keyring.new_key()}))
    with pytest.raises(WrongKeyError, match=f"key id {old!r}"):
        await stranger.read_entries(T, "s1")
    with pytest.raises(WrongKeyError, match=f"key id {old!r}"):
        await stranger.get_record(T, "ns", "k")


async def test_same_key_id_with_another_key_fails_authentication(
    sealed_store: SealedStore,
) -> None:
    await two_sessions(sealed_store)
    old = sealed_store.keyring.current
    impostor = SealedStore(sealed_store.wrapped, Keyring({old: Keyring.new_key()}))
    [entry] = await impostor.read_entries(T, "s1")
    assert entry.kind == "corrupt"


async def test_plain_rows_are_refused_unless_allowed(sealed_store: SealedStore) -> None:
    plain = sealed_store.wrapped
    await plain.create_session(SessionRecord(id="old", tenant=T, title="from before"))
    await plain.append_entries(T, "old", [EntryDraft(id="e1", payload={"text": "plain"})])
    await plain.put_record(T, "ns", "k", {"v": "plain"})
    with pytest.raises(StateTamperedError, match="allow_plain"):
        await sealed_store.get_session(T, "old")
    with pytest.raises(StateTamperedError, match="allow_plain"):
        await sealed_store.get_record(T, "ns", "k")
    [entry] = await sealed_store.read_entries(T, "old")
    assert entry.kind == "corrupt"
    lenient = SealedStore(plain, sealed_store.keyring, allow_plain=True)
    assert (await lenient.get_session(T, "old")).title == "from before"
    assert [e.payload for e in await lenient.read_entries(T, "old")] == [{"text": "plain"}]
    assert (await lenient.get_record(T, "ns", "k")).value == {"v": "plain"}
