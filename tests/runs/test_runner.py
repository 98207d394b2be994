"""The runner: steps, checkpoints, approvals, limits, cancel, handoffs, delegation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.core.metrics import TokenUsage
from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    LimitReachedError,
    NotFoundError,
)
from statekeeper.runs import (
    AskInput,
    Finish,
    Handoff,
    ModelCall,
    Respond,
    Runner,
    StepInput,
    Tool,
    ToolContext,
)
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

calls_made: list[str] = []


async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    calls_made.append(f"lookup:{args.get('order')}")
    return json.dumps({"order": args.get("order"), "status": "in transit"})


async def refund(args: dict[str, Any], ctx: ToolContext) -> str:
    calls_made.append(f"refund:{args.get('amount')}")
    return "refunded"


TOOLS = [
    Tool("lookup", lookup),
    Tool("refund", refund, requires_approval=True, approval_prompt="Refund money?"),
]


def call(call_id: str, name: str, **args: Any) -> ToolCallBlock:
    return ToolCallBlock(id=call_id, name=name, arguments=json.dumps(args))


def support_agent() -> ScriptedAgent:
    return ScriptedAgent(
        "support",
        [
            Respond(
                [Message.assistant("Checking.", tool_calls=[call("c1", "lookup", order=7)])],
                call=ModelCall("m1", TokenUsage(input_tokens=100, output_tokens=20), cost=0.01),
            ),
            Respond(
                [Message.assistant("Refunding.", tool_calls=[call("c2", "refund", amount=5)])],
                call=ModelCall("m1", TokenUsage(input_tokens=150, output_tokens=20), cost=0.02),
            ),
            Finish({"done": True}, Message.assistant("All done.")),
        ],
    )


def runner_for(store: Store, *agents: Any, **options: Any) -> Runner:
    return Runner(store, "alice", agents or [support_agent()], TOOLS, **options)


def pairs_are_whole(messages: list[Message]) -> None:
    calls = [c.id for m in messages for c in m.tool_calls]
    results = [r.tool_call_id for m in messages for r in m.tool_results]
    assert sorted(calls) == sorted(results)
    assert len(calls) == len(set(calls))


async def test_run_stops_for_approval_and_resumes_after_it(store: Store) -> None:
    calls_made.clear()
    runner = runner_for(store)
    first = await runner.start("support", "my refund please")
    assert first.status == "waiting_for_approval"
    assert [i.call_id for i in first.interruptions] == ["c2"]
    assert first.interruptions[0].prompt == "Refund money?"
    assert calls_made == ["lookup:7"]

    session = await SessionManager(store, "alice").get(first.state.session_id)
    stored = await session.messages()
    assert "Refunding." not in [m.text for m in stored]  # call held until its result exists
    pairs_are_whole(stored)

    other = runner_for(store)  # another process, say
    await other.approve(first.run_id, "c2", by="ops")
    done = await other.resume(first.run_id)
    assert done.status == "completed"
    assert done.output == {"done": True}
    assert calls_made == ["lookup:7", "refund:5"]
    final = await session.messages()
    pairs_are_whole(final)
    assert [m.text for m in final][-1] == "All done."
    assert done.state.tool_use == {"lookup": 1, "refund": 1}
    assert done.state.metrics.accumulated_cost == pytest.approx(0.03)
    assert done.state.trace.trace_id == first.state.trace.trace_id


async def test_rejection_is_the_tool_result_and_the_run_goes_on(store: Store) -> None:
    calls_made.clear()
    runner = runner_for(store)
    first = await runner.start("support", "refund")
    await runner.reject(first.run_id, "c2", reason="not eligible")
    done = await runner.resume(first.run_id)
    assert done.status == "completed"
    assert calls_made == ["lookup:7"]
    texts = [
        m.text
        for m in await (await SessionManager(store, "alice").get(done.state.session_id)).messages()
    ]
    assert "Tool call rejected: not eligible" in texts


async def test_approval_errors_fail_closed(store: Store) -> None:
    runner = runner_for(store)
    first = await runner.start("support", "refund")
    with pytest.raises(NotFoundError):
        await runner.approve(first.run_id, "no-such-call")
    waiting = await runner.resume(first.run_id)  # no decision yet: still waiting
    assert waiting.status == "waiting_for_approval"
    await runner.approve(first.run_id, "c2")
    with pytest.raises(ConflictError):
        await runner.reject(first.run_id, "c2")
    # A decision that no longer matches the call (tampered) is a rejection.
    state = await runner.load(first.run_id)
    state.decisions[0].arguments = '{"amount": 5000}'
    saved = await runner.runs.save(state, index_version=None)
    assert saved.state.decisions[0].arguments == '{"amount": 5000}'
    calls_made.clear()
    done = await runner.resume(first.run_id)
    assert done.status == "completed"
    assert "refund:5" not in calls_made


async def test_always_approve_skips_later_approvals(store: Store) -> None:
    calls_made.clear()
    twice = ScriptedAgent(
        "support",
        [
            Respond([Message.assistant("", tool_calls=[call("a", "refund", amount=1)])]),
            Respond([Message.assistant("", tool_calls=[call("b", "refund", amount=2)])]),
            Finish("ok"),
        ],
    )
    runner = runner_for(store, twice)
    first = await runner.start("support", "go")
    await runner.approve(first.run_id, "a", always=True)
    done = await runner.resume(first.run_id)
    assert done.status == "completed"
    assert calls_made == ["refund:1", "refund:2"]


async def test_completed_run_cannot_resume(store: Store) -> None:
    runner = runner_for(store, ScriptedAgent("a", [Finish("x")]))
    done = await runner.start("a", "hi")
    assert done.status == "completed"
    with pytest.raises(InvalidInputError, match="finished run"):
        await runner.resume(done.run_id)


async def test_headless_limit_raises_with_the_paused_state(store: Store) -> None:
    loop = ScriptedAgent("a", [Respond([Message.assistant("again")])])
    runner = runner_for(store, loop)
    with pytest.raises(LimitReachedError) as caught:
        await runner.start("a", "go", limits=Limits(iterations=IterationFlag(maximum=3)))
    state = caught.value.state
    assert state.status == "paused"  # stopped, resumable once the limit is raised
    assert state.error is None
    assert (await runner.load(state.run_id)).status == "paused"


async def test_interactive_limit_pauses_and_resumes_after_raise(store: Store) -> None:
    agent = ScriptedAgent("a", [Respond([Message.assistant("work")])] * 4 + [Finish("done")])
    runner = runner_for(store, agent)
    limits = Limits(iterations=IterationFlag(maximum=2, increase_amount=10))
    paused = await runner.start("a", "go", headless=False, limits=limits)
    assert paused.status == "paused"
    with pytest.raises(LimitReachedError):  # the limit was not raised: no step runs
        await runner.resume(paused.run_id)
    assert (await runner.load(paused.run_id)).turn == 2
    await runner.raise_limits(paused.run_id)
    done = await runner.resume(paused.run_id)
    assert done.status == "completed"


async def test_budget_limit(store: Store) -> None:
    spender = ScriptedAgent("a", [Respond([Message.assistant("$")], call=ModelCall("m", cost=0.4))])
    runner = runner_for(store, spender)
    with pytest.raises(LimitReachedError, match="budget"):
        await runner.start("a", "go", limits=Limits(budget=BudgetFlag(maximum=1.0)))


async def test_ask_input_then_resume_with_input(store: Store) -> None:
    def greet(run: StepInput) -> Finish:
        return Finish(f"hello {run.new_input[0].text}")

    agent = ScriptedAgent("a", [AskInput("Your name?", fields=["name"]), greet])
    runner = runner_for(store, agent)
    asked = await runner.start("a", "hi")
    assert asked.status == "waiting_for_input"
    with pytest.raises(InvalidInputError):
        await runner.resume(asked.run_id)
    done = await runner.resume(asked.run_id, "Ada")
    assert done.output == "hello Ada"


async def test_cancel_a_waiting_run(store: Store) -> None:
    runner = runner_for(store)
    first = await runner.start("support", "refund")
    state = await runner.cancel(first.run_id, "user left")
    assert state.status == "cancelled"
    with pytest.raises(InvalidInputError):
        await runner.resume(first.run_id)
    events = await store.read_events("alice", first.run_id)
    statuses = [
        (e.payload["from"], e.payload["to"])
        for e in events
        if e.kind == "status" and "from" in e.payload
    ]
    assert ("initializing", "running") in statuses
    assert statuses[-1] == ("waiting_for_approval", "cancelled")


async def test_handoff_switches_agent(store: Store) -> None:
    triage = ScriptedAgent("triage", [Handoff("billing")])
    billing = ScriptedAgent("billing", [Finish("billed")], offset=1)
    runner = runner_for(store, triage, billing)
    done = await runner.start("triage", "invoice?")
    assert done.state.agent == "billing"
    assert done.output == "billed"


async def test_delegation_records_level_and_metrics(store: Store) -> None:
    child = ScriptedAgent("child", [Finish("sub-result")])
    spender = ScriptedAgent(
        "parent", [Respond([Message.assistant("thinking")], call=ModelCall("m", cost=0.5))]
    )
    runner = runner_for(store, spender, child)
    parent = await runner.start(
        "parent", "go", headless=False, limits=Limits(iterations=IterationFlag(maximum=1))
    )
    result = await runner.delegate(parent.state, "child", "sub-task")
    assert result.state.delegate_level == 1
    assert result.state.delegation is not None
    assert result.state.delegation.parent_run_id == parent.run_id
    assert result.state.group_id == parent.run_id
    assert result.state.session_id != parent.state.session_id
    assert result.state.local_metrics.accumulated_cost == 0
