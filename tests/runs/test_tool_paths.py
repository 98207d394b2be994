"""Tool calls that go wrong: an unknown tool, bad arguments, a tool that raises or returns
something that is not JSON. Each call still gets exactly one result (stored together with
the call), the failure is reported as an error result and a ``tool/error`` event, and the
run goes on: the agent sees the error result at its next step."""

from __future__ import annotations

import json
from typing import Any

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.runs import Finish, Respond, Runner, RunResult, StepInput, Tool, ToolContext
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store
from statekeeper.stores.base import Event

ran: list[str] = []


async def echo(args: dict[str, Any], ctx: ToolContext) -> str:
    ran.append(f"echo:{json.dumps(args, sort_keys=True)}")
    return f"echo {args.get('text', '')}"


async def explode(args: dict[str, Any], ctx: ToolContext) -> str:
    ran.append("explode")
    raise RuntimeError("the disk is on fire")


async def unserialisable(args: dict[str, Any], ctx: ToolContext) -> Any:
    ran.append("unserialisable")
    return {"when": object()}


async def pay(args: dict[str, Any], ctx: ToolContext) -> str:
    ran.append("pay")
    return "paid"


TOOLS = [
    Tool("echo", echo),
    Tool("explode", explode),
    Tool("unserialisable", unserialisable),
    Tool("pay", pay, requires_approval=True),
]


def calling(*calls: ToolCallBlock) -> ScriptedAgent:
    """Makes ``calls`` in one message, then finishes with what it saw as results."""

    def report(run: StepInput) -> Finish:
        results = [r for m in run.messages for r in m.tool_results]
        return Finish({r.tool_call_id: [r.content, r.is_error] for r in results})

    return ScriptedAgent(
        "a", [Respond([Message.assistant("on it", tool_calls=list(calls))]), report]
    )


def raw_call(call_id: str, name: str, arguments: str) -> ToolCallBlock:
    return ToolCallBlock(id=call_id, name=name, arguments=arguments)


async def run_calls(store: Store, *calls: ToolCallBlock) -> RunResult:
    ran.clear()
    return await Runner(store, "alice", [calling(*calls)], TOOLS).start("a", "go")


async def stored_messages(store: Store, result: RunResult) -> list[Message]:
    session = await SessionManager(store, "alice").get(result.state.session_id)
    return await session.messages()


async def tool_events(store: Store, result: RunResult) -> list[Event]:
    return [e for e in await store.read_events("alice", result.run_id) if e.stream == "tool"]


def assert_each_call_has_one_result(messages: list[Message]) -> None:
    calls = [c.id for m in messages for c in m.tool_calls]
    results = [r.tool_call_id for m in messages for r in m.tool_results]
    assert sorted(calls) == sorted(results)
    assert len(results) == len(set(results))
    # Each result comes after its call.
    position = {c.id: i for i, m in enumerate(messages) for c in m.tool_calls}
    assert all(position[r.tool_call_id] < i for i, m in enumerate(messages) for r in m.tool_results)


async def test_an_unknown_tool_gets_an_error_result_and_the_run_goes_on(store: Store) -> None:
    result = await run_calls(store, raw_call("c1", "teleport", "{}"), raw_call("c2", "echo", "{}"))

    assert result.status == "completed"
    assert result.output == {
        "c1": ["error: no tool named 'teleport'", True],
        "c2": ["echo ", False],
    }
    assert result.state.tool_use == {"teleport": 1, "echo": 1}
    assert result.state.error is None
    messages = await stored_messages(store, result)
    assert_each_call_has_one_result(messages)
    events = await tool_events(store, result)
    assert [(e.kind, e.payload["call_id"]) for e in events] == [
        ("call_start", "c1"),
        ("error", "c1"),
        ("call_start", "c2"),
        ("result", "c2"),
    ]
    assert events[1].payload["error"] == "unknown tool"
    assert events[1].payload["tool"] == "teleport"


async def test_arguments_that_are_not_a_json_object_fail_without_running(store: Store) -> None:
    result = await run_calls(
        store,
        raw_call("bad-json", "echo", "{not json"),
        raw_call("a-list", "echo", "[1, 2]"),
        raw_call("fine", "echo", '{"text": "hi"}'),
    )

    assert result.status == "completed"
    assert ran == ['echo:{"text": "hi"}']  # the tool ran for the valid call only
    output = result.output
    assert isinstance(output, dict)
    assert output["bad-json"][1] is True
    assert output["bad-json"][0].startswith("error: invalid arguments: ")
    assert output["a-list"] == [
        "error: invalid arguments: arguments must be a JSON object, not list",
        True,
    ]
    assert output["fine"] == ["echo hi", False]
    assert_each_call_has_one_result(await stored_messages(store, result))
    errors = [e for e in await tool_events(store, result) if e.kind == "error"]
    assert [e.payload["call_id"] for e in errors] == ["bad-json", "a-list"]


async def test_bad_arguments_never_wait_for_approval(store: Store) -> None:
    result = await run_calls(store, raw_call("c1", "pay", "{oops"), raw_call("c2", "pay", "[1]"))

    assert result.status == "completed"  # not waiting_for_approval: the calls cannot run
    assert result.state.interruptions == []
    assert ran == []
    output = result.output
    assert isinstance(output, dict)
    assert output["c1"][0].startswith("error: invalid arguments")
    assert output["c2"][0].startswith("error: invalid arguments")
    assert_each_call_has_one_result(await stored_messages(store, result))


async def test_a_tool_that_raises_becomes_an_error_result(store: Store) -> None:
    result = await run_calls(store, raw_call("c1", "explode", "{}"), raw_call("c2", "echo", "{}"))

    assert result.status == "completed"
    assert ran == ["explode", "echo:{}"]  # a failing call does not stop the others
    assert result.output == {
        "c1": ["error: RuntimeError: the disk is on fire", True],
        "c2": ["echo ", False],
    }
    assert result.state.error is None
    assert result.state.tool_use == {"explode": 1, "echo": 1}
    assert_each_call_has_one_result(await stored_messages(store, result))
    error = next(e for e in await tool_events(store, result) if e.kind == "error")
    assert error.payload["call_id"] == "c1"
    assert "the disk is on fire" in error.payload["error"]


async def test_a_tool_output_that_is_not_json_becomes_an_error_result(store: Store) -> None:
    result = await run_calls(store, raw_call("c1", "unserialisable", "{}"))

    assert result.status == "completed"  # the run does not crash on the tool's output
    assert ran == ["unserialisable"]
    output = result.output
    assert isinstance(output, dict)
    text, is_error = output["c1"]
    assert is_error is True
    assert text.startswith("error: the tool's output is not JSON (dict)")
    assert_each_call_has_one_result(await stored_messages(store, result))
    kinds = [e.kind for e in await tool_events(store, result)]
    assert kinds == ["call_start", "error"]


async def test_an_approved_call_whose_tool_raises_is_stored_with_its_result(
    store: Store,
) -> None:
    ran.clear()

    async def refuse(args: dict[str, Any], ctx: ToolContext) -> str:
        raise PermissionError("card declined")

    agent = calling(raw_call("c1", "pay", "{}"), raw_call("c2", "echo", "{}"))
    tools = [Tool("pay", refuse, requires_approval=True), Tool("echo", echo)]
    runner = Runner(store, "alice", [agent], tools)
    waiting = await runner.start("a", "go")
    assert waiting.status == "waiting_for_approval"
    held = await stored_messages(store, waiting)
    assert not any(m.tool_calls for m in held)  # the call waits with the state, not stored

    await runner.approve(waiting.run_id, "c1")
    done = await runner.resume(waiting.run_id)

    assert done.status == "completed"
    assert done.output == {
        "c1": ["error: PermissionError: card declined", True],
        "c2": ["echo ", False],
    }
    assert_each_call_has_one_result(await stored_messages(store, done))
