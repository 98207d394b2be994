"""Delegated runs: a child's own usage is its total minus the parent's snapshot, and its
spend rolls up into the parent, so a tree of agents cannot outspend the root's budget."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits
from statekeeper.core.messages import Message
from statekeeper.core.metrics import DelegationInfo, Metrics, local_metrics
from statekeeper.errors import LimitReachedError
from statekeeper.runs import Action, Finish, ModelCall, Respond, Runner, RunState, StepInput
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store, open_store


@pytest.fixture
async def memory() -> AsyncIterator[Store]:
    async with open_store("memory://") as opened:
        yield opened


def spend(cost: float, text: str = "working") -> Respond:
    return Respond([Message.assistant(text)], call=ModelCall("m", cost=cost))


def spender(name: str, cost: float) -> ScriptedAgent:
    """Spends ``cost`` at every step, forever."""
    return ScriptedAgent(name, [spend(cost)])


def one_shot(name: str, cost: float) -> ScriptedAgent:
    """Spends ``cost`` once, then finishes."""
    return ScriptedAgent(name, [spend(cost), Finish("sub-result")])


def limits(budget: float, iterations: int | None = None) -> Limits:
    return Limits(iterations=IterationFlag(maximum=iterations), budget=BudgetFlag(maximum=budget))


async def test_local_metrics_is_total_minus_the_parent_snapshot(store: Store) -> None:
    runner = Runner(store, "alice", [spender("parent", 0.5), one_shot("child", 0.05)])
    parent = await runner.start("parent", "go", headless=False, limits=limits(10.0, 1))
    assert parent.state.metrics.accumulated_cost == 0.5

    child = await runner.delegate(parent.state, "child", "sub-task")

    assert child.status == "completed"
    assert child.state.delegation is not None
    snapshot = child.state.delegation.parent_metrics_snapshot
    assert snapshot.accumulated_cost == 0.5
    # The reference semantics: the child's metrics are the total, local = total - snapshot.
    assert child.state.metrics.accumulated_cost == pytest.approx(0.55)
    assert child.state.local_metrics.accumulated_cost == pytest.approx(0.05)
    assert child.state.local_metrics == local_metrics(child.state.metrics, snapshot)
    assert child.state.local_metrics.calls == 1
    stored = await runner.load(child.run_id)
    assert stored.local_metrics.accumulated_cost == pytest.approx(0.05)


def test_local_metrics_of_a_state_follow_the_reference() -> None:
    parent = Metrics()
    parent.add("m", cost=0.5)
    total = parent.snapshot()
    total.add("m", cost=0.05)
    total.add("other", cost=0.01)
    delegation = DelegationInfo.child_of(0, parent, 1, parent_run_id="run_parent")
    state = RunState(
        tenant="alice", session_id="ses", agent="a", metrics=total, delegation=delegation
    )
    assert state.local_metrics == total - parent
    assert state.local_metrics.accumulated_cost == pytest.approx(0.06)


async def test_child_spend_rolls_up_and_counts_against_the_parent(store: Store) -> None:
    runner = Runner(store, "alice", [spender("parent", 0.1), one_shot("child", 0.8)])
    # The parent's first step costs nothing; then it waits while a child works.
    parent_agent = ScriptedAgent("parent", [Respond([Message.assistant("plan")]), spend(0.1)])
    runner.agents["parent"] = parent_agent
    parent = await runner.start("parent", "go", headless=False, limits=limits(1.0, 1))

    child = await runner.delegate(parent.state, "child", "sub-task")
    assert child.status == "completed"

    rolled = await runner.load(parent.run_id)
    assert rolled.metrics.accumulated_cost == pytest.approx(0.8)  # the parent's total
    assert rolled.limits.budget is not None
    assert rolled.limits.budget.current == pytest.approx(0.8)

    await runner.raise_limits(parent.run_id, iterations=100)
    stopped = await runner.resume(parent.run_id)
    # 0.9, then 1.0: at the root's budget, the parent may not start another step.
    assert stopped.status == "paused"
    assert stopped.state.turn == 3
    assert stopped.state.metrics.accumulated_cost == pytest.approx(1.0)
    own = stopped.state.metrics - child.state.local_metrics
    assert own.accumulated_cost == pytest.approx(0.2)


async def test_a_child_cannot_spend_past_the_parents_room(store: Store) -> None:
    agents = [
        ScriptedAgent("parent", [Respond([Message.assistant("plan")])]),
        one_shot("first", 0.8),
        spender("greedy", 0.15),
    ]
    runner = Runner(store, "alice", agents)
    parent = await runner.start("parent", "go", headless=False, limits=limits(1.0, 1))
    await runner.delegate(parent.state, "first", "sub-task")

    # The caller still holds the parent's state from before the first child: the second
    # child is capped by what the parent has left now, 0.2.
    with pytest.raises(LimitReachedError) as caught:
        await runner.delegate(
            parent.state,
            "greedy",
            "spend it all",
            headless=True,
            limits=Limits(iterations=IterationFlag(maximum=30)),  # its own; no budget
        )
    greedy = caught.value.state
    assert caught.value.name == "budget"
    assert greedy.limits.budget is not None
    assert greedy.limits.budget.maximum == pytest.approx(0.2)
    assert greedy.turn == 2  # 0.15, 0.30: stopped before a third step
    assert greedy.local_metrics.accumulated_cost == pytest.approx(0.3)

    rolled = await runner.load(parent.run_id)
    assert rolled.metrics.accumulated_cost == pytest.approx(1.1)
    await runner.raise_limits(parent.run_id, iterations=100)
    with pytest.raises(LimitReachedError, match="budget"):
        await runner.resume(parent.run_id)  # the tree spent the root's budget
    assert (await runner.load(parent.run_id)).turn == 1


class Delegating:
    """A parent that hands its first step to a child (run by ``helper``), then spends."""

    name = "parent"

    def __init__(self, helper: Runner) -> None:
        self.helper = helper
        self.child_status: str | None = None

    async def step(self, run: StepInput) -> Action:
        if run.state.turn == 1:
            result = await self.helper.delegate(run.state, "child", "sub-task")
            self.child_status = result.status
            return Respond([Message.assistant(f"the child said {result.output}")])
        return spend(0.1)


async def test_a_child_delegated_mid_step_rolls_up_into_the_running_parent(
    memory: Store,
) -> None:
    # The child runs on another runner (as in another process): the spend reaches the
    # running parent through the store, before its next step.
    helper = Runner(memory, "alice", [one_shot("child", 0.8)])
    agent = Delegating(helper)
    runner = Runner(memory, "alice", [agent])
    result = await runner.start("parent", "go", headless=False, limits=limits(1.0, 50))
    assert agent.child_status == "completed"
    assert result.status == "paused"
    assert result.state.turn == 3  # 0.8 (child), 0.9, 1.0
    assert result.state.metrics.accumulated_cost == pytest.approx(1.0)
    with pytest.raises(LimitReachedError):
        await runner.resume(result.run_id)


async def test_grandchildren_roll_up_to_the_root(memory: Store) -> None:
    runner = Runner(
        memory,
        "alice",
        [
            ScriptedAgent("root", [Respond([Message.assistant("plan")])]),
            ScriptedAgent("middle", [spend(0.1), Finish("middle done")]),
            one_shot("leaf", 0.3),
        ],
    )
    root = await runner.start("root", "go", headless=False, limits=limits(5.0, 1))
    mid = await runner.delegate(
        root.state, "middle", "part", limits=Limits(iterations=IterationFlag(maximum=1))
    )
    assert mid.status == "paused"  # it spent 0.1: the root sees it already
    assert (await runner.load(root.run_id)).metrics.accumulated_cost == pytest.approx(0.1)
    leaf = await runner.delegate(mid.state, "leaf", "detail")
    assert leaf.state.delegate_level == 2
    mid_state = await runner.load(mid.run_id)
    assert mid_state.local_metrics.accumulated_cost == pytest.approx(0.4)
    await runner.raise_limits(mid.run_id, iterations=10)
    await runner.resume(mid.run_id)
    root_state = await runner.load(root.run_id)
    assert root_state.metrics.accumulated_cost == pytest.approx(0.4)


async def test_session_stats_count_a_delegated_spend_once(memory: Store) -> None:
    runner = Runner(memory, "alice", [spender("parent", 0.1), one_shot("child", 0.8)])
    parent = await runner.start("parent", "go", headless=False, limits=limits(5.0, 1))
    child = await runner.delegate(parent.state, "child", "here", own_session=False)
    assert child.state.session_id == parent.state.session_id
    rolled = await runner.load(parent.run_id)
    assert rolled.metrics.accumulated_cost == pytest.approx(0.9)  # the parent's total
    assert rolled.own_metrics.accumulated_cost == pytest.approx(0.1)  # what it spent itself

    stats = await runner.session_stats(parent.state.session_id)
    assert stats.cost == pytest.approx(0.9)  # not 1.7: the child's 0.8 counts once
    assert {r.run_id: r.cost for r in stats.runs} == {
        parent.run_id: pytest.approx(0.1),
        child.run_id: pytest.approx(0.8),
    }


async def test_delegated_runs_are_listed_without_a_registry_passed(store: Store) -> None:
    from statekeeper.runtime.subagents import SubagentRegistry

    runner = Runner(store, "alice", [spender("parent", 0.1), one_shot("child", 0.1)])
    parent = await runner.start("parent", "go", headless=False, limits=limits(1.0, 5))
    child = await runner.delegate(parent.state, "child", "sub-task")
    listed = await SubagentRegistry(store, "alice", owner_id="operator").list()
    assert [(e.run_id, e.status) for e in listed] == [(child.run_id, "completed")]
    assert listed[0].task == "sub-task"
