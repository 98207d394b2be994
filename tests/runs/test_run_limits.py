"""Limits a run cannot get around: checked before every step and on resume, raised
explicitly (`Runner.raise_limits`), for iterations, budget, tokens and wall time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits, TimeFlag, TokenFlag
from statekeeper.core.messages import Message
from statekeeper.core.metrics import TokenUsage
from statekeeper.errors import InvalidInputError, LimitReachedError
from statekeeper.runs import Finish, ModelCall, Respond, Runner, RunPolicy, StepInput
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store, open_store


@pytest.fixture
async def memory() -> AsyncIterator[Store]:
    async with open_store("memory://") as opened:
        yield opened


class FakeClock:
    """A monotonic clock the test moves by hand (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def spender(cost: float = 0.4, *, tokens: int = 0) -> ScriptedAgent:
    """Spends ``cost`` (and ``tokens``) at every step, forever."""
    usage = TokenUsage(input_tokens=tokens)
    call = ModelCall("m", usage=usage, cost=cost)
    return ScriptedAgent("a", [Respond([Message.assistant("working")], call=call)])


def budget(maximum: float, increase: float = 0.0) -> Limits:
    return Limits(budget=BudgetFlag(maximum=maximum, increase_amount=increase))


async def test_a_run_at_its_budget_starts_no_step_until_it_is_raised(store: Store) -> None:
    runner = Runner(store, "alice", [spender(0.4)])
    paused = await runner.start("a", "go", headless=False, limits=budget(1.0))
    assert paused.status == "paused"
    assert paused.state.metrics.accumulated_cost == pytest.approx(1.2)
    assert paused.state.turn == 3
    for _ in range(3):  # resuming without raising the limit runs nothing
        with pytest.raises(LimitReachedError) as caught:
            await runner.resume(paused.run_id)
        assert caught.value.name == "budget"
        assert "raise_limits" in str(caught.value)
        assert "statekeeper runs raise-limit" in str(caught.value)
        assert caught.value.state.status == "paused"
    state = await runner.load(paused.run_id)
    assert (state.status, state.turn, state.revision) == ("paused", 3, paused.state.revision)
    assert state.metrics.accumulated_cost == pytest.approx(1.2)
    index, _ = await runner.runs.index(paused.run_id)
    assert index.status == "paused"
    assert index.owner is None  # the refused resume did not even take the lease

    raised = await runner.raise_limits(paused.run_id, budget=2.0)
    assert raised.limits.budget is not None
    assert raised.limits.budget.maximum == 2.0
    again = await runner.resume(paused.run_id)
    assert again.status == "paused"  # 1.6, then 2.0: at the new limit
    assert again.state.turn == 5
    assert again.state.metrics.accumulated_cost == pytest.approx(2.0)


async def test_headless_caller_catches_raises_and_continues(store: Store) -> None:
    agent = ScriptedAgent("a", [Respond([Message.assistant("step")])] * 3 + [Finish("done")])
    runner = Runner(store, "alice", [agent])
    with pytest.raises(LimitReachedError) as caught:
        await runner.start("a", "go", limits=Limits(iterations=IterationFlag(maximum=2)))
    state = caught.value.state
    assert state.status == "paused"  # stopped, resumable: not finished
    assert state.limits.iterations.current == 2
    assert f"raise_limits({state.run_id!r}, iterations=" in str(caught.value)
    assert (await runner.load(state.run_id)).status == "paused"
    events = await store.read_events("alice", state.run_id)
    stops = [e.payload for e in events if e.kind == "status" and "limit" in e.payload]
    assert [(p["status"], p["limit"], p["current"], p["maximum"]) for p in stops] == [
        ("paused", "iterations", 2, 2)
    ]
    assert not [e for e in events if e.stream == "error"]  # paused, not failed

    raised = await runner.raise_limits(state.run_id, iterations=10)
    assert raised.limits.iterations.maximum == 10
    done = await runner.resume(state.run_id)
    assert done.status == "completed"
    assert done.output == "done"
    assert done.state.turn == 4


async def test_raise_limits_by_the_increase_amount(memory: Store) -> None:
    runner = Runner(memory, "alice", [spender(0.0)])
    limits = Limits(iterations=IterationFlag(maximum=2, increase_amount=3))
    with pytest.raises(LimitReachedError):
        await runner.start("a", "go", limits=limits)  # headless too
    run_id = (await runner.runs.list())[0].run_id
    raised = await runner.raise_limits(run_id)
    assert raised.limits.iterations.maximum == 5
    with pytest.raises(LimitReachedError):
        await runner.resume(run_id)
    assert (await runner.load(run_id)).turn == 5


async def test_raise_limits_refuses_what_gives_no_room(memory: Store) -> None:
    runner = Runner(memory, "alice", [spender(0.4)])
    paused = await runner.start("a", "go", headless=False, limits=budget(1.0))
    run_id = paused.run_id
    with pytest.raises(InvalidInputError, match=r"budget.*1\.2"):
        await runner.raise_limits(run_id, budget=1.1)  # below what was spent
    with pytest.raises(InvalidInputError, match="no tokens limit"):
        await runner.raise_limits(run_id, tokens=100)
    with pytest.raises(InvalidInputError, match="budget="):
        await runner.raise_limits(run_id)  # no increase_amount and no new maximum
    with pytest.raises(InvalidInputError, match="budget"):
        await runner.raise_limits(run_id, budget=-1.0)
    with pytest.raises(InvalidInputError, match="whole number"):
        await runner.raise_limits(run_id, iterations=2.5)  # type: ignore[arg-type]
    state = await runner.load(run_id)
    assert state.limits.budget is not None
    assert state.limits.budget.maximum == 1.0
    assert state.revision == paused.state.revision  # nothing was written

    await runner.cancel(run_id)
    with pytest.raises(InvalidInputError, match="cancelled"):
        await runner.raise_limits(run_id, budget=5.0)


async def test_wall_time_is_a_limit(memory: Store) -> None:
    clock = FakeClock()

    def slow(run: StepInput) -> Respond:
        clock.now += 0.05  # the step takes 50 ms
        return Respond([Message.assistant("slow")])

    agent = ScriptedAgent("a", [slow])
    cap = IterationFlag(maximum=50)  # a safety net: time is what must stop it
    runner = Runner(memory, "alice", [agent], policy=RunPolicy(clock=clock))
    with pytest.raises(LimitReachedError) as caught:
        await runner.start("a", "go", limits=Limits(iterations=cap, time=TimeFlag(maximum=0.01)))
    state = caught.value.state
    assert caught.value.name == "time"
    assert state.turn == 1  # the second 50 ms step never started
    assert state.limits.time is not None
    assert state.limits.time.current == pytest.approx(0.05)

    clock.now += 3600  # time spent paused is not the run's time
    with pytest.raises(LimitReachedError):
        await runner.resume(state.run_id)
    await runner.raise_limits(state.run_id, seconds=0.2)
    with pytest.raises(LimitReachedError):
        await runner.resume(state.run_id)
    after = await runner.load(state.run_id)
    assert after.turn == 4  # 0.10, 0.15, 0.20
    assert after.limits.time is not None
    assert after.limits.time.current == pytest.approx(0.2)


async def test_token_limit_is_checked_before_each_step(memory: Store) -> None:
    runner = Runner(memory, "alice", [spender(0.0, tokens=60)])
    limits = Limits(tokens=TokenFlag(maximum=100))
    paused = await runner.start("a", "go", headless=False, limits=limits)
    assert paused.status == "paused"
    assert paused.state.turn == 2
    assert paused.state.limits.tokens is not None
    assert paused.state.limits.tokens.current == 120
    with pytest.raises(LimitReachedError, match="tokens"):
        await runner.resume(paused.run_id)
    await runner.raise_limits(paused.run_id, tokens=200)
    again = await runner.resume(paused.run_id)
    assert again.state.turn == 4
