"""The app the CLI tests resume runs with: ``--app cli_app:make_runner``.

Not a test module (no ``test_`` prefix); the tests put this folder on ``sys.path``.
"""

from __future__ import annotations

import json
from typing import Any

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.core.metrics import TokenUsage
from statekeeper.runs import (
    AskInput,
    Finish,
    ModelCall,
    Respond,
    Runner,
    StepInput,
    Tool,
    ToolContext,
)
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store

refunds: list[int] = []


async def refund(args: dict[str, Any], ctx: ToolContext) -> str:
    refunds.append(int(args["amount"]))
    return f"refunded {args['amount']}"


TOOLS = [Tool("refund", refund, requires_approval=True, approval_prompt="Send money back?")]


def support() -> ScriptedAgent:
    """Asks to refund (needs approval), then finishes."""
    call = ToolCallBlock(id="c1", name="refund", arguments=json.dumps({"amount": 5}))
    return ScriptedAgent(
        "support",
        [
            Respond(
                [Message.assistant("Refunding.", tool_calls=[call])],
                call=ModelCall(
                    "model-a", TokenUsage(input_tokens=120, output_tokens=30), cost=0.02
                ),
            ),
            Finish({"refunded": 5}, Message.assistant("Refund sent.")),
        ],
    )


def _thank(run: StepInput) -> Finish:
    order = run.new_input[-1].text if run.new_input else "?"
    return Finish({"order": order}, Message.assistant(f"Thanks, looking at order {order}."))


def asker() -> ScriptedAgent:
    """Waits for the order number, then finishes with it."""
    return ScriptedAgent("asker", [AskInput("What is your order number?", ["order"]), _thank])


def _explode(run: StepInput) -> Finish:
    raise RuntimeError("model exploded")


def crasher() -> ScriptedAgent:
    """Waits for input, then fails on resume."""
    return ScriptedAgent("crasher", [AskInput("Say something."), _explode])


def spender() -> ScriptedAgent:
    """Spends 0.4 at each of three steps, then finishes."""
    call = ModelCall("model-a", TokenUsage(input_tokens=100), cost=0.4)
    work = Respond([Message.assistant("Working.")], call=call)
    return ScriptedAgent("spender", [work, work, work, Finish({"spent": 1.2})])


def make_runner(store: Store, tenant: str) -> Runner:
    """The factory ``statekeeper runs resume --app`` calls."""
    return Runner(store, tenant, [support(), asker(), crasher(), spender()], TOOLS)


def not_a_runner(store: Store, tenant: str) -> str:
    """A wrong factory, for the error test."""
    return "nope"


def boom_factory(store: Store, tenant: str) -> Runner:
    """A factory that fails, for the error test."""
    raise RuntimeError("no config")
