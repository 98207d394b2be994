"""The events of a run tell the truth, in order: statuses before what they cause, model
calls with their content, each tool call announced once, partial (streamed) text."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.core.metrics import TokenUsage
from statekeeper.runs import (
    AskInput,
    Finish,
    ModelCall,
    Respond,
    Runner,
    StepInput,
    Tool,
    ToolContext,
)
from statekeeper.runs.inspect import RunInspector
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store, open_store

CALL = ModelCall("model-a", TokenUsage(input_tokens=10, output_tokens=5), cost=0.01)


async def refund(args: dict[str, Any], ctx: ToolContext) -> str:
    return "refunded"


async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    return "in transit"


TOOLS = [Tool("refund", refund, requires_approval=True), Tool("lookup", lookup)]


def call(call_id: str, name: str) -> ToolCallBlock:
    return ToolCallBlock(id=call_id, name=name, arguments=json.dumps({"order": 1}))


@pytest.fixture
async def mem() -> AsyncIterator[Store]:
    store = await open_store("memory://")
    yield store
    await store.close()


async def log(store: Store, run_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The run's events, with the text of the messages they name (`RunStore.events`)."""
    events = await Runner(store, "alice", []).runs.events(run_id)
    return [(e.stream, e.kind, e.payload) for e in events]


def brief(events: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, ...]]:
    """Each event as (stream, kind, the detail that tells it apart)."""
    out: list[tuple[str, ...]] = []
    for stream, kind, p in events:
        if kind == "status":
            out.append((stream, kind, p["status"]))
        elif stream == "tool":
            detail = "awaiting" if p.get("awaiting_approval") else p.get("output", "")
            out.append((stream, kind, p["call_id"], str(detail)))
        elif stream == "assistant":
            out.append((stream, kind, p["text"], str(p.get("model"))))
        else:
            out.append((stream, kind))
    return out


async def test_a_run_with_an_approval_publishes_its_events_in_order(mem: Store) -> None:
    agent = ScriptedAgent(
        "support",
        [
            Respond(
                [
                    Message.assistant(
                        "Refunding.", tool_calls=[call("c1", "refund"), call("c2", "lookup")]
                    )
                ],
                call=CALL,
            ),
            Finish("done", Message.assistant("Done."), call=CALL),
        ],
    )
    runner = Runner(mem, "alice", [agent], TOOLS)
    first = await runner.start("support", "refund please", headless=False)
    assert first.status == "waiting_for_approval"
    await runner.approve(first.run_id, "c1")
    done = await runner.resume(first.run_id)
    assert done.status == "completed"
    assert brief(await log(mem, done.run_id)) == [
        ("lifecycle", "start"),
        ("lifecycle", "status", "running"),
        ("assistant", "complete", "Refunding.", "model-a"),
        ("lifecycle", "status", "waiting_for_approval"),
        ("tool", "call_start", "c1", "awaiting"),
        ("tool", "call_start", "c2", ""),
        # resumed after the approval: the status change comes first, then what it releases
        ("lifecycle", "status", "running"),
        ("tool", "result", "c1", "refunded"),
        ("tool", "result", "c2", "in transit"),
        ("assistant", "complete", "Done.", "model-a"),
        ("lifecycle", "status", "completed"),
        ("lifecycle", "end"),
    ]


async def test_a_rejected_call_is_announced_once_and_fails(mem: Store) -> None:
    agent = ScriptedAgent(
        "support",
        [
            Respond([Message.assistant("Refunding.", tool_calls=[call("c1", "refund")])]),
            Finish("no"),
        ],
    )
    runner = Runner(mem, "alice", [agent], TOOLS)
    first = await runner.start("support", "refund please", headless=False)
    await runner.reject(first.run_id, "c1", reason="too much")
    await runner.resume(first.run_id)
    tool = [(k, p["call_id"]) for s, k, p in await log(mem, first.run_id) if s == "tool"]
    assert tool == [("call_start", "c1"), ("error", "c1")]


async def test_running_is_published_before_the_first_step_runs(mem: Store) -> None:
    seen: list[list[tuple[str, ...]]] = []

    async def look(run: StepInput) -> Finish:
        seen.append(brief(await log(mem, run.state.run_id)))
        return Finish("ok")

    class Looking:
        name = "a"

        async def step(self, run: StepInput) -> Finish:
            return await look(run)

    runner = Runner(mem, "alice", [Looking()])
    await runner.start("a", "hi")
    assert seen == [[("lifecycle", "start"), ("lifecycle", "status", "running")]]


async def test_resuming_with_input_publishes_running_before_the_step(mem: Store) -> None:
    seen: list[tuple[str, ...]] = []

    def answer(run: StepInput) -> Finish:
        return Finish(run.new_input[-1].text)

    class Asker(ScriptedAgent):
        async def step(self, run: StepInput) -> Any:
            if run.state.turn == 2:
                seen.extend(brief(await log(mem, run.state.run_id))[-1:])
            return await super().step(run)

    runner = Runner(mem, "alice", [Asker("a", [AskInput("Which order?"), answer])])
    first = await runner.start("a", "hi", headless=False)
    done = await runner.resume(first.run_id, "1042")
    assert done.output == "1042"
    assert seen == [("lifecycle", "status", "running")]


# -- model calls with their content -----------------------------------------------------


async def test_model_calls_are_published_with_their_content(mem: Store) -> None:
    agent = ScriptedAgent(
        "a",
        [
            Respond([Message.assistant("Looking.", tool_calls=[call("c1", "lookup")])], call=CALL),
            AskInput("Which order?", call=CALL),
            Finish({"order": 7}, call=CALL),
        ],
    )
    runner = Runner(mem, "alice", [agent], TOOLS)
    first = await runner.start("a", "hi", headless=False)
    await runner.resume(first.run_id, "7")
    said = [p for s, k, p in await log(mem, first.run_id) if s == "assistant"]
    assert [(p["text"], p["model"], p["cost"], p["turn"]) for p in said] == [
        ("Looking.", "model-a", 0.01, 1),
        ("Which order?", "model-a", 0.01, 2),
        ('{"order": 7}', "model-a", 0.01, 3),
    ]
    assert said[0]["tool_calls"] == [{"id": "c1", "name": "lookup"}]  # arguments: in the message
    assert said[0]["usage"]["input_tokens"] == 10
    assert said[2]["output"] == {"order": 7}
    assert all(p["text"] for p in said)  # never an empty text for a call that said something
    responses = await RunInspector(runner.runs, first.run_id).model_responses()
    assert [(r.text, r.model, r.turn) for r in responses] == [
        ("Looking.", "model-a", 1),
        ("Which order?", "model-a", 2),
        ('{"order": 7}', "model-a", 3),
    ]


async def test_a_message_without_a_model_call_is_published_once(mem: Store) -> None:
    agent = ScriptedAgent("a", [Respond([Message.assistant("Hi.")]), Finish("ok")])
    runner = Runner(mem, "alice", [agent])
    result = await runner.start("a", "hello")
    said = [(k, p["text"]) for s, k, p in await log(mem, result.run_id) if s == "assistant"]
    assert said == [("complete", "Hi.")]


# -- streaming --------------------------------------------------------------------------


async def test_an_agent_streams_partial_text(mem: Store) -> None:
    class Streaming:
        name = "a"

        async def step(self, run: StepInput) -> Finish:
            for piece in ("Hel", "lo", "!"):
                await run.stream(piece)
            return Finish("ok", Message.assistant("Hello!"), call=CALL)

    runner = Runner(mem, "alice", [Streaming()])
    result = await runner.start("a", "hi")
    said = [
        (k, p["text"], p.get("delta"))
        for s, k, p in await log(mem, result.run_id)
        if s == "assistant"
    ]
    assert said == [
        ("partial", "Hel", "Hel"),
        ("partial", "Hello", "lo"),
        ("partial", "Hello!", "!"),
        ("complete", "Hello!", None),
    ]
    kinds = [(s, k) for s, k, _ in await log(mem, result.run_id)]
    assert kinds.index(("lifecycle", "status")) < kinds.index(("assistant", "partial"))


async def test_stream_outside_a_runner_does_nothing() -> None:
    from statekeeper.runs import RunState

    state = RunState(tenant="alice", session_id="s1", agent="a")
    run = StepInput(state=state, messages=[], new_input=[], context=None, tools={})
    await run.stream("ignored")  # no runner: nowhere to publish, and no error


async def test_a_limit_pause_is_one_status_event_naming_the_limit(mem: Store) -> None:
    from statekeeper.core.limits import IterationFlag, Limits

    agent = ScriptedAgent("a", [Respond([Message.assistant("1")]), Finish("ok")])
    runner = Runner(mem, "alice", [agent])
    limits = Limits(iterations=IterationFlag(maximum=1, increase_amount=1))
    paused = await runner.start("a", "hi", headless=False, limits=limits)
    assert paused.status == "paused"
    statuses = [p for s, k, p in await log(mem, paused.run_id) if k == "status"]
    assert [p["status"] for p in statuses] == ["running", "paused"]
    assert (statuses[-1]["from"], statuses[-1]["to"]) == ("running", "paused")
    assert "iterations" in statuses[-1]["limit"]
