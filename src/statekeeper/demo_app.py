"""The demo's agent app: a scripted support agent with a lookup tool and a refund tool
that needs a human's approval, and a triage agent that delegates carrier checks to child
runs. ``make_runner`` is also what the CLI's and the server's ``--app`` take:

    statekeeper runs resume RUN_ID --app statekeeper.demo_app:make_runner
"""

from __future__ import annotations

import json
from typing import Any

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.core.metrics import TokenUsage
from statekeeper.runs import (
    Action,
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

__all__ = ["make_runner"]


async def lookup_order(args: dict[str, Any], ctx: ToolContext) -> str:
    """Pretend to look an order up."""
    return json.dumps({"order": args["order"], "status": "lost in transit", "paid": 42.5})


async def issue_refund(args: dict[str, Any], ctx: ToolContext) -> str:
    """Pretend to refund money (the sensitive tool)."""
    return json.dumps({"refund": f"R-{args['order']}", "amount": args["amount"]})


def _call(call_id: str, name: str, **arguments: Any) -> ToolCallBlock:
    return ToolCallBlock(id=call_id, name=name, arguments=json.dumps(arguments))


def _usage(prompt: int, completion: int) -> ModelCall:
    return ModelCall(
        "demo-model",
        TokenUsage(input_tokens=prompt, output_tokens=completion),
        cost=round(prompt * 2.5e-6 + completion * 1e-5, 6),
    )


def _closing(run: StepInput) -> Finish:
    refunded = any("refund" in m.text for m in run.messages if m.role == "tool")
    reply = "Your refund is on its way." if refunded else "I could not refund this order."
    return Finish({"refunded": refunded}, Message.assistant(reply), call=_usage(900, 30))


class Triage:
    """Hands each order of its input to a ``carrier`` child run, then sums up."""

    name = "triage"

    def __init__(self) -> None:
        self.runner: Runner | None = None  # set by make_runner: children run on it

    async def step(self, run: StepInput) -> Action:
        if self.runner is None or run.state.turn > 1:
            found = [m.text for m in run.messages if m.role == "assistant"][1:]
            return Finish({"checked": len(found)}, Message.assistant(" ".join(found)))
        orders = [w.strip(",.") for w in run.messages[-1].text.split() if w.strip(",.").isdigit()]
        reports = []
        for order in orders:
            child = await self.runner.delegate(run.state, "carrier", f"Check order {order}")
            reports.append(f"Order {order}: {child.output}.")
        return Respond(
            [Message.assistant(f"Asked the carrier desk about {len(orders)} orders.")]
            + [Message.assistant(text) for text in reports],
            call=_usage(400, 25),
        )


def _carrier_report(run: StepInput) -> Finish:
    status = json.loads(next(m.text for m in reversed(run.messages) if m.role == "tool"))
    reply = f"Order {status['order']} is {status['status']}."
    return Finish(status["status"], Message.assistant(reply), call=_usage(300, 20))


def _carrier(run: StepInput) -> Respond:
    order = int(run.messages[-1].text.split()[-1])
    call = _call(f"c-track-{order}", "lookup_order", order=order)
    return Respond(
        [Message.assistant(f"Tracking order {order}.", tool_calls=[call])], call=_usage(200, 15)
    )


def make_runner(store: Store, tenant: str) -> Runner:
    """The demo's runner: agents ``support``, ``triage`` and ``carrier``, and two tools."""
    agent = ScriptedAgent(
        "support",
        [
            Respond(
                [
                    Message.assistant(
                        "Let me look up order 1042.",
                        tool_calls=[_call("c-lookup", "lookup_order", order=1042)],
                    )
                ],
                call=_usage(600, 40),
            ),
            Respond(
                [
                    Message.assistant(
                        "The parcel is lost; I will refund it.",
                        tool_calls=[_call("c-refund", "issue_refund", order=1042, amount=42.5)],
                    )
                ],
                call=_usage(750, 45),
            ),
            _closing,
        ],
    )
    tools = [
        Tool("lookup_order", lookup_order, description="Find an order"),
        Tool(
            "issue_refund",
            issue_refund,
            description="Refund an order",
            requires_approval=True,
            approval_prompt="Refund 42.50 for order 1042?",
        ),
    ]
    triage = Triage()
    carrier = ScriptedAgent("carrier", [_carrier, _carrier_report])
    runner = Runner(store, tenant, [agent, triage, carrier], tools)
    triage.runner = runner
    return runner
