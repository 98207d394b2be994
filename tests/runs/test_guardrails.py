"""Guardrails on a run: input and output guardrails (which end the run in ERROR when they
trip) and tool input / output guardrails (which block one call; the run goes on)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import JsonValue

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.errors import InvalidInputError
from statekeeper.runs import (
    AskInput,
    Finish,
    GuardrailResult,
    Guardrails,
    GuardrailTripped,
    Respond,
    Runner,
    RunResult,
    RunState,
    StepInput,
    Tool,
    ToolContext,
)
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store
from statekeeper.stores.base import Event

steps: list[str] = []
tool_runs: list[dict[str, Any]] = []


def no_secrets(messages: Sequence[Message]) -> GuardrailResult:
    found = any("password" in m.text for m in messages)
    return GuardrailResult(name="no_secrets", kind="input", triggered=found)


def never_called(messages: Sequence[Message]) -> GuardrailResult:
    raise AssertionError("a guardrail after a triggered one must not run")


def small_output(output: JsonValue) -> GuardrailResult:
    big = isinstance(output, int) and output > 100
    return GuardrailResult(name="small_output", kind="output", triggered=big, info={"seen": output})


def finishing(output: JsonValue) -> ScriptedAgent:
    def finish(run: StepInput) -> Finish:
        steps.append(",".join(m.text for m in run.new_input))
        return Finish(output, Message.assistant(f"result: {output}"))

    return ScriptedAgent("a", [finish])


async def texts(store: Store, state: RunState) -> list[str]:
    session = await SessionManager(store, "alice").get(state.session_id)
    return [m.text for m in await session.messages()]


async def events(store: Store, run_id: str) -> list[Event]:
    return await store.read_events("alice", run_id)


def guarded(store: Store, agent: Any, **checks: Any) -> Runner:
    return Runner(store, "alice", [agent], guardrails=Guardrails(**checks))


# -- input guardrails ----------------------------------------------------------------------


async def test_a_passing_input_guardrail_is_recorded_and_the_run_goes_on(store: Store) -> None:
    steps.clear()
    runner = guarded(store, finishing(7), input=[no_secrets])
    result = await runner.start("a", "hello")
    assert result.status == "completed"
    assert steps == ["hello"]
    assert [(g.name, g.kind, g.triggered) for g in result.state.guardrails] == [
        ("no_secrets", "input", False)
    ]


async def test_a_tripped_input_guardrail_ends_the_run_in_error(store: Store) -> None:
    steps.clear()
    runner = guarded(store, finishing(7), input=[no_secrets, never_called])
    with pytest.raises(GuardrailTripped) as caught:
        await runner.start("a", "my password is hunter2")

    assert steps == []  # the agent never saw the input
    assert caught.value.result.name == "no_secrets"
    state = caught.value.state
    assert state is not None
    assert state.status == "error"
    stored = await runner.load(state.run_id)
    assert stored.status == "error"
    assert stored.error is not None
    assert stored.error.type == "GuardrailTripped"
    assert stored.error.data == {"guardrail": "no_secrets", "kind": "input"}
    assert [(g.name, g.kind, g.triggered) for g in stored.guardrails] == [
        ("no_secrets", "input", True)
    ]
    assert "my password is hunter2" not in await texts(store, stored)  # never written
    log = await events(store, state.run_id)
    error = next(e for e in log if e.stream == "error")
    assert error.payload["guardrail"] == "no_secrets"
    assert error.payload["type"] == "GuardrailTripped"
    assert (log[-1].stream, log[-1].kind, log[-1].payload["status"]) == (
        "lifecycle",
        "end",
        "error",
    )
    with pytest.raises(InvalidInputError, match="finished run"):
        await runner.resume(state.run_id)


async def test_input_given_on_resume_goes_through_the_input_guardrails(store: Store) -> None:
    steps.clear()
    agent = ScriptedAgent("a", [AskInput("Your name?"), Finish("hi")])
    runner = guarded(store, agent, input=[no_secrets])
    asked = await runner.start("a", "hello")
    assert asked.status == "waiting_for_input"
    with pytest.raises(GuardrailTripped):
        await runner.resume(asked.run_id, "password: hunter2")
    stored = await runner.load(asked.run_id)
    assert stored.status == "error"
    assert [(g.kind, g.triggered) for g in stored.guardrails] == [("input", False), ("input", True)]
    assert "password: hunter2" not in await texts(store, stored)


async def test_messages_appended_to_the_session_mid_run_are_guarded_too(store: Store) -> None:
    steps.clear()

    async def sneak_in(run: StepInput) -> Respond:
        # Someone (another process, say) appends to the session while the run goes on.
        session = await SessionManager(store, "alice").get(run.state.session_id)
        await session.append(Message.user("the password is hunter2"), strict=False)
        return Respond([Message.assistant("working")])

    class Sneaky:
        name = "a"

        async def step(self, run: StepInput) -> Any:
            steps.append(",".join(m.text for m in run.new_input))
            if run.state.turn == 1:
                return await sneak_in(run)
            return Finish("acted on it")

    runner = guarded(store, Sneaky(), input=[no_secrets])
    with pytest.raises(GuardrailTripped):
        await runner.start("a", "hello")
    assert steps == ["hello"]  # the second step never ran
    assert [index.status for index in await runner.runs.list()] == ["error"]


# -- output guardrails ---------------------------------------------------------------------


async def test_a_passing_output_guardrail_is_recorded(store: Store) -> None:
    runner = guarded(store, finishing(7), output=[small_output])
    result = await runner.start("a", "go")
    assert result.status == "completed"
    assert result.output == 7
    assert [(g.name, g.kind, g.triggered, g.info) for g in result.state.guardrails] == [
        ("small_output", "output", False, {"seen": 7})
    ]


async def test_a_tripped_output_guardrail_ends_the_run_in_error(store: Store) -> None:
    runner = guarded(store, finishing(1000), output=[small_output])
    with pytest.raises(GuardrailTripped) as caught:
        await runner.start("a", "go")

    assert caught.value.state is not None
    state = await runner.load(caught.value.state.run_id)
    assert state.status == "error"
    assert state.output is None  # the refused output is not kept
    assert state.error is not None
    assert state.error.data == {"guardrail": "small_output", "kind": "output"}
    assert [(g.kind, g.triggered, g.turn) for g in state.guardrails] == [("output", True, 1)]
    stored = await texts(store, state)
    assert stored == ["go"]  # the finishing message was not written
    kinds = [(e.stream, e.kind) for e in await events(store, state.run_id)]
    assert ("error", "error") in kinds
    assert kinds[-1] == ("lifecycle", "end")


# -- tool guardrails -----------------------------------------------------------------------


async def transfer(args: dict[str, Any], ctx: ToolContext) -> JsonValue:
    tool_runs.append(args)
    return {"sent": args["amount"], "account": "DE00 1234"}


def limit_amount(args: dict[str, Any]) -> GuardrailResult:
    too_much = args.get("amount", 0) > 100
    return GuardrailResult(name="limit_amount", kind="tool_input", triggered=too_much)


def hide_accounts(output: JsonValue) -> GuardrailResult:
    leaks = "DE00" in json.dumps(output)
    return GuardrailResult(name="hide_accounts", kind="tool_output", triggered=leaks)


def transferring(amount: int) -> ScriptedAgent:
    call = ToolCallBlock(id="t1", name="transfer", arguments=json.dumps({"amount": amount}))

    def after(run: StepInput) -> Finish:
        result = next(r for m in run.messages for r in m.tool_results)
        return Finish({"result": result.content, "is_error": result.is_error})

    return ScriptedAgent("a", [Respond([Message.assistant("sending", tool_calls=[call])]), after])


async def run_transfer(store: Store, amount: int, tool: Tool) -> RunResult:
    tool_runs.clear()
    return await Runner(store, "alice", [transferring(amount)], [tool]).start("a", "pay")


def tool_events(log: list[Event]) -> list[tuple[str, dict[str, Any]]]:
    return [(e.kind, e.payload) for e in log if e.stream == "tool"]


async def test_a_passing_tool_input_guardrail_lets_the_call_run(store: Store) -> None:
    tool = Tool("transfer", transfer, input_guardrail=limit_amount)
    result = await run_transfer(store, 50, tool)
    assert result.status == "completed"
    assert tool_runs == [{"amount": 50}]
    assert [(g.name, g.kind, g.triggered) for g in result.state.guardrails] == [
        ("limit_amount", "tool_input", False)
    ]


async def test_a_tripped_tool_input_guardrail_blocks_the_call(store: Store) -> None:
    tool = Tool("transfer", transfer, input_guardrail=limit_amount)
    result = await run_transfer(store, 5000, tool)

    assert tool_runs == []  # the tool never ran
    assert result.status == "completed"  # the run goes on; the agent sees why
    assert result.output == {"result": "blocked by guardrail limit_amount", "is_error": True}
    assert result.state.tool_use == {"transfer": 1}
    assert [(g.kind, g.triggered, g.turn) for g in result.state.guardrails] == [
        ("tool_input", True, 1)
    ]
    stored = await texts(store, result.state)
    assert "blocked by guardrail limit_amount" in stored  # the call has its result
    log = tool_events(await events(store, result.run_id))
    assert [kind for kind, _ in log] == ["call_start", "error"]
    assert log[1][1]["guardrail"] == "limit_amount"
    assert log[1][1]["kind"] == "tool_input"


async def test_a_tripped_tool_output_guardrail_withholds_the_output(store: Store) -> None:
    tool = Tool("transfer", transfer, output_guardrail=hide_accounts)
    result = await run_transfer(store, 10, tool)

    assert tool_runs == [{"amount": 10}]  # the tool did run
    assert result.status == "completed"
    assert result.output == {"result": "blocked by guardrail hide_accounts", "is_error": True}
    assert [(g.kind, g.triggered) for g in result.state.guardrails] == [("tool_output", True)]
    stored = await texts(store, result.state)
    assert not any("DE00" in text for text in stored)  # the output never reached the transcript
    log = tool_events(await events(store, result.run_id))
    assert [kind for kind, _ in log] == ["call_start", "error"]
    assert log[1][1]["guardrail"] == "hide_accounts"
    assert not any("DE00" in json.dumps(payload) for _, payload in log)


async def test_a_passing_tool_output_guardrail_keeps_the_output(store: Store) -> None:
    def anything_goes(output: JsonValue) -> GuardrailResult:
        return GuardrailResult(name="anything_goes", kind="tool_output", triggered=False)

    tool = Tool("transfer", transfer, output_guardrail=anything_goes)
    result = await run_transfer(store, 10, tool)
    assert result.output == {
        "result": json.dumps({"sent": 10, "account": "DE00 1234"}),
        "is_error": False,
    }
    assert [(g.kind, g.triggered) for g in result.state.guardrails] == [("tool_output", False)]
    log = tool_events(await events(store, result.run_id))
    assert [kind for kind, _ in log] == ["call_start", "result"]
