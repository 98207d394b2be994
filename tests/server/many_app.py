"""An ``--app`` for the many-servers tests: the demo's agents plus ``holder``.

``holder`` calls the ``hold`` tool once, then finishes. In a server started with
``SK_TEST_HOLD=1`` the tool never returns (a server that stops or dies mid-run); elsewhere
it returns at once. Each execution appends the server's name to the file
``SK_TEST_MARK`` (if set) as it begins. ``SK_TEST_OWNER`` names the lease owner (another
"host", so a dead server's lease is trusted until it expires) and ``SK_TEST_LEASE`` sets
the lease's seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.demo_app import issue_refund, lookup_order
from statekeeper.demo_app import make_runner as demo_runner
from statekeeper.runs import Action, Finish, Respond, Runner, StepInput, Tool, ToolContext
from statekeeper.runs.coordination import Coordination
from statekeeper.stores import Store


async def hold(args: dict[str, Any], ctx: ToolContext) -> str:
    server = os.environ.get("SK_TEST_OWNER", "")
    if mark := os.environ.get("SK_TEST_MARK"):  # every execution of the tool, in order
        await asyncio.to_thread(_mark, mark, server)
    if os.environ.get("SK_TEST_HOLD") == "1":
        await asyncio.Event().wait()  # until the server stops
    return json.dumps({"held": False, "server": server})


def _mark(path: str, server: str) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{server}\n")


class Holder:
    name = "holder"
    description = "Calls the hold tool once, then finishes."

    async def step(self, run: StepInput) -> Action:
        if any(m.role == "tool" for m in run.messages):
            return Finish("done", Message.assistant("done"))
        call = ToolCallBlock(id="c-hold", name="hold", arguments="{}")
        return Respond([Message.assistant("holding", tool_calls=[call])])


def make_runner(store: Store, tenant: str) -> Runner:
    demo = demo_runner(store, tenant)
    coordination = Coordination(lease_ttl=float(os.environ.get("SK_TEST_LEASE", "300")))
    if owner := os.environ.get("SK_TEST_OWNER"):
        coordination = Coordination(
            lease_ttl=coordination.lease_ttl, owner=f"{owner}:{os.getpid()}:test"
        )
    agents = [*demo.agents.values(), Holder()]
    tools = [
        Tool("lookup_order", lookup_order, description="Find an order"),
        Tool(
            "issue_refund",
            issue_refund,
            requires_approval=True,
            approval_prompt="Refund 42.50 for order 1042?",
        ),
        Tool("hold", hold, description="Hold until the server stops (SK_TEST_HOLD=1)"),
    ]
    runner = Runner(store, tenant, agents, tools, coordination=coordination)
    for agent in runner.agents.values():  # the triage agent delegates on its runner
        if hasattr(agent, "runner"):
            agent.runner = runner
    return runner
