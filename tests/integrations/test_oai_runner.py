"""The SDK's real ``Runner`` with a scripted model over `StatekeeperSession`, and the
human-in-the-loop flow through `RunStateStore`: stop for approval, list what waits,
decide from elsewhere, restore and resume (here and in another process)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from agents import Runner, SQLiteSession
from oai_app import (
    RUN_CONFIG,
    ScriptedModel,
    approval_turns,
    call,
    make_agent,
    say,
    think,
)
from test_oai_parity import run_python, store_with_url

from statekeeper.errors import (
    ConflictError,
    InvalidIdError,
    InvalidInputError,
    NotFoundError,
    SchemaVersionError,
    StoreCorruptError,
)
from statekeeper.integrations.openai_agents import (
    PendingApproval,
    RunStateStore,
    StatekeeperSession,
)
from statekeeper.integrations.openai_agents.run_states import NAMESPACE
from statekeeper.stores import Store

HERE = Path(__file__).parent


async def converse(session: Any) -> list[Any]:
    """Two user turns through the Runner (a tool call, then a plain answer)."""
    model = ScriptedModel(
        [
            [think("look it up"), call("lookup", {"order": 7})],
            [say("Order 7 left the depot.", 2)],
            [say("You're welcome.", 3)],
        ]
    )
    agent = make_agent(model)
    first = await Runner.run(agent, "Where is order 7?", session=session, run_config=RUN_CONFIG)
    second = await Runner.run(agent, "Thanks!", session=session, run_config=RUN_CONFIG)
    assert (first.final_output, second.final_output) == (
        "Order 7 left the depot.",
        "You're welcome.",
    )
    return model.inputs


async def test_a_conversation_through_the_runner_matches_sqlite_session(
    store: Store, tmp_path: Path
) -> None:
    theirs = SQLiteSession("c", tmp_path / "sdk.db")
    try:
        their_inputs = await converse(theirs)
        their_items = await theirs.get_items()
    finally:
        theirs.close()
    ours = StatekeeperSession("c", store)
    our_inputs = await converse(ours)
    assert json.dumps(await ours.get_items()) == json.dumps(their_items)
    assert our_inputs == their_inputs  # the model saw the same history
    kinds = [item.get("type", "message") for item in their_items]
    assert kinds == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
        "message",
        "message",
    ]


async def start(store: Store, session_id: str = "hitl") -> tuple[str, StatekeeperSession]:
    """Run until the agent stops for approval; save the state. Returns the run id."""
    session = StatekeeperSession(session_id, store)
    agent = make_agent(ScriptedModel(approval_turns()[:1]))
    result = await Runner.run(agent, "Delete the report", session=session, run_config=RUN_CONFIG)
    assert [i.name for i in result.interruptions] == ["delete_file"]
    saved = await RunStateStore(store).save(result, session_id=session_id)
    return saved.run_id, session


async def resume(store: Store, run_id: str, session: StatekeeperSession) -> Any:
    agent = make_agent(ScriptedModel(approval_turns()[1:]))
    runs = RunStateStore(store)
    state = await runs.restore(run_id, agent)
    result = await Runner.run(agent, state, session=session, run_config=RUN_CONFIG)
    await runs.update(run_id, result)
    return result


async def test_approve_in_one_place_resume_in_another(store: Store) -> None:
    run_id, session = await start(store)
    approver = RunStateStore(store)  # another handle, as another process would have
    [waiting] = await approver.pending()
    assert waiting == PendingApproval(
        run_id=run_id,
        call_id="call_1",
        tool_name="delete_file",
        arguments='{"path": "/tmp/report.txt"}',
        agent="ops",
        session_id="hitl",
        saved_at=waiting.saved_at,
    )
    assert waiting.parsed_arguments == {"path": "/tmp/report.txt"}
    decided = await approver.approve(run_id, "call_1", decided_by="ana")
    assert decided.pending == []
    assert decided.calls[0].decision == "approved"
    assert await approver.pending() == []

    result = await resume(store, run_id, session)
    assert result.final_output == "Done: the file is gone."
    items = await session.get_items()
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert outputs == [
        {"call_id": "call_1", "output": "deleted /tmp/report.txt", "type": "function_call_output"}
    ]
    assert [i.get("type") for i in items].count("function_call") == 1  # no duplicate call
    with pytest.raises(NotFoundError):  # finished: update() deleted the saved state
        await approver.get(run_id)


async def test_a_rejected_call_is_not_run_and_the_model_is_told(store: Store) -> None:
    run_id, session = await start(store)
    await RunStateStore(store).reject(run_id, "call_1", message="not today")
    result = await resume(store, run_id, session)
    assert result.final_output == "Done: the file is gone."  # the script says so anyway
    outputs = [i for i in await session.get_items() if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == ["not today"]  # type: ignore[typeddict-item]


async def test_an_undecided_call_stops_the_run_again(store: Store) -> None:
    run_id, session = await start(store)
    result = await resume(store, run_id, session)
    assert [i.name for i in result.interruptions] == ["delete_file"]
    [still] = await RunStateStore(store).pending()
    assert (still.run_id, still.call_id, still.session_id) == (run_id, "call_1", "hitl")
    await RunStateStore(store).approve(run_id, "call_1")
    assert (await resume(store, run_id, session)).final_output == "Done: the file is gone."


async def test_a_decision_that_does_not_match_the_call_fails_closed(store: Store) -> None:
    run_id, session = await start(store)
    runs = RunStateStore(store)
    await runs.approve(run_id, "call_1")
    record = await store.get_record("default", NAMESPACE, run_id)
    value = json.loads(json.dumps(record.value))
    value["decisions"]["call_1"]["arguments"] = '{"path": "/tmp/other.txt"}'
    await store.put_record("default", NAMESPACE, run_id, value)
    await resume(store, run_id, session)
    outputs = [i for i in await session.get_items() if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == [  # type: ignore[typeddict-item]
        "rejected: the approval did not match this call"
    ]


async def test_concurrent_approvers_both_count(store: Store) -> None:
    session = StatekeeperSession("two", store)
    turns: list[list[Any]] = [
        [call("delete_file", {"path": "/a"}, 1), call("delete_file", {"path": "/b"}, 2)],
        [say("Both gone.", 3)],
    ]
    agent = make_agent(ScriptedModel(turns[:1]))
    result = await Runner.run(agent, "Delete a and b", session=session, run_config=RUN_CONFIG)
    runs = RunStateStore(store)
    run_id = (await runs.save(result)).run_id
    assert sorted(p.call_id for p in await runs.pending()) == ["call_1", "call_2"]
    await asyncio.gather(
        RunStateStore(store).approve(run_id, "call_1"),
        RunStateStore(store).reject(run_id, "call_2", message="keep b"),
    )
    saved = await runs.get(run_id)
    assert {c.call_id: c.decision for c in saved.calls} == {
        "call_1": "approved",
        "call_2": "rejected",
    }
    agent = make_agent(ScriptedModel(turns[1:]))
    state = await runs.restore(run_id, agent)
    await Runner.run(agent, state, session=session, run_config=RUN_CONFIG)
    outputs = [i for i in await session.get_items() if i.get("type") == "function_call_output"]
    assert {o["call_id"]: o["output"] for o in outputs} == {  # type: ignore[typeddict-item]
        "call_1": "deleted /a",
        "call_2": "keep b",
    }


async def test_decisions_are_checked_and_scoped(store: Store) -> None:
    run_id, _ = await start(store)
    runs = RunStateStore(store)
    with pytest.raises(NotFoundError, match="pending: call_1"):
        await runs.approve(run_id, "call_9")
    await runs.approve(run_id, "call_1")
    await runs.approve(run_id, "call_1")  # the same decision again changes nothing
    with pytest.raises(ConflictError, match="already approved"):
        await runs.reject(run_id, "call_1")
    with pytest.raises(NotFoundError):
        await runs.approve("run-unknown", "call_1")
    with pytest.raises(InvalidInputError, match="message must be a string"):
        await runs.reject(run_id, "call_1", message=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="call_id must be a string"):
        await runs.approve(run_id, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdError):
        await runs.get("../etc/passwd")
    with pytest.raises(InvalidIdError):
        RunStateStore(store, tenant="a/b")
    with pytest.raises(InvalidInputError, match="run result"):
        await runs.save({"not": "a run"})
    other = RunStateStore(store, tenant="other-tenant")
    assert await other.pending() == []
    assert await other.list() == []
    with pytest.raises(NotFoundError):
        await other.get(run_id)
    with pytest.raises(NotFoundError):
        await other.restore(run_id, make_agent(ScriptedModel([])))
    assert [s.run_id for s in await runs.list()] == [run_id]


async def test_a_damaged_saved_run_is_reported_and_the_others_still_listed(
    store: Store,
) -> None:
    run_id, _ = await start(store)
    await store.put_record("default", NAMESPACE, "run-damaged", {"not": "a saved run"})
    runs = RunStateStore(store)
    listed = await runs.list()
    assert [s.run_id for s in listed] == [run_id]
    assert [c.id for c in listed.corrupt] == ["run-damaged"]
    assert "delete it" in listed.corrupt[0].error
    assert [p.run_id for p in await runs.pending()] == [run_id]
    with pytest.raises(StoreCorruptError, match="run-damaged"):
        await runs.get("run-damaged")
    with pytest.raises(StoreCorruptError):
        await runs.approve("run-damaged", "call_1")
    await runs.delete("run-damaged")  # the fix the error names works
    assert (await runs.list()).corrupt == []


async def test_always_must_be_a_bool(store: Store) -> None:
    run_id, _ = await start(store)
    runs = RunStateStore(store)
    with pytest.raises(InvalidInputError, match="always"):
        await runs.approve(run_id, "call_1", always="no")  # type: ignore[arg-type]
    assert (await runs.get(run_id)).decisions == {}


async def test_a_saved_state_from_a_newer_statekeeper_is_refused(store: Store) -> None:
    run_id, _ = await start(store)
    record = await store.get_record("default", NAMESPACE, run_id)
    value = json.loads(json.dumps(record.value))
    value["version"] = 99
    await store.put_record("default", NAMESPACE, run_id, value)
    with pytest.raises(SchemaVersionError, match="upgrade statekeeper"):
        await RunStateStore(store).get(run_id)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "files", "redis", "postgres"])
async def test_resume_in_another_process(backend: str, tmp_path: Path) -> None:
    async with store_with_url(backend, tmp_path) as (store, url):
        run_id, session = await start(store)
        await RunStateStore(store).approve(run_id, "call_1")
        out = await run_python(str(HERE / "oai_app.py"), url, "resume", run_id, "default", "hitl")
        outcome = json.loads(out)
        assert outcome["final"] == "Done: the file is gone."
        assert outcome["items"] == await session.get_items()  # what the other process wrote
        assert [i.get("type") for i in outcome["items"]] == [
            None,  # the user's message
            "reasoning",
            "function_call",
            "function_call_output",
            "message",
        ]
        assert await RunStateStore(store).list() == []
