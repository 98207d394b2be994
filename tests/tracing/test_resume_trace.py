"""A run with an approval, paused in one process and resumed in another, is one trace.

Real subprocesses (``otel_app.py``) on a real SQLite file, each with the SDK and an
in-memory exporter whose spans it writes to a JSON file; the test asserts the span tree
of both processes, parent by parent, against the run state and the run's events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from otel_spans import named, only, under

from statekeeper.runs import Runner
from statekeeper.stores import open_store

HERE = Path(__file__).parent
SRC = Path(__file__).parents[2] / "src"
REQUEST = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
"""The traceparent header of the request that resumes the run (another trace)."""


def run_app(db: Path, command: str, out: Path, *parent: str) -> str:
    path = os.pathsep.join([str(HERE), str(SRC), os.environ.get("PYTHONPATH", "")])
    app = [sys.executable, str(HERE / "otel_app.py")]
    done = subprocess.run(
        [*app, f"sqlite:///{db}", command, "run-pay", str(out), *parent],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def spans_of(path: Path) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return spans


@pytest.mark.slow
async def test_a_run_resumed_in_another_process_continues_its_trace(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    assert run_app(db, "start", tmp_path / "first.json") == "waiting_for_approval"
    async with await open_store(f"sqlite:///{db}") as store:  # no tracing in this process
        runner = Runner(store, "t", [])
        await runner.approve("run-pay", "pay", by="alice")
        paused = await runner.load("run-pay")
    assert run_app(db, "resume", tmp_path / "second.json", REQUEST) == "completed"
    first, second = spans_of(tmp_path / "first.json"), spans_of(tmp_path / "second.json")

    # First process: handler > run > step > model call; the tool call is held, not run.
    handler = only(first, "handle start")
    run = only(first, "invoke_agent payer")
    assert run["parent"] == handler["span_id"]
    trace_id = run["trace_id"]
    assert run["attributes"]["statekeeper.run.resumed"] is False
    assert run["attributes"]["statekeeper.run.status"] == "waiting_for_approval"
    assert run["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    step = only(first, "statekeeper.step")
    assert step["parent"] == run["span_id"]
    assert step["attributes"]["statekeeper.turn"] == 1
    chat = only(first, "chat gpt-test")
    assert chat["parent"] == step["span_id"]
    assert named(first, "execute_tool wire") == []
    # The store operations of the step are its children; every span is in the trace.
    assert any(s["name"] == "statekeeper.store append_entries" for s in under(first, step))
    assert {s["trace_id"] for s in first} == {trace_id}

    # The checkpoint keeps the W3C context: the run span and the step that held the call.
    assert paused.trace.trace_id == trace_id
    assert paused.trace.traceparent is not None
    assert paused.trace.traceparent[:52] == f"00-{trace_id}-{run['span_id']}"
    assert paused.trace.current_span == step["span_id"]

    # Second process, in another trace (the request's): the resumed drive is a child of
    # the stored run span, linked to the request's handler span.
    handler2 = only(second, "handle resume")
    assert (handler2["trace_id"], handler2["parent"]) == (REQUEST[3:35], REQUEST[36:52])
    resumed = only(second, "invoke_agent payer")
    assert (resumed["trace_id"], resumed["parent"]) == (trace_id, run["span_id"])
    assert resumed["links"] == [{"trace_id": handler2["trace_id"], "span_id": handler2["span_id"]}]
    assert resumed["attributes"]["statekeeper.run.resumed"] is True
    assert resumed["attributes"]["statekeeper.run.status"] == "completed"
    # The wait: under the step that held the call, from the hold to the decision.
    wait = only(second, "statekeeper.approval_wait")
    assert (wait["trace_id"], wait["parent"]) == (trace_id, step["span_id"])
    assert wait["attributes"]["gen_ai.tool.call.id"] == "pay"
    assert wait["attributes"]["statekeeper.approval.approved"] is True
    assert wait["attributes"]["statekeeper.approval.decided_by"] == "alice"
    decision = paused.decisions[0].decided_at.timestamp()
    assert wait["start"] == pytest.approx(paused.interruptions[0].requested_at.timestamp() * 1e9)
    assert wait["end"] == pytest.approx(decision * 1e9)
    # The released call runs in the resumed drive, then the next step finishes the run.
    tool = only(second, "execute_tool wire")
    assert tool["parent"] == resumed["span_id"]
    assert tool["attributes"]["gen_ai.tool.call.id"] == "pay"
    step2 = only(second, "statekeeper.step")
    assert (step2["parent"], step2["attributes"]["statekeeper.turn"]) == (resumed["span_id"], 2)
    assert only(second, "chat gpt-test")["parent"] == step2["span_id"]
    # Only the load that finds the stored trace happens in the request's trace.
    outside = [s for s in second if s["trace_id"] != trace_id and s is not handler2]
    assert outside
    assert all(s["name"].startswith("statekeeper.store ") for s in outside)
    assert all(s["parent"] == handler2["span_id"] for s in outside)

    # The run's events carry the trace and the span each happened in.
    async with await open_store(f"sqlite:///{db}") as store:
        events = await store.read_events("t", "run-pay")
    assert {e.payload["trace_id"] for e in events} == {trace_id}
    result = next(e for e in events if (e.stream, e.kind) == ("tool", "result"))
    assert result.payload["span_id"] == tool["span_id"]
    started = next(e for e in events if (e.stream, e.kind) == ("lifecycle", "start"))
    assert started.payload["span_id"] == run["span_id"]
    said = [e for e in events if (e.stream, e.kind) == ("assistant", "complete")]
    assert [e.payload["span_id"] for e in said] == [step["span_id"], step2["span_id"]]
