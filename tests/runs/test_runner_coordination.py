"""The runner with command lanes, follow-up steering and the event bus."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from statekeeper.core.messages import Message
from statekeeper.runs import Coordination, Finish, Respond, Runner, StepInput
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.runtime import CommandLanes, EventBus, FollowupQueue
from statekeeper.stores import Store


async def test_steering_reaches_the_next_step(store: Store) -> None:
    in_step, release = asyncio.Event(), asyncio.Event()
    seen: list[list[str]] = []

    async def never_started(session_id: str, message: Message) -> Any:
        raise AssertionError("a steer during a run must not start a new run")

    class Waiting:
        name = "a"

        async def step(self, run: StepInput) -> Any:
            seen.append([m.text for m in run.new_input])
            if run.state.turn == 1:
                in_step.set()
                await release.wait()
                return Respond([Message.assistant("working")])
            return Finish("done")

    followups = FollowupQueue(never_started, mode="steer")
    runner = Runner(
        store,
        "alice",
        [Waiting()],
        coordination=Coordination(followups=followups, lanes=CommandLanes()),
    )
    task = asyncio.create_task(runner.start("a", "first"))
    await in_step.wait()
    session_id = next(iter(followups.sessions()))
    outcome = await followups.submit(session_id, Message.user("also this"))
    assert outcome.status.name == "STEERED"
    release.set()
    result = await task
    assert result.status == "completed"
    assert seen == [["first"], ["also this"]]


async def test_runs_of_one_session_never_overlap(store: Store) -> None:
    lanes = CommandLanes()
    active = 0
    most = 0

    class Counting:
        name = "a"

        async def step(self, run: StepInput) -> Any:
            nonlocal active, most
            active += 1
            most = max(most, active)
            await asyncio.sleep(0)
            active -= 1
            return Finish("ok")

    runner = Runner(store, "alice", [Counting()], coordination=Coordination(lanes=lanes))
    first = await runner.start("a", "hi")
    session = first.state.session_id
    results = await asyncio.gather(
        *(runner.start("a", f"m{i}", session_id=session) for i in range(5))
    )
    assert all(r.status == "completed" for r in results)
    assert most == 1
    await lanes.close()


async def test_runner_events_reach_a_bus_subscriber(store: Store) -> None:
    bus = EventBus(store, "alice")
    runner = Runner(
        store, "alice", [ScriptedAgent("a", [Finish("ok")])], coordination=Coordination(events=bus)
    )
    result = await runner.start("a", "hi")
    events = [e async for e in _drain(bus, result.run_id)]
    kinds = [(e.stream, e.kind) for e in events]
    assert kinds[0] == ("lifecycle", "start")
    assert ("lifecycle", "end") in kinds
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def _drain(bus: EventBus, run_id: str) -> Any:
    sub = bus.subscribe(run_id, from_seq=0)
    try:
        while True:
            try:
                event = await asyncio.wait_for(sub.__anext__(), timeout=1.0)
            except TimeoutError:
                return
            yield event
            if event.stream == "lifecycle" and event.kind == "end":
                return
    finally:
        sub.close()


async def test_a_message_appended_by_another_process_steers_the_run(store: Store) -> None:
    from statekeeper.sessions import SessionManager

    in_step, release = asyncio.Event(), asyncio.Event()
    seen: list[list[str]] = []

    class Waiting:
        name = "a"

        async def step(self, run: StepInput) -> Any:
            seen.append([m.text for m in run.new_input])
            if run.state.turn == 1:
                in_step.set()
                await release.wait()
                return Respond([Message.assistant("working")])
            return Finish("done")

    runner = Runner(store, "alice", [Waiting()])
    task = asyncio.create_task(runner.start("a", "first"))
    await in_step.wait()
    state_sessions = await SessionManager(store, "alice").list()
    chat = await SessionManager(store, "alice").get(state_sessions.items[0].id)
    await chat.append(Message.user("from elsewhere"), strict=False)  # as another process would
    release.set()
    result = await task
    assert seen == [["first"], ["from elsewhere"]]
    texts = [m.text for m in await chat.messages()]
    assert texts == ["first", "from elsewhere", "working"]
    assert result.status == "completed"


async def test_delegated_runs_are_registered_and_settled(store: Store) -> None:
    from statekeeper.runs import AskInput
    from statekeeper.runtime import SubagentRegistry

    parent_agent = ScriptedAgent("parent", [Finish("p")])
    quick = ScriptedAgent("quick", [Finish("child done")])
    slow = ScriptedAgent("slow", [AskInput("details?"), Finish("x")])
    runner: Runner
    registry = SubagentRegistry(
        store, "alice", owner_id="test", kill=lambda run_id: runner.cancel(run_id)
    )
    runner = Runner(
        store,
        "alice",
        [parent_agent, quick, slow],
        coordination=Coordination(subagents=registry),
    )
    parent = await runner.start("parent", "go")

    done = await runner.delegate(parent.state, "quick", "sum it up")
    entry = await registry.get(done.run_id)
    assert entry.status == "completed"
    assert entry.outcome == "child done"
    assert entry.requester_session_id == parent.state.session_id
    assert entry.task == "sum it up"

    waiting = await runner.delegate(parent.state, "slow", "look deeper")
    entry = await registry.get(waiting.run_id)
    assert (entry.status, entry.outcome) == ("paused", "waiting for input")
    killed = await registry.kill(waiting.run_id)
    assert killed.status == "killed"
    assert (await runner.load(waiting.run_id)).status == "cancelled"


async def test_a_cross_process_session_lock_serialises_runners() -> None:
    import os
    import socket
    import uuid

    from statekeeper.stores import open_store
    from statekeeper.stores.redis.coordination import RedisLeases

    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1.0).close()
    except OSError:
        if os.environ.get("CI") == "true":
            raise
        import pytest

        pytest.skip("no Redis server at 127.0.0.1:6379")
    prefix = f"sk-lock-{uuid.uuid4().hex[:10]}"
    url = f"redis://127.0.0.1:6379/0?prefix={prefix}"
    first_store, second_store = await open_store(url), await open_store(url)
    active = most = 0

    class Counting:
        name = "a"

        async def step(self, run: StepInput) -> Any:
            nonlocal active, most
            active += 1
            most = max(most, active)
            for _ in range(3):
                await asyncio.sleep(0)  # give the other runner every chance to overlap
            active -= 1
            return Finish("ok")

    try:
        runners = [
            Runner(
                s,
                "alice",
                [Counting()],
                coordination=Coordination(session_locks=RedisLeases(s)),  # type: ignore[arg-type]
            )
            for s in (first_store, second_store)
        ]
        seed = await runners[0].start("a", "hi")
        session_id = seed.state.session_id
        results = await asyncio.gather(
            *(runners[i % 2].start("a", f"m{i}", session_id=session_id) for i in range(6))
        )
        assert all(r.status == "completed" for r in results)
        assert most == 1
    finally:
        await first_store.close()
        await second_store.close()


async def test_a_headless_child_paused_at_a_limit_shows_paused_then_running(
    store: Store,
) -> None:
    from statekeeper.core.limits import BudgetFlag, Limits
    from statekeeper.errors import LimitReachedError
    from statekeeper.runs import AskInput, ModelCall
    from statekeeper.runtime import SubagentRegistry

    seen: list[str] = []
    registry = SubagentRegistry(store, "alice", owner_id="operator")

    class Spender:
        """Spends 0.3 a step; at its third step it looks itself up, then finishes."""

        name = "child"

        async def step(self, run: StepInput) -> Any:
            if run.state.turn == 3:
                seen.append((await registry.get(run.state.run_id)).status)
                return Finish("done")
            return Respond([Message.assistant("working")], call=ModelCall("m", cost=0.3))

    parent_agent = ScriptedAgent("parent", [AskInput("which?")])
    runner = Runner(store, "alice", [parent_agent, Spender()])
    parent = await runner.start("parent", "go", limits=Limits(budget=BudgetFlag(maximum=5.0)))
    assert parent.state.headless  # and so is its child
    child_limits = Limits(budget=BudgetFlag(maximum=0.5))
    with pytest.raises(LimitReachedError) as caught:
        await runner.delegate(parent.state, "child", "spend", limits=child_limits)
    child_id = caught.value.state.run_id

    entry = await registry.get(child_id)
    assert entry.status == "paused"
    assert entry.outcome == "budget limit reached: 0.6 of 0.5"
    assert [e.run_id for e in await registry.list(status="paused")] == [child_id]

    await runner.raise_limits(child_id, budget=1.0)
    result = await runner.resume(child_id)
    assert result.status == "completed"
    assert seen == ["running"]  # running again while it was being driven
    done = await registry.get(child_id)
    assert (done.status, done.outcome) == ("completed", "done")
