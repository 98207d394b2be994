"""What a long-term record holds: only what its slot does not imply, and envelopes in
the older, complete form still read the same."""

from __future__ import annotations

from statekeeper.longterm import LongTermStore, rules
from statekeeper.stores import Store


async def test_an_envelope_holds_only_what_the_slot_does_not_imply(store: Store) -> None:
    memories = LongTermStore(store, tenant="alice")
    await memories.put(("users", "a"), "theme", {"v": 1})
    odd = "a key/with spaces"
    await memories.put(("users", "a"), odd, {"v": 2}, ttl=5)
    plain = await store.get_record("alice", "ltm.default", rules.slot(("users", "a"), "theme"))
    digested = await store.get_record("alice", "ltm.default", rules.slot(("users", "a"), odd))

    assert plain.value == {"value": {"v": 1}}  # its times are the record's
    assert set(digested.value) == {"value", "created_at", "key", "ttl"}
    await memories.put(("users", "a"), "theme", {"v": 3})
    updated = await store.get_record("alice", "ltm.default", plain.key)
    assert set(updated.value) == {"value", "created_at", "updated_at"}
    got = await memories.get(("users", "a"), "theme")
    assert got is not None
    assert got.created_at == plain.updated_at < got.updated_at


async def test_an_envelope_in_the_older_complete_form_reads_the_same(store: Store) -> None:
    memories = LongTermStore(store, tenant="alice")
    old = {
        "namespace": ["users", "a"],
        "key": "theme",
        "value": {"v": 1},
        "created_at": "2026-01-01T00:00:00+00:00",
        "updated_at": "2026-01-02T00:00:00+00:00",
        "ttl": None,
    }
    await store.put_record("alice", "ltm.default", "users.a.:theme", old)

    got = await memories.get(("users", "a"), "theme")
    assert got is not None
    assert (got.namespace, got.key, got.value) == (("users", "a"), "theme", {"v": 1})
    assert got.created_at.isoformat() == "2026-01-01T00:00:00+00:00"
    assert got.updated_at.isoformat() == "2026-01-02T00:00:00+00:00"
    assert [i.key for i in await memories.search(("users",), filter={"v": 1})] == ["theme"]
