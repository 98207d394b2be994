"""The spans of runs in one process, with the SDK's in-memory exporter: delegated
children, model calls (gen_ai conventions), tool calls, store operations, W3C trace
context in and out, and nothing at all when no tracer provider is configured."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_spans import only, records, under

from statekeeper import tracing
from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.core.metrics import TokenUsage
from statekeeper.errors import InvalidInputError
from statekeeper.runs import (
    Action,
    Finish,
    ModelCall,
    Respond,
    Runner,
    StepInput,
    Tool,
    ToolContext,
)
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import SessionQuery

USAGE = TokenUsage(input_tokens=1200, output_tokens=80, cache_read_tokens=1000)


@pytest.fixture
async def sqlite(tmp_path: Path) -> Any:
    async with await open_store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        yield store


def call(tool: str, call_id: str, **arguments: Any) -> Respond:
    block = ToolCallBlock(id=call_id, name=tool, arguments=json.dumps(arguments))
    return Respond([Message.assistant(f"calling {tool}", tool_calls=[block])])


class Delegating:
    """Delegates its first step to ``helper`` (from the step itself), then finishes."""

    name = "parent"

    def __init__(self) -> None:
        self.runner: Runner | None = None

    async def step(self, run: StepInput) -> Action:
        assert self.runner is not None
        if run.state.turn == 1:
            child = await self.runner.delegate(run.state, "helper", "sub-task")
            return Respond([Message.assistant(f"the child said {child.output}")])
        return Finish("done")


async def test_a_child_delegated_in_a_step_is_a_child_of_that_step(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    parent_agent = Delegating()
    runner = Runner(sqlite, "t", [parent_agent, ScriptedAgent("helper", [Finish("ok")])])
    parent_agent.runner = runner
    result = await runner.start("parent", "go")
    spans = records(exporter)

    parent_run = only(spans, "invoke_agent parent")
    child_run = only(spans, "invoke_agent helper")
    first_step = next(s for s in under(spans, parent_run) if s["name"] == "statekeeper.step")
    assert first_step["attributes"]["statekeeper.turn"] == 1
    assert (child_run["trace_id"], child_run["parent"]) == (
        parent_run["trace_id"],
        first_step["span_id"],
    )
    assert child_run["attributes"]["statekeeper.run.delegate_level"] == 1
    assert [s["name"] for s in under(spans, child_run)].count("statekeeper.step") == 1
    child = await runner.load(child_run["attributes"]["statekeeper.run.id"])
    assert child.trace.trace_id == parent_run["trace_id"] == result.state.trace.trace_id


async def test_a_child_delegated_by_a_tool_is_under_the_tool_call(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    holder: list[Runner] = []

    async def research(args: dict[str, Any], ctx: ToolContext) -> str:
        child = await holder[0].delegate(ctx.run, "helper", args["topic"])
        return str(child.output)

    parent = ScriptedAgent("parent", [call("research", "c1", topic="otel"), Finish("done")])
    helper = ScriptedAgent("helper", [Finish("found")])
    runner = Runner(sqlite, "t", [parent, helper], [Tool("research", research)])
    holder.append(runner)
    await runner.start("parent", "go")
    spans = records(exporter)

    step = only(spans, "statekeeper.step", **{"gen_ai.agent.name": "parent", "statekeeper.turn": 1})
    tool = only(spans, "execute_tool research")
    child_run = only(spans, "invoke_agent helper")
    assert tool["parent"] == step["span_id"]
    assert child_run["parent"] == tool["span_id"]


async def test_a_child_delegated_between_drives_is_under_the_parents_last_step(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    parent = ScriptedAgent("parent", [Respond([Message.assistant("plan")])])
    runner = Runner(sqlite, "t", [parent, ScriptedAgent("helper", [Finish("ok")])])
    paused = await runner.start(
        "parent", "go", headless=False, limits=Limits(iterations=IterationFlag(maximum=1))
    )
    exporter.clear()
    await runner.delegate(paused.state, "helper", "later")  # no span is current here
    child_run = only(records(exporter), "invoke_agent helper")
    assert child_run["trace_id"] == paused.state.trace.trace_id
    assert child_run["parent"] == paused.state.trace.current_span


async def test_a_model_call_follows_the_gen_ai_conventions(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    model = ModelCall("gpt-4o", USAGE, cost=0.0042, latency=1.5)
    runner = Runner(sqlite, "t", [ScriptedAgent("a", [Finish("ok", call=model)])])
    await runner.start("a", "hi")
    spans = records(exporter)

    chat = only(spans, "chat gpt-4o")
    assert chat["parent"] == only(spans, "statekeeper.step")["span_id"]
    assert chat["kind"] == "CLIENT"
    assert chat["attributes"] == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.agent.name": "a",
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 80,
        "gen_ai.usage.cache_read.input_tokens": 1000,
        "statekeeper.usage.cost": 0.0042,
    }
    assert chat["end"] - chat["start"] == pytest.approx(1.5e9, rel=1e-6)
    run = only(spans, "invoke_agent a")
    assert run["attributes"]["gen_ai.conversation.id"]
    assert run["attributes"]["statekeeper.run.status"] == "completed"


async def test_tool_calls_are_spans_and_a_failed_one_says_why(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    async def boom(args: dict[str, Any], ctx: ToolContext) -> str:
        raise RuntimeError("disk on fire")

    async def echo(args: dict[str, Any], ctx: ToolContext) -> str:
        return "echoed"

    agent = ScriptedAgent("a", [call("echo", "c1"), call("boom", "c2"), Finish("ok")])
    runner = Runner(sqlite, "t", [agent], [Tool("echo", echo), Tool("boom", boom)])
    await runner.start("a", "hi")
    spans = records(exporter)

    ok = only(spans, "execute_tool echo")
    assert ok["status"] == "UNSET"
    assert ok["attributes"] == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "echo",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
    }
    bad = only(spans, "execute_tool boom")
    assert bad["status"] == "ERROR"
    assert bad["attributes"]["error.type"] == "RuntimeError"
    assert "disk on fire" in bad["description"]


async def test_a_failed_run_marks_its_span(exporter: InMemorySpanExporter, sqlite: Store) -> None:
    def fail(run: StepInput) -> Action:
        raise ValueError("the agent broke")

    runner = Runner(sqlite, "t", [ScriptedAgent("a", [fail])])
    with pytest.raises(ValueError, match="the agent broke"):
        await runner.start("a", "hi")
    run = only(records(exporter), "invoke_agent a")
    assert run["status"] == "ERROR"
    assert run["attributes"]["error.type"] == "ValueError"
    assert run["attributes"]["statekeeper.run.status"] == "error"


async def test_traced_store_operations_name_the_backend(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    store = tracing.traced(sqlite)
    assert tracing.traced(store) is store  # never wrapped twice
    assert isinstance(store, Store)
    assert store.url == sqlite.url  # not an operation: passed through, no span
    runner = Runner(store, "t", [ScriptedAgent("a", [Finish("ok")])])
    assert runner.store is store
    await store.list_sessions("t", SessionQuery())
    span = only(records(exporter), "statekeeper.store list_sessions")
    assert span["attributes"] == {"db.system.name": "sqlite", "db.operation.name": "list_sessions"}
    assert span["parent"] is None


async def test_trace_context_in_and_out(exporter: InMemorySpanExporter, sqlite: Store) -> None:
    header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    runner = Runner(sqlite, "t", [ScriptedAgent("a", [Finish("ok")])])
    # A server: accept the request's traceparent (any header case) and answer with ours.
    with tracing.continued({"Traceparent": header}) as context:
        assert context is not None
        assert tracing.traceparent() == header
        result = await runner.start("a", "hi")
        assert tracing.inject() == {"traceparent": header}
    run = only(records(exporter), "invoke_agent a")
    assert (run["trace_id"], run["parent"]) == (header[3:35], header[36:52])
    assert result.state.trace.trace_id == header[3:35]
    # No or bad headers: nothing changes, nothing is injected.
    for carrier in ({}, {"traceparent": "00-zz-bad-01"}, None):
        with tracing.continued(carrier) as context:
            assert context is None
            assert tracing.inject() == {}
            assert tracing.traceparent() is None
    assert tracing.extract({"traceparent": "garbage"}) is None


@pytest.mark.parametrize(
    "call",
    [
        lambda: tracing.extract(None),  # type: ignore[arg-type]
        lambda: tracing.extract("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),  # type: ignore[arg-type]
        lambda: tracing.extract([("traceparent", "x")]),  # type: ignore[arg-type]
        lambda: tracing.inject("headers"),  # type: ignore[arg-type]
        lambda: tracing.inject(types.MappingProxyType({})),  # type: ignore[arg-type]
        lambda: tracing.continued("traceparent").__enter__(),  # type: ignore[arg-type]
        lambda: tracing.set_enabled("no"),  # type: ignore[arg-type]
    ],
)
def test_bad_carriers_and_flags_are_typed_errors(exporter: InMemorySpanExporter, call: Any) -> None:
    with pytest.raises(InvalidInputError):
        call()
    assert tracing.get_tracer() is not None  # set_enabled("no") left tracing as it was


async def test_set_enabled_false_makes_no_span(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    tracing.set_enabled(False)
    try:
        assert tracing.get_tracer() is None
        runner = Runner(sqlite, "t", [ScriptedAgent("a", [Finish("ok")])])
        result = await runner.start("a", "hi")
    finally:
        tracing.set_enabled(True)
    assert exporter.get_finished_spans() == ()
    assert result.state.trace.traceparent is None
    assert tracing.get_tracer() is not None


async def test_without_a_provider_there_is_no_span_and_no_cost(sqlite: Store) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert tracing.get_tracer() is None
    runner = Runner(sqlite, "t", [ScriptedAgent("a", [Finish("ok")])])
    assert runner.store is sqlite  # not wrapped
    result = await runner.start("a", "hi")
    assert result.state.trace.traceparent is None
    assert result.state.trace.trace_id.startswith("trace_")
    events = await sqlite.read_events("t", result.run_id)
    assert events
    assert all("span_id" not in e.payload for e in events)
    assert all(e.payload["trace_id"] == result.state.trace.trace_id for e in events)


async def test_a_run_moved_to_another_store_continues_its_trace(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    agent = ScriptedAgent("a", [call("wire", "pay"), Finish("paid")])

    async def wire(args: dict[str, Any], ctx: ToolContext) -> str:
        return "sent"

    tools = [Tool("wire", wire, requires_approval=True)]
    paused = await Runner(sqlite, "t", [agent], tools).start("a", "go")
    snapshot = await Runner(sqlite, "t", [agent], tools).runs.export(paused.run_id)
    async with await open_store("memory://") as elsewhere:
        runner = Runner(elsewhere, "t", [agent], tools)
        await runner.runs.import_(snapshot)
        await runner.approve(paused.run_id, "pay")
        done = await runner.resume(paused.run_id)
    assert done.status == "completed"
    first, resumed = [s for s in records(exporter) if s["name"] == "invoke_agent a"]
    assert (resumed["trace_id"], resumed["parent"]) == (first["trace_id"], first["span_id"])
    assert done.state.trace.traceparent == paused.state.trace.traceparent
