"""An agent app with OpenTelemetry configured, run as a subprocess by the tracing tests.

    python otel_app.py SQLITE_URL start|resume RUN_ID SPANS_JSON [TRACEPARENT]

It configures the SDK with an in-memory exporter (as an application would), handles
one "request" in a span of its own (continuing TRACEPARENT when given, as a server
would with the request's header), starts or resumes the run inside it, and writes every
finished span as JSON to SPANS_JSON before exiting. It prints the run's status.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_spans import span_record

from statekeeper import tracing
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.core.metrics import TokenUsage
from statekeeper.runs import Finish, ModelCall, Respond, Runner, Tool, ToolContext
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store, open_store

ASK = ModelCall("gpt-test", TokenUsage(input_tokens=120, output_tokens=30), 0.002, 0.25)
DONE = ModelCall("gpt-test", TokenUsage(input_tokens=200, output_tokens=10), 0.003, 0.1)


async def wire(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"sent {args['amount']}"


def make_runner(store: Store) -> Runner:
    call = ToolCallBlock(id="pay", name="wire", arguments='{"amount": 9}')
    payer = ScriptedAgent(
        "payer",
        [
            Respond([Message.assistant("paying", tool_calls=[call])], call=ASK),
            Finish("paid", call=DONE),
        ],
    )
    return Runner(store, "t", [payer], [Tool("wire", wire, requires_approval=True)])


async def main(url: str, command: str, run_id: str, parent: str = "") -> list[dict[str, Any]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    app = trace.get_tracer("otel_app")
    store = await open_store(url)
    try:
        runner = make_runner(store)
        with (
            tracing.continued({"traceparent": parent} if parent else None),
            app.start_as_current_span(f"handle {command}"),
        ):
            if command == "start":
                result = await runner.start("payer", "pay", run_id=run_id)
            else:
                result = await runner.resume(run_id)
        print(result.status, flush=True)
    finally:
        await store.close()
        provider.shutdown()
    return [span_record(s) for s in memory.get_finished_spans()]


if __name__ == "__main__":
    url, command, run_id, out, *parent = sys.argv[1:]
    spans = asyncio.run(main(url, command, run_id, *parent))
    Path(out).write_text(json.dumps(spans), encoding="utf-8")
