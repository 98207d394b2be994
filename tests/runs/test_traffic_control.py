"""`TrafficControlState` for code ported from OpenHands: derived from a run, read-only."""

from __future__ import annotations

from datetime import timedelta

from statekeeper.core.limits import IterationFlag, Limits
from statekeeper.core.messages import Message
from statekeeper.runs import (
    Finish,
    RateLimited,
    Respond,
    Runner,
    StepInput,
    TrafficControlState,
    traffic_control_state,
)
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store


async def test_a_rate_limited_run_is_throttling_a_run_paused_at_a_limit_is_paused(
    store: Store,
) -> None:
    class Limited:
        name = "limited"
        calls = 0

        async def step(self, run: StepInput) -> Finish:
            Limited.calls += 1
            if Limited.calls == 1:
                raise RateLimited("quota", retry_after=timedelta(minutes=2))
            return Finish("ok")

    talker = ScriptedAgent("talker", [Respond([Message.assistant(f"{n}")]) for n in range(5)])
    runner = Runner(store, "alice", [Limited(), talker])

    limited = await runner.start("limited", "hi")
    assert traffic_control_state(limited.state) is TrafficControlState.THROTTLING
    done = await runner.resume(limited.run_id)
    assert traffic_control_state(done.state) is TrafficControlState.NORMAL

    at_limit = await runner.start(
        "talker", "hi", headless=False, limits=Limits(iterations=IterationFlag(maximum=2))
    )
    assert at_limit.status == "paused"
    assert traffic_control_state(at_limit.state) is TrafficControlState.PAUSED
    assert TrafficControlState.PAUSED == "paused"  # OpenHands' values
