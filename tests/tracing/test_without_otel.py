"""Tracing costs nothing when it is not there: ``import statekeeper`` imports no
opentelemetry, and without opentelemetry installed (hidden from a real subprocess) runs
work, with statekeeper's own trace ids and no spans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).parents[2] / "src"

HIDE_OTEL = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None
sys.meta_path.insert(0, Hide())
"""

RUN = """
import asyncio, json, sys
from statekeeper import tracing
from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.runs import Finish, Respond, Runner, Tool
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import open_store

async def wire(args, ctx):
    return "sent"

async def main(url):
    block = ToolCallBlock(id="pay", name="wire", arguments="{}")
    agent = ScriptedAgent("a", [Respond([Message.assistant("paying", tool_calls=[block])]),
                                Finish("paid")])
    async with await open_store(url) as store:
        runner = Runner(store, "t", [agent], [Tool("wire", wire, requires_approval=True)])
        with tracing.continued({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}):
            paused = await runner.start("a", "go")
            await runner.approve(paused.run_id, "pay")
            done = await runner.resume(paused.run_id)
            injected = dict(tracing.inject())
        events = await store.read_events("t", done.run_id)
    print(json.dumps({
        "status": done.status,
        "trace_id": done.state.trace.trace_id,
        "traceparent": done.state.trace.traceparent,
        "event_traces": sorted({e.payload["trace_id"] for e in events}),
        "span_ids": sum("span_id" in e.payload for e in events),
        "tracer": tracing.get_tracer() is not None,
        "injected": injected,
        "wrapped": runner.store is not store,
    }))
"""


def python(code: str, *args: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_statekeeper_imports_no_opentelemetry() -> None:
    code = (
        "import sys, statekeeper, statekeeper.runs, statekeeper.runtime, statekeeper.tracing\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    assert python(code) == "[]"


def test_runs_work_without_opentelemetry_installed(tmp_path: Path) -> None:
    probe = "try:\n import opentelemetry\nexcept ImportError:\n print('hidden')"
    assert python(HIDE_OTEL + probe) == "hidden"
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    out = json.loads(python(HIDE_OTEL + RUN + "\nasyncio.run(main(sys.argv[1]))", url))
    assert out["status"] == "completed"
    assert out["trace_id"].startswith("trace_")
    assert out["event_traces"] == [out["trace_id"]]
    assert (out["traceparent"], out["span_ids"], out["tracer"]) == (None, 0, False)
    assert (out["injected"], out["wrapped"]) == ({}, False)
