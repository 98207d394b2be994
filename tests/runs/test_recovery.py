"""Recovery: corrupt checkpoints, runs whose lane was cleared, an index that lags."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from statekeeper.core.messages import Message
from statekeeper.errors import StoreCorruptError
from statekeeper.runs import AskInput, Coordination, Finish, Respond, Runner, StepInput
from statekeeper.runs.recovery import CheckpointCorruptError
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.runs.store import CHECKPOINT_KIND, checkpoint_id
from statekeeper.runtime import CommandLanes
from statekeeper.runtime.lanes import LaneClearedError
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import Entry, EntryDraft
from statekeeper.stores.rules import corrupt_entry


def talker() -> ScriptedAgent:
    """Three steps that talk, then a question, then done."""
    talk = [Respond([Message.assistant(word)]) for word in ("one", "two", "three")]
    return ScriptedAgent("a", [*talk, AskInput("name?"), Finish("done")])


def damage(monkeypatch: pytest.MonkeyPatch, store: Store, *entry_ids: str) -> None:
    """Make the store read the given entries back as rows it cannot decode."""
    original = store.read_entries

    async def read_entries(*args: Any, **kwargs: Any) -> list[Entry]:
        return [
            corrupt_entry(e.seq, e.id, e.parent_seq, e.created_at, "{not json", "damaged")
            if e.id in entry_ids
            else e
            for e in await original(*args, **kwargs)
        ]

    monkeypatch.setattr(store, "read_entries", read_entries)


async def checkpoint_ids(store: Store, session_id: str) -> list[str]:
    entries = await store.read_entries("alice", session_id)
    return [e.id for e in entries if e.kind == CHECKPOINT_KIND]


async def corrupt_events(store: Store, run_id: str) -> list[dict[str, Any]]:
    events = await store.read_events("alice", run_id)
    return [e.payload for e in events if e.payload.get("type") == "checkpoint_corrupt"]


async def test_a_corrupt_latest_checkpoint_falls_back_to_the_newest_intact_one(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = Runner(store, "alice", [talker()])
    asked = await runner.start("a", "hi")
    assert asked.status == "waiting_for_input"
    ids = await checkpoint_ids(store, asked.state.session_id)
    latest, before = ids[-1], ids[-2]
    damage(monkeypatch, store, latest)

    loaded = await runner.runs.load_latest(asked.run_id)
    assert loaded.state.status == "running"
    assert loaded.state.turn == 3  # the step before the question
    assert [s.id for s in loaded.skipped] == [latest]
    assert loaded.checkpoint_id == before
    assert loaded.index.turn == 3  # the index follows what load sees
    assert loaded.state.revision >= asked.state.revision  # new writes get fresh ids

    [event] = await corrupt_events(store, asked.run_id)
    assert event["checkpoint"] == latest
    assert event["loaded"] == before
    assert latest in event["message"]
    await runner.load(asked.run_id)  # reported once, not on every load
    assert len(await corrupt_events(store, asked.run_id)) == 1

    again = await runner.resume(asked.run_id)  # the lost step runs again
    assert again.status == "waiting_for_input"
    done = await runner.resume(asked.run_id, "Ada")
    assert done.status == "completed"
    assert (await runner.load(asked.run_id)).status == "completed"


async def test_a_checkpoint_that_fails_validation_is_skipped(store: Store) -> None:
    runner = Runner(store, "alice", [talker()])
    asked = await runner.start("a", "hi")
    bad = checkpoint_id(asked.run_id, asked.state.revision + 1)
    payload = {"run_id": asked.run_id, "schema_version": 2, "status": 7, "turn": -1}
    draft = EntryDraft(id=bad, kind=CHECKPOINT_KIND, payload=payload, side=True)
    await store.append_entries("alice", asked.state.session_id, [draft])  # stored for real

    loaded = await runner.runs.load_latest(asked.run_id)
    assert loaded.state.status == "waiting_for_input"
    assert [s.id for s in loaded.skipped] == [bad]
    assert "invalid run state" in loaded.skipped[0].reason
    done = await runner.resume(asked.run_id, "Ada")
    assert done.status == "completed"


async def test_nothing_intact_is_a_typed_error_naming_the_fix(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = Runner(store, "alice", [talker()])
    asked = await runner.start("a", "hi")
    ids = await checkpoint_ids(store, asked.state.session_id)
    damage(monkeypatch, store, *ids)
    with pytest.raises(CheckpointCorruptError) as caught:
        await runner.load(asked.run_id)
    assert isinstance(caught.value, StoreCorruptError)
    assert ids[-1] in str(caught.value)
    assert "export" in str(caught.value)
    assert [s.id for s in caught.value.skipped] == ids[::-1]


async def test_a_checkpoint_damaged_on_disk_in_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with await open_store(url) as store:
        asked = await Runner(store, "alice", [talker()]).start("a", "hi")
        latest = (await checkpoint_ids(store, asked.state.session_id))[-1]
    with sqlite3.connect(tmp_path / "state.db") as conn:
        changed = conn.execute("UPDATE entries SET payload='{not json' WHERE id=?", (latest,))
        assert changed.rowcount == 1
    conn.close()
    async with await open_store(url) as store:
        runner = Runner(store, "alice", [talker()])
        loaded = await runner.runs.load_latest(asked.run_id)
        assert [s.id for s in loaded.skipped] == [latest]
        assert loaded.state.turn == 3
        assert (await runner.resume(asked.run_id)).status == "waiting_for_input"


# -- a run whose lane was cleared ---------------------------------------------------------


class Lanes(CommandLanes):
    """Command lanes that tell when a task was queued."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted = asyncio.Event()

    def submit(self, lane: str, fn: Any, **options: Any) -> Any:
        task = super().submit(lane, fn, **options)
        self.submitted.set()
        return task


async def cleared_start(store: Store, agent: Any, input: str) -> tuple[Runner, str, Lanes]:
    """Start run "run-q" of ``agent`` behind another run of its session, then clear the
    session's lane; returns the runner, the session id and the lanes."""
    lanes = Lanes()
    in_step, release = asyncio.Event(), asyncio.Event()

    class Blocking:
        name = "blocking"

        async def step(self, run: StepInput) -> Any:
            in_step.set()
            await release.wait()
            return Finish("first")

    runner = Runner(store, "alice", [Blocking(), agent], coordination=Coordination(lanes=lanes))
    session = await runner.sessions.create()
    first = asyncio.create_task(runner.start("blocking", "go", session_id=session.id))
    await in_step.wait()
    lanes.submitted.clear()
    queued = asyncio.create_task(
        runner.start(agent.name, input, session_id=session.id, run_id="run-q")
    )
    await lanes.submitted.wait()
    assert lanes.clear(f"session:{session.id}") == 1
    with pytest.raises(LaneClearedError):
        await queued
    release.set()
    await first
    return runner, session.id, lanes


async def test_a_run_whose_lane_was_cleared_is_paused_released_and_resumable(
    store: Store,
) -> None:
    runner, session_id, lanes = await cleared_start(
        store, ScriptedAgent("a", [Finish("second")]), "later"
    )
    state = await runner.load("run-q")  # loadable: it has a checkpoint
    assert state.status == "paused"
    index, _ = await runner.runs.index("run-q")
    assert index.owner is None
    assert index.lease_until is None
    assert index.status == "paused"
    texts = [m.text for m in await (await runner.sessions.get(session_id)).messages()]
    assert "later" not in texts  # the cleared start wrote nothing to the session

    done = await runner.resume("run-q", "later")
    assert done.status == "completed"
    await lanes.close()


async def test_a_cleared_run_can_be_cancelled(store: Store) -> None:
    runner, _, lanes = await cleared_start(store, ScriptedAgent("a", [Finish("x")]), "x")
    cancelled = await runner.cancel("run-q", "not needed")
    assert cancelled.status == "cancelled"
    await lanes.close()


# -- the index never lags behind what load sees -------------------------------------------


async def test_loading_rolls_the_index_forward_and_keeps_the_lease(store: Store) -> None:
    runner = Runner(store, "alice", [talker()])
    asked = await runner.start("a", "hi")
    await runner.runs.claim(asked.run_id, "otherhost:1:x", ttl=60)
    state, index_version, _ = await runner.runs.load(asked.run_id)
    state.turn += 1  # what a running runner writes between index updates
    await runner.runs.save(state, index_version=index_version, update_index=False)
    stale, _ = await runner.runs.index(asked.run_id)
    assert stale.turn == asked.state.turn

    loaded = await runner.runs.load_latest(asked.run_id)
    assert loaded.index.turn == state.turn
    fresh, _ = await runner.runs.index(asked.run_id)
    assert fresh.turn == state.turn
    assert fresh.owner == "otherhost:1:x"  # a look at the run does not drop its lease
    assert fresh.lease_until is not None
