"""Delegated children reserve their room of the parent's budget when they start, so
children started together (in one process or several) cannot overspend the parent."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits, TokenFlag
from statekeeper.core.messages import Message
from statekeeper.errors import LimitReachedError, NotFoundError
from statekeeper.runs import (
    AskInput,
    Finish,
    ModelCall,
    Respond,
    Runner,
    RunState,
    StepInput,
    rollup,
)
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.runtime import SubagentRegistry
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store, open_store


def spend(cost: float) -> Respond:
    return Respond([Message.assistant("working")], call=ModelCall("m", cost=cost))


def budget(maximum: float, iterations: int | None = None) -> Limits:
    return Limits(iterations=IterationFlag(maximum=iterations), budget=BudgetFlag(maximum=maximum))


async def parent_of(runner: Runner) -> RunState:
    """A stored interactive parent with a budget of 1.0, paused after one free step."""
    result = await runner.start("parent", "go", headless=False, limits=budget(1.0, 1))
    assert result.status == "paused"
    return result.state


async def test_a_live_siblings_reservation_is_not_given_to_the_next_child(store: Store) -> None:
    agents = [
        ScriptedAgent("parent", [Respond([Message.assistant("plan")])]),
        ScriptedAgent("asker", [AskInput("which one?"), Finish("x")]),
        ScriptedAgent("helper", [Finish("y")]),
    ]
    runner = Runner(store, "alice", agents)
    parent = await parent_of(runner)

    asker = await runner.delegate(parent, "asker", "look", headless=False, limits=budget(0.6))
    assert asker.status == "waiting_for_input"  # live: it holds its 0.6

    helper = await runner.delegate(parent, "helper", "help")  # wants the policy's: no cap
    assert helper.state.limits.budget is not None
    assert helper.state.limits.budget.maximum == pytest.approx(0.4)

    # Once the waiting child ends, what it did not spend is the parent's again.
    await runner.resume(asker.run_id, "the first")
    after = await runner.delegate(parent, "helper", "again")
    assert after.state.limits.budget is not None
    assert after.state.limits.budget.maximum == pytest.approx(1.0)


class Gated:
    """Waits at its first step until the test opens the gate, then spends 0.25 a step."""

    def __init__(
        self, name: str, gate: asyncio.Event, entered: set[str], progress: asyncio.Event
    ) -> None:
        self.name, self.gate, self.entered, self.progress = name, gate, entered, progress

    async def step(self, run: StepInput) -> Any:
        self.entered.add(self.name)
        self.progress.set()
        await self.gate.wait()
        return spend(0.25)


async def test_children_started_together_share_the_parents_room(store: Store) -> None:
    gate, progress, entered = asyncio.Event(), asyncio.Event(), set[str]()
    names = ["c0", "c1", "c2"]
    agents: list[Any] = [ScriptedAgent("parent", [Respond([Message.assistant("plan")])])]
    agents += [Gated(name, gate, entered, progress) for name in names]
    runner = Runner(store, "alice", agents)
    parent = await parent_of(runner)

    tasks = [
        asyncio.create_task(
            runner.delegate(parent, name, "spend", headless=False, limits=budget(0.5, 50))
        )
        for name in names
    ]
    for task in tasks:
        task.add_done_callback(lambda _: progress.set())
    # Until each child is in its first step (holding its room) or was refused.
    while not all(t.done() or n in entered for t, n in zip(tasks, names, strict=True)):
        progress.clear()
        await progress.wait()
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)

    refused = [r for r in results if isinstance(r, LimitReachedError)]
    ran = [r for r in results if not isinstance(r, BaseException)]
    assert len(refused) == 1, results
    assert len(ran) == 2
    assert refused[0].state is None  # nothing was started for it
    assert "no budget left for another delegated run" in str(refused[0])
    assert all(r.status == "paused" for r in ran)  # each at its own 0.5
    spent = sum(r.state.local_metrics.accumulated_cost for r in ran)
    assert spent == pytest.approx(1.0)
    assert (await runner.load(parent.run_id)).metrics.accumulated_cost == pytest.approx(1.0)


async def test_a_refused_child_leaves_nothing_behind(store: Store) -> None:
    agents = [
        ScriptedAgent("parent", [Respond([Message.assistant("plan")])]),
        ScriptedAgent("asker", [AskInput("which one?"), Finish("x")]),
    ]
    runner = Runner(store, "alice", agents)
    parent = await parent_of(runner)
    await runner.delegate(parent, "asker", "look", headless=False, limits=budget(1.0))
    sessions, runs = await SessionManager(store, "alice").list(), await runner.runs.list()
    registry = SubagentRegistry(store, "alice", owner_id="operator")
    entries = await registry.list()

    with pytest.raises(LimitReachedError, match=r"raise_limits\('run_"):
        await runner.delegate(parent, "asker", "more", headless=False)

    assert len((await SessionManager(store, "alice").list()).items) == len(sessions.items)
    assert len(await runner.runs.list()) == len(runs)
    assert await registry.list() == entries
    live, _ = await rollup.live_children(runner.runs, parent.run_id)
    assert len(live.children) == 1


async def test_token_limits_are_reserved_too(store: Store) -> None:
    agents = [
        ScriptedAgent("parent", [Respond([Message.assistant("plan")])]),
        ScriptedAgent("asker", [AskInput("which one?"), Finish("x")]),
        ScriptedAgent("helper", [Finish("y")]),
    ]
    runner = Runner(store, "alice", agents)
    limits = Limits(iterations=IterationFlag(maximum=1), tokens=TokenFlag(maximum=1000))
    parent = (await runner.start("parent", "go", headless=False, limits=limits)).state
    asker_limits = Limits(tokens=TokenFlag(maximum=700))
    await runner.delegate(parent, "asker", "look", headless=False, limits=asker_limits)
    helper = await runner.delegate(parent, "helper", "help")
    assert helper.state.limits.tokens is not None
    assert helper.state.limits.tokens.maximum == 300
    assert isinstance(helper.state.limits.tokens.maximum, int)  # whole tokens


async def test_a_reservation_made_by_another_process_meanwhile_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two store objects on one database are two processes; the other one reserves
    # between this one's read of the parent's children and its write.
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    agents = [ScriptedAgent("parent", [Respond([Message.assistant("plan")])])]
    agents.append(ScriptedAgent("helper", [Finish("y")]))
    async with open_store(url) as here, open_store(url) as there:
        runner, other = Runner(here, "alice", agents), Runner(there, "alice", agents)
        parent = await parent_of(runner)
        real = rollup.current_parent
        raced = False

        async def racing(runs: Any, state: RunState) -> RunState:
            nonlocal raced
            if not raced:
                raced = True
                await rollup.reserve(other.runs, state, "run_elsewhere", budget(0.7))
            return await real(runs, state)

        monkeypatch.setattr(rollup, "current_parent", racing)
        helper = await runner.delegate(parent, "helper", "help")
        assert raced
        assert helper.state.limits.budget is not None
        assert helper.state.limits.budget.maximum == pytest.approx(0.3)
        live, _ = await rollup.live_children(other.runs, parent.run_id)
        assert set(live.children) == {"run_elsewhere"}  # the helper ended: released


async def test_a_cancelled_child_gives_its_room_back(store: Store) -> None:
    agents = [
        ScriptedAgent("parent", [Respond([Message.assistant("plan")])]),
        ScriptedAgent("asker", [AskInput("which one?"), Finish("x")]),
    ]
    runner = Runner(store, "alice", agents)
    parent = await parent_of(runner)
    asker = await runner.delegate(parent, "asker", "look", headless=False, limits=budget(1.0))
    with pytest.raises(LimitReachedError):
        await runner.delegate(parent, "asker", "more", headless=False)

    await runner.cancel(asker.run_id)
    again = await runner.delegate(parent, "asker", "more", headless=False)
    assert again.state.limits.budget is not None
    assert again.state.limits.budget.maximum == pytest.approx(1.0)


async def test_a_reservation_whose_child_never_came_is_released_in_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from statekeeper.core.messages import utcnow

    agents = [
        ScriptedAgent("parent", [Respond([Message.assistant("plan")])]),
        ScriptedAgent("helper", [Finish("y")]),
    ]
    runner = Runner(store, "alice", agents)
    parent = await parent_of(runner)
    # A process reserved for a child, then died before creating its run.
    await rollup.reserve(runner.runs, parent, "run_never", budget(0.7))

    soon = await runner.delegate(parent, "helper", "help")  # it may be starting still
    assert soon.state.limits.budget is not None
    assert soon.state.limits.budget.maximum == pytest.approx(0.3)

    later = utcnow() + rollup.ABANDONED_AFTER + timedelta(seconds=1)
    monkeypatch.setattr(rollup, "utcnow", lambda: later)
    freed = await runner.delegate(parent, "helper", "help")
    assert freed.state.limits.budget is not None
    assert freed.state.limits.budget.maximum == pytest.approx(1.0)
    live, _ = await rollup.live_children(runner.runs, parent.run_id)
    assert live.children == {}


async def test_deleting_a_parent_deletes_its_childrens_reservations(store: Store) -> None:
    runner = Runner(
        store, "alice", [ScriptedAgent("parent", [spend(0.0)]), ScriptedAgent("kid", [spend(0.1)])]
    )
    parent = await parent_of(runner)
    await runner.delegate(parent, "kid", "sub-task", headless=False, limits=budget(0.5, 1))
    assert await store.get_record("alice", rollup.CHILDREN_NAMESPACE, parent.run_id)
    await runner.runs.delete(parent.run_id)
    with pytest.raises(NotFoundError):
        await store.get_record("alice", rollup.CHILDREN_NAMESPACE, parent.run_id)
