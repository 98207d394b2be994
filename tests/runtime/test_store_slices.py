"""Runtime components take the slice of the store protocol they use: the slice-only
objects that their suites also run on (``records-only``, ``log-only``) are not stores."""

from __future__ import annotations

from store_slices import EventLogOnly, RecordsOnly

from statekeeper.runtime import AuthProfiles, EventBus, SubagentRegistry
from statekeeper.stores.base import EventLogStore, RecordStore, Store, TranscriptStore
from statekeeper.stores.memory import MemoryStore


def test_the_slices_implement_one_protocol_and_not_the_whole_store() -> None:
    records, log = RecordsOnly(MemoryStore()), EventLogOnly(MemoryStore())
    assert isinstance(records, RecordStore)
    assert not isinstance(records, Store | EventLogStore | TranscriptStore)
    assert isinstance(log, EventLogStore)
    assert not isinstance(log, Store | RecordStore | TranscriptStore)


async def test_components_work_on_their_slice_alone() -> None:
    inner = MemoryStore()
    profiles = AuthProfiles(RecordsOnly(inner), "alice", "bot")
    await profiles.add("env:KEY", profile_id="k1")
    assert (await profiles.pick()).id == "k1"
    registry = SubagentRegistry(RecordsOnly(inner), "alice", owner_id="w1")
    await registry.register("r1", child_session_id="c1", requester_session_id="p1", task="t")
    assert [e.run_id for e in await registry.list()] == ["r1"]
    bus = EventBus(EventLogOnly(inner), "alice")
    await bus.publish("r1", "lifecycle", "start")
    assert [e.seq for e in await inner.read_events("alice", "r1")] == [1]
    await bus.aclose()
