"""A run cancelled because its lanes were closed (``close(cancel=True)``) is stored as
cancelled, with the reason, wherever it is read: its checkpoint, the runs index (what
``runs list`` shows) and the subagent registry of a delegated run."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from statekeeper.runs import Coordination, Finish, Runner, StepInput
from statekeeper.runtime import CommandLanes, LanesClosedError
from statekeeper.stores import Store


class Blocking:
    """An agent whose first step waits until the test lets it go (never, here)."""

    name = "blocking"

    def __init__(self) -> None:
        self.in_step = asyncio.Event()
        self.release = asyncio.Event()

    async def step(self, run: StepInput) -> Any:
        self.in_step.set()
        await self.release.wait()
        return Finish("done")


async def test_closing_the_lanes_with_cancel_stores_the_run_cancelled(store: Store) -> None:
    lanes = CommandLanes()
    agent = Blocking()
    runner = Runner(store, "alice", [agent], coordination=Coordination(lanes=lanes))
    started = asyncio.create_task(runner.start("blocking", "go", run_id="run-c"))
    await agent.in_step.wait()

    await lanes.close(cancel=True)
    with pytest.raises(LanesClosedError):
        await started

    state = await runner.load("run-c")
    assert state.status == "cancelled"
    assert state.metadata["cancel_reason"] == "lane closed"
    index, _ = await runner.runs.index("run-c")
    assert index.status == "cancelled"
    assert index.owner is None  # the lease is released
    listed = await runner.runs.list(status="running")
    assert [i.run_id for i in listed] == []
    assert [i.run_id for i in await runner.runs.list(status="cancelled")] == ["run-c"]
    # A fresh runner (another process, say) loads it cancelled as well.
    again = await Runner(store, "alice", [Blocking()]).load("run-c")
    assert again.status == "cancelled"
    # Watchers were told why, and that it ended.
    kinds = [(e.stream, e.kind, e.payload.get("reason")) for e in await runner.runs.events("run-c")]
    assert ("lifecycle", "abort", "lane closed") in kinds
    assert kinds[-1][:2] == ("lifecycle", "end")


class Lanes(CommandLanes):
    """Command lanes that tell when a task was queued."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted = asyncio.Event()

    def submit(self, lane: str, fn: Any, **options: Any) -> Any:
        task = super().submit(lane, fn, **options)
        self.submitted.set()
        return task


@dataclass
class Queued:
    """A run blocked in its first step, and run ``run-q`` waiting in the lane behind it."""

    runner: Runner
    lanes: Lanes
    agent: Blocking
    session_id: str
    first: asyncio.Task[Any]
    queued: asyncio.Task[Any]


async def queue_behind(store: Store) -> Queued:
    """`Queued`: run ``run-q`` has reached its session's lane, behind a blocked run."""
    lanes = Lanes()
    agent = Blocking()
    runner = Runner(store, "alice", [agent], coordination=Coordination(lanes=lanes))
    session = await runner.sessions.create()
    first = asyncio.create_task(runner.start("blocking", "go", session_id=session.id))
    await agent.in_step.wait()
    lanes.submitted.clear()
    queued = asyncio.create_task(
        runner.start("blocking", "later", session_id=session.id, run_id="run-q")
    )
    await lanes.submitted.wait()
    return Queued(runner, lanes, agent, session.id, first, queued)


async def test_a_queued_run_dropped_at_close_is_paused_not_running(store: Store) -> None:
    made = await queue_behind(store)
    lanes, runner, first, queued = made.lanes, made.runner, made.first, made.queued

    await lanes.close(cancel=True)
    for task in (first, queued):
        with pytest.raises(LanesClosedError):
            await task

    index, _ = await runner.runs.index("run-q")
    assert index.status == "paused"  # never started: resumable, as after `clear`
    assert [i.run_id for i in await runner.runs.list(status="running")] == []


async def test_a_delegated_run_cancelled_by_close_is_settled_in_the_registry(
    store: Store,
) -> None:
    lanes = CommandLanes()
    child = Blocking()
    delegated: list[str] = []

    class Parent:
        name = "parent"

        async def step(self, run: StepInput) -> Any:
            result = await runner.delegate(run.state, "blocking", "sub task")
            delegated.append(result.run_id)
            return Finish("never")

    runner = Runner(store, "alice", [Parent(), child], coordination=Coordination(lanes=lanes))
    parent = asyncio.create_task(runner.start("parent", "go", run_id="run-p"))
    await child.in_step.wait()

    await lanes.close(cancel=True)
    with pytest.raises(LanesClosedError):
        await parent

    assert (await runner.load("run-p")).status == "cancelled"
    registry = runner.coordination.subagents
    assert registry is not None
    [entry] = await registry.list()
    assert entry.status == "failed"
    assert entry.outcome == "cancelled: lane closed"
    child_state = await runner.load(entry.run_id)
    assert child_state.status == "cancelled"
    assert child_state.metadata["cancel_reason"] == "lane closed"
    assert delegated == []
