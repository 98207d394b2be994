"""An ``--app`` for the start-and-steer tests: the demo's agents plus ``listener``.

``listener`` answers each input it takes (``heard: ...``) and otherwise keeps running,
idling in its step until a follow-up is pending for its session (or a few seconds
passed): so a test can steer a run that is really running. Input ``ask`` makes it wait
for input; ``stop`` finishes it with every user text it heard.
"""

from __future__ import annotations

import asyncio

from statekeeper.core.messages import Message
from statekeeper.demo_app import issue_refund, lookup_order
from statekeeper.demo_app import make_runner as demo_runner
from statekeeper.runs import Action, AskInput, Finish, Respond, Runner, StepInput, Tool
from statekeeper.stores import Store

IDLE_TICKS = 100  # of 0.05 s: an idle step ends after 5 s without a follow-up


class Listener:
    name = "listener"
    description = "Answers each input; keeps running until told 'stop'."

    def __init__(self) -> None:
        self.runner: Runner | None = None

    async def step(self, run: StepInput) -> Action:
        texts = [m.text for m in run.new_input if m.role == "user"]
        if "stop" in texts:
            heard = [m.text for m in run.messages if m.role == "user"]
            return Finish({"heard": heard}, Message.assistant("bye"))
        if "ask" in texts:
            return AskInput("What next?")
        if texts:
            return Respond([Message.assistant(f"heard: {' | '.join(texts)}")])
        await self._idle(run.state.session_id)
        return Respond([])

    async def _idle(self, session_id: str) -> None:
        queue = self.runner.coordination.followups if self.runner is not None else None
        before = len(queue.pending(session_id)) if queue is not None else 0
        for _ in range(IDLE_TICKS):  # a demo agent "thinking"; it wakes for a follow-up
            if queue is not None and len(queue.pending(session_id)) != before:
                return
            await asyncio.sleep(0.05)


def make_runner(store: Store, tenant: str) -> Runner:
    demo = demo_runner(store, tenant)
    listener = Listener()
    tools = [
        Tool("lookup_order", lookup_order, description="Find an order"),
        Tool("issue_refund", issue_refund, requires_approval=True, approval_prompt="Refund?"),
    ]
    runner = Runner(store, tenant, [*demo.agents.values(), listener], tools)
    listener.runner = runner
    for agent in runner.agents.values():  # the triage agent delegates on its runner
        if hasattr(agent, "runner"):
            agent.runner = runner
    return runner
