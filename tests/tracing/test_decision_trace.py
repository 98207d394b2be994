"""An approval made outside a drive (another process: a runner with no agents, the CLI)
is one ``statekeeper.approval`` span in the run's trace, its store operations children
of it; it made a root trace per store operation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_spans import named, only, records, under

from asgi_client import served
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.errors import NotFoundError
from statekeeper.runs import Finish, Respond, Runner, Tool, ToolContext
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.server import ApiKeys
from statekeeper.stores import Store, open_store


async def wire(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"sent {args['amount']}"


def payer() -> ScriptedAgent:
    call = ToolCallBlock(id="pay", name="wire", arguments=json.dumps({"amount": 9}))
    return ScriptedAgent(
        "payer", [Respond([Message.assistant("paying", tool_calls=[call])]), Finish("paid")]
    )


@pytest.fixture
async def sqlite(tmp_path: Path) -> Any:
    async with await open_store(f"sqlite:///{tmp_path}/runs.db") as store:
        yield store


async def waiting_run(store: Store) -> tuple[str, str, str]:
    """A run stopped on its ``pay`` call: its id, trace id and the holding step's span id."""
    runner = Runner(store, "t", [payer()], [Tool("wire", wire, requires_approval=True)])
    result = await runner.start("payer", "pay", run_id="run-pay")
    assert result.status == "waiting_for_approval"
    trace = result.state.trace
    assert trace.current_span is not None
    return result.run_id, trace.trace_id, trace.current_span


async def test_an_approval_is_one_span_in_the_runs_trace(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    run_id, trace_id, step_id = await waiting_run(sqlite)
    exporter.clear()

    elsewhere = Runner(sqlite, "t", [])  # as in another process: no agents, no drive
    await elsewhere.approve(run_id, "pay", by="alice")

    spans = records(exporter)
    assert {s["trace_id"] for s in spans} == {trace_id}  # one trace: the run's
    approval = only(spans, "statekeeper.approval")
    assert approval["parent"] == step_id  # under the step that held the call
    assert approval["attributes"]["statekeeper.run.id"] == run_id
    assert approval["attributes"]["gen_ai.tool.call.id"] == "pay"
    assert approval["attributes"]["statekeeper.approval.approved"] is True
    assert approval["attributes"]["statekeeper.approval.decided_by"] == "alice"
    store_ops = [s for s in spans if s is not approval]
    assert store_ops == under(spans, approval)  # every store operation is its child
    operations = {s["attributes"]["db.operation.name"] for s in store_ops}
    assert {"get_record", "append_entries"} <= operations
    assert all(approval["start"] <= s["start"] <= s["end"] <= approval["end"] for s in store_ops)


async def test_a_refused_approval_is_one_failed_span(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    run_id, trace_id, _ = await waiting_run(sqlite)
    exporter.clear()

    with pytest.raises(NotFoundError):
        await Runner(sqlite, "t", []).approve(run_id, "no-such-call", by="alice")

    spans = records(exporter)
    assert {s["trace_id"] for s in spans} == {trace_id}
    approval = only(spans, "statekeeper.approval")
    assert approval["status"] == "ERROR"
    assert approval["attributes"]["error.type"] == "NotFoundError"
    assert [s for s in spans if s is not approval] == under(spans, approval)
    assert named(spans, "statekeeper.store append_entries") == []  # nothing was saved


async def test_an_approval_of_an_unknown_run_is_still_one_trace(
    exporter: InMemorySpanExporter, sqlite: Store
) -> None:
    with pytest.raises(NotFoundError):
        await Runner(sqlite, "t", []).approve("run-nope", "pay")

    spans = records(exporter)
    approval = only(spans, "statekeeper.approval")
    assert approval["parent"] is None
    assert {s["trace_id"] for s in spans} == {approval["trace_id"]}
    assert [s for s in spans if s is not approval] == under(spans, approval)


async def test_an_approval_through_the_server_is_a_span_in_the_runs_trace(
    exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    async with await open_store(url) as store:
        run_id, trace_id, step_id = await waiting_run(store)
        _, key = await ApiKeys(store).create("t", "operate", label="ops")
    exporter.clear()
    async with served(url, key) as client:
        answer = await client.post(f"/api/v1/runs/{run_id}/approve", json={"call_id": "pay"})
    assert answer.status_code == 200, answer.text

    spans = records(exporter)
    approval = only(spans, "statekeeper.approval")
    assert (approval["trace_id"], approval["parent"]) == (trace_id, step_id)
    saved = named(spans, "statekeeper.store append_entries")
    assert saved
    assert all(s in under(spans, approval) for s in saved)
