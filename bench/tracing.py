"""What tracing costs a runner step: off, the OpenTelemetry API without an SDK, the SDK.

Three sides, interleaved batch by batch (the order rotates every batch), each batch one
run of ``STEPS`` steps of the same scripted agent: every step reports a model call and
calls one tool, so a traced step makes a step span, a model-call span, a tool span and
the store operations' spans. Per step: the run's wall time / ``STEPS``.

- off: `statekeeper.tracing.set_enabled(False)`: the code path of a process without
  the ``otel`` extra (no tracer, no span, no store wrapper, no span id in events);
- api: tracing on, opentelemetry-api present, no provider configured (the API's proxy):
  what most installs that do not use tracing pay;
- sdk: the SDK's ``TracerProvider`` with a ``SimpleSpanProcessor`` into an
  ``InMemorySpanExporter`` (cleared after each batch): the cost of recording spans.

On memory (the runner's own work, where tracing weighs most) and on SQLite with
durability ``process`` (no fsync, so the runner's work still dominates). The API's global
provider can be set once per process; between sides the bench resets it the way
opentelemetry-test-utils does (private API, acceptable in a benchmark).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from bench.common import Verdicts, spread
from statekeeper import tracing
from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.core.metrics import TokenUsage
from statekeeper.runs import ModelCall, Respond, Runner, StepInput, Tool, ToolContext
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import open_store

STEPS = 50
BATCHES = 40
SIDES = ("off", "api", "sdk")
OFF_TARGET = 1.05  # api (no SDK) / off: within noise
CALL = ModelCall("gpt-bench", TokenUsage(input_tokens=900, output_tokens=40), 0.001, 0.2)


def _act(run: StepInput) -> Respond:
    block = ToolCallBlock(id=f"c{run.state.turn}", name="echo", arguments='{"n": 1}')
    return Respond([Message.assistant("checking", tool_calls=[block])], call=CALL)


async def _echo(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


def _reset_provider() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


def _use(side: str, provider: TracerProvider) -> None:
    tracing.set_enabled(side != "off")
    _reset_provider()
    if side == "sdk":
        trace.set_tracer_provider(provider)


async def _one_run(url: str) -> float:
    """Seconds per step of one run of ``STEPS`` steps (a runner made for the side)."""
    async with await open_store(url) as store:
        runner = Runner(store, "bench", [ScriptedAgent("a", [_act])], [Tool("echo", _echo)])
        limits = Limits(iterations=IterationFlag(maximum=STEPS))
        started = time.perf_counter()
        await runner.start("a", "go", headless=False, limits=limits)
        return (time.perf_counter() - started) / STEPS


async def measure(url: str) -> dict[str, list[float]]:
    """Per-step seconds of each side, batch by batch (one warm-up batch first)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    try:
        for batch in range(-1, BATCHES):
            order = SIDES[batch % 3 :] + SIDES[: batch % 3]
            for side in order:
                _use(side, provider)
                took = await _one_run(url)
                memory.clear()
                if batch >= 0:
                    times[side].append(took)
    finally:
        tracing.set_enabled(True)
        _reset_provider()
        provider.shutdown()
    return times


async def run() -> dict[str, Any]:
    """Both stores."""
    with tempfile.TemporaryDirectory(prefix="statekeeper-bench-tracing-") as folder:
        sqlite = f"sqlite:///{Path(folder) / 'runs.db'}?durability=process"
        return {"memory": await measure("memory://"), "sqlite": await measure(sqlite)}


def report(results: dict[str, Any]) -> list[str]:
    """Per-step times and ratios to off; the target: api without an SDK within noise."""
    verdicts = Verdicts()
    for store, times in results.items():
        print(f"{store}: per step, us (median [min-max] over {BATCHES} runs of {STEPS} steps)")
        for side in SIDES:
            print(f"  {side:<4} {spread([t * 1e6 for t in times[side]])}")
        for side in ("api", "sdk"):
            ratios = [t / o for t, o in zip(times[side], times["off"], strict=True)]
            if side == "api":
                verdicts.at_most(f"{store}: {side} / off (per batch)", ratios, OFF_TARGET)
            else:
                verdicts.info(f"{store}: {side} / off (per batch)", ratios)
    return verdicts.missed
