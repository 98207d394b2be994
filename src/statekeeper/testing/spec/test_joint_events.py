"""An append that logs events (``append_entries(events=...)``): entries and events are
stored together or not at all, the events take their log's next seqs, and a replayed
append logs them once. A writer process killed mid-run leaves whole rounds only."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import pytest

from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    InvalidPayloadError,
    PayloadTooLargeError,
)
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import EventBatch, EventDraft
from statekeeper.testing.plugin import StoreOpener
from statekeeper.testing.registry import JOINT, PROCESSES, Backend, needs

from . import joint_writer
from .support import TENANT, draft, new_session
from .test_processes import PACKAGE_ROOT, WAIT

LOG = "run-j"


def events(*kinds: str, **payload: Any) -> EventBatch:
    """A batch of events on ``LOG``, one per kind."""
    return EventBatch(LOG, [EventDraft(stream="s", kind=k, payload=payload) for k in kinds])


async def test_an_append_logs_its_events_with_the_next_seqs_of_the_log(store: Store) -> None:
    await new_session(store, "s1")
    await store.append_events(TENANT, LOG, [EventDraft(stream="s", kind="before")] * 2)
    result = await store.append_entries(
        TENANT, "s1", [draft("e1"), draft("e2")], events=events("a", "b", text="héllo")
    )
    assert [(e.seq, e.kind, e.payload) for e in result.events] == [
        (3, "a", {"text": "héllo"}),
        (4, "b", {"text": "héllo"}),
    ]
    assert [e.log_id for e in result.events] == [LOG, LOG]
    assert (await store.read_events(TENANT, LOG))[2:] == result.events
    assert [e.id for e in await store.read_entries(TENANT, "s1")] == ["e1", "e2"]
    later = await store.append_events(TENANT, LOG, [EventDraft(stream="s", kind="after")])
    assert [e.seq for e in later] == [5]


async def test_an_append_without_events_logs_none(store: Store) -> None:
    await new_session(store, "s1")
    plain = await store.append_entries(TENANT, "s1", [draft("e1")])
    empty = await store.append_entries(TENANT, "s1", [draft("e2")], events=EventBatch(LOG, []))
    assert plain.events == empty.events == []
    assert await store.read_events(TENANT, LOG) == []


@pytest.mark.parametrize(
    ("batch", "error"),
    [
        (EventBatch(LOG, [EventDraft(stream="s", kind="k", payload={"x": object()})]), "payload"),
        (EventBatch("bad id!", [EventDraft(stream="s", kind="k")]), "id"),
    ],
)
async def test_a_refused_event_writes_no_entries(
    store: Store, batch: EventBatch, error: str
) -> None:
    before = await new_session(store, "s1")
    expected = InvalidPayloadError if error == "payload" else InvalidInputError
    with pytest.raises(expected):
        await store.append_entries(TENANT, "s1", [draft("e1")], events=batch)
    assert await store.get_session(TENANT, "s1") == before
    assert await store.read_entries(TENANT, "s1") == []
    assert await store.read_events(TENANT, LOG) == []


async def test_an_oversized_event_writes_nothing(open_test_store: StoreOpener) -> None:
    small = await open_test_store(max_payload_bytes=1000)
    before = await new_session(small, "s1")
    with pytest.raises(PayloadTooLargeError):
        await small.append_entries(
            TENANT, "s1", [draft("e1")], events=events("a", "b", blob="x" * 2000)
        )
    assert await small.get_session(TENANT, "s1") == before
    assert await small.read_entries(TENANT, "s1") == []
    assert await small.read_events(TENANT, LOG) == []


async def test_refused_entries_log_no_events(store: Store) -> None:
    await new_session(store, "s1")
    first = await store.append_entries(TENANT, "s1", [draft("e1")])
    with pytest.raises(ConflictError):  # a stale version
        await store.append_entries(
            TENANT, "s1", [draft("e2")], expected_version=first.session.version - 1,
            events=events("stale"),
        )  # fmt: skip
    with pytest.raises(ConflictError):  # an id stored with other content
        await store.append_entries(TENANT, "s1", [draft("e1", other=True)], events=events("taken"))
    with pytest.raises(InvalidInputError):  # a parent that is no entry
        await store.append_entries(TENANT, "s1", [draft("e3", parent=9)], events=events("p"))
    assert await store.read_events(TENANT, LOG) == []
    assert [e.id for e in await store.read_entries(TENANT, "s1")] == ["e1"]


async def test_a_replayed_append_logs_its_events_once(store: Store) -> None:
    await new_session(store, "s1")
    drafts = [draft("e1"), draft("e2")]
    first = await store.append_entries(TENANT, "s1", drafts, events=events("a", "b"))
    again = await store.append_entries(TENANT, "s1", drafts, events=events("a", "b"))
    assert again.replayed
    assert again.events == []
    assert again.entries == first.entries
    assert await store.read_events(TENANT, LOG) == first.events


async def test_concurrent_appends_each_log_their_events_whole(store: Store) -> None:
    await new_session(store, "s1")
    results = await asyncio.gather(
        *(
            store.append_entries(TENANT, "s1", [draft(f"e{n}")], events=events(f"{n}a", f"{n}b"))
            for n in range(6)
        )
    )
    logged = await store.read_events(TENANT, LOG)
    assert [e.seq for e in logged] == list(range(1, 13))
    assert sorted((e for r in results for e in r.events), key=lambda e: e.seq) == logged
    for n, result in enumerate(results):
        assert [e.kind for e in result.events] == [f"{n}a", f"{n}b"]
        assert result.events[1].seq == result.events[0].seq + 1  # a batch is never split
    entries = {e.id: e.seq for e in await store.read_entries(TENANT, "s1")}
    # The events are logged in the order the entries were committed.
    order = sorted(range(6), key=lambda n: entries[f"e{n}"])
    assert [r.events[0].seq for r in (results[n] for n in order)] == list(range(1, 13, 2))


# No module-level pytestmark: a project may import these tests into a module of its own.
@needs(PROCESSES)
@pytest.mark.slow
async def test_a_writer_killed_mid_run_leaves_whole_rounds(
    store: Store, store_url: str, store_backend: Backend
) -> None:
    """Kill a process appending entries with events, at full speed, without warning: every
    round it left is whole (its two entries and its two events) or absent, apart from the
    files backend's documented gap (its last round's events may be missing: two files
    cannot change in one step)."""
    await new_session(store, joint_writer.SESSION)
    paths = [PACKAGE_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "statekeeper.testing.spec.joint_writer"),
        *(store_url, *store_backend.imports),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
    )
    assert proc.stdout is not None
    try:
        acknowledged = -1
        while acknowledged < 30:  # well into the run: it is appending as fast as it can
            line = await asyncio.wait_for(proc.stdout.readline(), WAIT)
            if not line:
                _, err = await proc.communicate()
                pytest.fail(f"the writer stopped: {err.decode()}")
            acknowledged = int(line)
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.communicate()  # reads the pipes to their end and closes them

    async with open_store(store_url) as later:  # as the next process would find it
        entries = await later.read_entries(TENANT, joint_writer.SESSION)
        logged = await later.read_events(TENANT, joint_writer.LOG)
    rounds = len(entries) // 2
    assert [e.id for e in entries] == [f"j{n}-{i}" for n in range(rounds) for i in range(2)]
    assert rounds > acknowledged  # nothing acknowledged was lost
    assert [e.seq for e in logged] == list(range(1, len(logged) + 1))
    kinds = [e.kind for e in logged]
    logged_rounds = len(kinds) // 2
    assert kinds == [str(n) for n in range(logged_rounds) for _ in range(2)]
    if store_backend.has(JOINT):
        assert logged_rounds == rounds  # both or neither
    else:  # the last append's events may be missing, never an append's entries
        assert logged_rounds in (rounds, rounds - 1)
