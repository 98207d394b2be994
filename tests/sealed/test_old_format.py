"""Stores sealed before entries were bound to their seq (envelope version 1) still read:
the rows frozen in tests/fixtures/sealed/version1_rows.json, as a sealed store wrote them,
load into every backend and open with their keyring; new rows are version 2, and
`reseal` moves the old entries to the new format (a check counts them first)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from statekeeper.stores.base import EntryDraft, EventDraft, SessionRecord
from statekeeper.stores.sealed import Keyring, SealedStore
from statekeeper.stores.sealed.reseal import reseal

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "sealed" / "version1_rows.json").read_text()
)
T = FIXTURE["tenant"]
PLAIN = FIXTURE["plain"]


async def load(sealed_store: SealedStore) -> SealedStore:
    """The fixture's rows written below the seal, and a store with the fixture's ring."""
    inner = sealed_store.wrapped
    await inner.create_session(SessionRecord(tenant=T, **FIXTURE["session"]))
    drafts = [
        EntryDraft(
            id=e["id"], kind=e["kind"], payload=e["payload"], parent=e["parent_seq"],
            side=e["side"], created_at=datetime.fromisoformat(e["created_at"]),
        )
        for e in FIXTURE["entries"]
    ]  # fmt: skip
    await inner.append_entries(T, "s1", drafts)
    record = FIXTURE["record"]
    await inner.put_record(T, record["namespace"], record["key"], record["value"])
    for e in FIXTURE["events"]:
        draft = EventDraft(
            stream=e["stream"], kind=e["kind"], payload=e["payload"],
            ts=datetime.fromisoformat(e["ts"]),
        )  # fmt: skip
        await inner.append_events(T, e["log_id"], [draft])
    return SealedStore(inner, Keyring.from_json(FIXTURE["keyring"]))


def envelope_versions(store: SealedStore, entries: list[Any]) -> list[int]:
    return [store.keyring.version_of(e.payload["~sealed"]) for e in entries]


async def test_version_1_rows_still_read(sealed_store: SealedStore) -> None:
    store = await load(sealed_store)
    head = await store.get_session(T, "s1")
    assert (head.title, head.metadata, head.state) == (
        PLAIN["title"], PLAIN["metadata"], PLAIN["state"],
    )  # fmt: skip
    entries = await store.read_entries(T, "s1")
    assert {e.id: e.payload for e in entries} == PLAIN["entries"]
    assert (await store.get_entry(T, "s1", "e2")).payload == PLAIN["entries"]["e2"]
    assert (await store.get_record(T, "runs", "r1")).value == PLAIN["record"]
    assert [e.payload for e in await store.read_events(T, "r1")] == [PLAIN["event"]]
    assert envelope_versions(store, await store.wrapped.read_entries(T, "s1")) == [1] * 4


async def test_new_entries_are_bound_and_reseal_binds_the_old(sealed_store: SealedStore) -> None:
    store = await load(sealed_store)
    await store.append_entries(T, "s1", [EntryDraft(id="e4", payload={"text": "new"})])
    raw = await store.wrapped.read_entries(T, "s1")
    assert envelope_versions(store, raw) == [1, 1, 1, 1, 2]

    check = await reseal(store, T, check=True)
    assert (check.unbound, check.left, check.entries_resealed) == (4, {}, 0)
    assert envelope_versions(store, await store.wrapped.read_entries(T, "s1")) == [1] * 4 + [2]

    report = await reseal(store, T)
    assert (report.entries_resealed, report.unbound, report.left) == (4, 0, {})
    assert envelope_versions(store, await store.wrapped.read_entries(T, "s1")) == [2] * 5
    entries = await store.read_entries(T, "s1")
    assert {e.id: e.payload for e in entries} == {**PLAIN["entries"], "e4": {"text": "new"}}
    assert (await reseal(store, T, check=True)).unbound == 0
