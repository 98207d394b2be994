"""Run storage: write modes, leases, export/import, inspection, retention, pruning."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from statekeeper.core.messages import Message, utcnow
from statekeeper.core.metrics import TokenUsage
from statekeeper.errors import ConflictError, InvalidPayloadError, NotFoundError
from statekeeper.runs import AskInput, CheckpointOptions, Finish, ModelCall, Respond, Runner
from statekeeper.runs.inspect import RunInspector
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.runs.store import CHECKPOINT_KIND, RUNS_NAMESPACE
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store
from statekeeper.testing.damage import can_damage, damage_record


def chatty(steps: int) -> ScriptedAgent:
    talk = Respond(
        [Message.assistant("working")],
        call=ModelCall("gpt-x", TokenUsage(input_tokens=10, output_tokens=5), cost=0.001),
    )
    return ScriptedAgent("a", [talk] * steps + [Finish("done")])


async def checkpoints(store: Store, session_id: str) -> int:
    entries = await store.read_entries("alice", session_id)
    return sum(1 for e in entries if e.kind == CHECKPOINT_KIND)


@pytest.mark.parametrize("mode", ["step", "background", "exit"])
async def test_write_modes_all_end_with_the_same_transcript(store: Store, mode: Any) -> None:
    runner = Runner(store, "alice", [chatty(5)], checkpoints=CheckpointOptions(write_mode=mode))
    result = await runner.start("a", "go")
    assert result.status == "completed"
    session = await SessionManager(store, "alice").get(result.state.session_id)
    assert [m.text for m in await session.messages()] == ["go"] + ["working"] * 5
    loaded = await runner.load(result.run_id)
    assert loaded.status == "completed"
    assert loaded.turn == 6
    written = await checkpoints(store, result.state.session_id)
    if mode == "exit":
        assert written == 1  # one write when the run stops
    else:
        assert written >= 7


async def test_a_live_owner_keeps_the_run(store: Store) -> None:
    agent = ScriptedAgent("a", [AskInput("name?"), Finish("ok")])
    first = Runner(store, "alice", [agent])
    asked = await first.start("a", "hi")
    await first.runs.claim(asked.run_id, "otherhost:1:x", ttl=60)
    with pytest.raises(ConflictError, match="otherhost"):
        await Runner(store, "alice", [agent]).resume(asked.run_id, "Ada")
    done = await Runner(store, "alice", [agent]).resume(asked.run_id, "Ada", take_over=True)
    assert done.status == "completed"


async def test_export_and_import_move_a_run_between_stores(store: Store, tmp_path: Any) -> None:
    agent = ScriptedAgent(
        "a", [Respond([Message.assistant("one")]), AskInput("more?"), Finish("x")]
    )
    runner = Runner(store, "alice", [agent])
    asked = await runner.start("a", "hi")
    snapshot = await runner.runs.export(asked.run_id)

    other = await open_store(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        there = Runner(other, "bob", [agent])
        state = await there.runs.import_(snapshot)
        assert state.run_id == asked.run_id
        assert state.tenant == "bob"
        done = await there.resume(asked.run_id, "yes")
        assert done.status == "completed"
        texts = [
            m.text
            for m in await (await SessionManager(other, "bob").get(state.session_id)).messages()
        ]
        assert texts == ["hi", "one", "more?", "yes"]
        with pytest.raises(Exception, match="already exists"):
            await there.runs.import_(snapshot)
    finally:
        await other.close()
    with pytest.raises(InvalidPayloadError):
        await runner.runs.import_(snapshot[: len(snapshot) // 2])


async def test_inspection_survives_export_and_import(store: Store, tmp_path: Any) -> None:
    agent = ScriptedAgent("a", [*chatty(2).script[:2], AskInput("more?"), Finish("x")])
    runner = Runner(store, "alice", [agent])
    asked = await runner.start("a", "go")
    here = RunInspector(runner.runs, asked.run_id)
    before_responses = await here.model_responses()
    before_timeline = await here.timeline()
    assert len(before_responses) == 2
    assert before_timeline

    other = await open_store(f"sqlite:///{tmp_path / 'moved.db'}")
    try:
        there = Runner(other, "bob", [agent])
        state = await there.runs.import_(await runner.runs.export(asked.run_id))
        moved = RunInspector(there.runs, state.run_id)
        assert await moved.model_responses() == before_responses
        assert await moved.timeline() == before_timeline
        done = await there.resume(state.run_id, "yes")  # the log goes on after the import
        assert done.status == "completed"
        timeline = await RunInspector(there.runs, state.run_id).timeline()
        assert timeline[: len(before_timeline)] == before_timeline
        assert timeline[-1].target == "completed"
    finally:
        await other.close()


async def test_an_import_with_bad_events_creates_nothing(store: Store) -> None:
    runner = Runner(store, "alice", [chatty(1)])
    done = await runner.start("a", "go")
    data = json.loads(await runner.runs.export(done.run_id))
    data["events"].append({"stream": "x"})  # no kind
    data["run_id"] = "moved"
    data["session_id"] = "moved-session"
    with pytest.raises(InvalidPayloadError, match="events"):
        await runner.runs.import_(json.dumps(data))
    with pytest.raises(NotFoundError):
        await runner.runs.index("moved")
    with pytest.raises(NotFoundError):
        await store.get_session("alice", "moved-session")


async def test_inspection(store: Store) -> None:
    runner = Runner(store, "alice", [chatty(3)])
    result = await runner.start("a", "go")
    inspector = RunInspector(runner.runs, result.run_id)
    items = await inspector.items()
    assert [m.text for m in items.assistant] == ["working"] * 3
    assert [m.text for m in items.user] == ["go"]
    await inspector.items()
    assert inspector.recomputed == 1  # cached: the run did not change
    responses = await inspector.model_responses()
    assert [r.model for r in responses] == ["gpt-x"] * 3
    assert responses[0].usage["input_tokens"] == 10
    timeline = await inspector.timeline()
    assert [(c.source, c.target) for c in timeline] == [
        ("initializing", "running"),
        ("running", "completed"),
    ]
    assert await inspector.tool_counts() == {}


async def test_retention_and_pruning(store: Store) -> None:
    runner = Runner(store, "alice", [chatty(4)])
    result = await runner.start("a", "go")
    session_id = result.state.session_id
    before = await checkpoints(store, session_id)
    pruned = await runner.runs.prune_checkpoints(result.run_id)
    assert pruned == before - 1
    assert (await runner.load(result.run_id)).status == "completed"  # latest kept
    messages = await (await SessionManager(store, "alice").get(session_id)).messages()
    assert len(messages) == 5

    assert await runner.runs.delete_before(utcnow() - timedelta(days=1)) == []
    assert await runner.runs.delete_before(utcnow() + timedelta(seconds=1)) == [result.run_id]
    with pytest.raises(NotFoundError):
        await runner.load(result.run_id)
    sessions = SessionManager(store, "alice")
    assert session_id in await sessions.delete_before(utcnow() + timedelta(seconds=1))


async def test_a_damaged_last_run_index_is_reported_once(store: Store) -> None:
    if not can_damage(store):
        pytest.skip(f"{type(store).__name__} keeps nothing that can be damaged")
    runner = Runner(store, "alice", [chatty(0)])
    run_ids = sorted([(await runner.start("a", "go", run_id=f"r{i}")).run_id for i in range(4)])
    await damage_record(store, "alice", RUNS_NAMESPACE, run_ids[-1])  # the last one listed
    listed = await runner.runs.list(limit=10)
    assert [r.run_id for r in listed] == run_ids[:-1]
    assert [item.id for item in listed.corrupt] == [run_ids[-1]]  # once, not once a page
