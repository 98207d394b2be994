"""A parent and its delegated child, for test_delegation_recovery (run in a subprocess).

``python delegation_crash_app.py URL finish|pause`` starts run ``run-parent`` (budget 1.0,
paused after one step), delegates a child that finishes (``finish``) or pauses at its own
budget (``pause``), and kills the process right after the child's final checkpoint,
where it would report its usage to the parent: exit code 17, nothing else runs.
"""

from __future__ import annotations

import asyncio
import os
import sys

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits
from statekeeper.core.messages import Message
from statekeeper.runs import Finish, ModelCall, Respond, Runner, RunState
from statekeeper.runs import loop as run_loop
from statekeeper.runs.runner import RunStore
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store, open_store

CRASHED = 17


def spend(cost: float) -> Respond:
    return Respond([Message.assistant("working")], call=ModelCall("m", cost=cost))


def make_runner(store: Store) -> Runner:
    agents = [
        ScriptedAgent("parent", [Respond([Message.assistant("plan")]), spend(0.1)]),
        ScriptedAgent("finisher", [spend(0.4), Finish("done")]),
        ScriptedAgent("spender", [spend(0.3)]),
    ]
    return Runner(store, "t", agents)


async def main(url: str, mode: str) -> None:
    async with open_store(url) as store:
        runner = make_runner(store)
        limits = Limits(iterations=IterationFlag(maximum=1), budget=BudgetFlag(maximum=1.0))
        parent = await runner.start(
            "parent", "go", headless=False, limits=limits, run_id="run-parent"
        )

        async def crash(runs: RunStore, state: RunState) -> None:
            os._exit(CRASHED)  # a real crash: no finally, no flush

        run_loop.report_usage = crash  # type: ignore[assignment]
        if mode == "finish":
            await runner.delegate(parent.state, "finisher", "sub-task")
        else:
            child_limits = Limits(budget=BudgetFlag(maximum=0.5))
            await runner.delegate(parent.state, "spender", "sub-task", limits=child_limits)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
    sys.exit(0)  # not reached: the child's end crashes the process
