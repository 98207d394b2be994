"""What the runner drives: the agent protocol, the actions an agent returns, and tools.

An agent is any object with a ``name`` and an async ``step(StepInput) -> Action``. It
sees the conversation (the session's active view plus what the run added), the new
input of this step, the live user context and the tools; it returns one action:

    Respond(messages)      assistant messages; tool calls in them are executed
    Finish(output)         the run is complete
    AskInput(prompt)       wait for the user (WAITING_FOR_INPUT)
    Handoff(to)            another agent takes over from the next step
    Cancel(reason)         the run ends CANCELLED (the user declined, say)

Any action may report the model call behind it (`ModelCall`), guardrail results, and
``metadata`` keys to keep in the run state (agents see a copy of the state; this is how
they persist their own notes, such as a handler's sub-state).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import JsonValue

from statekeeper.core.messages import Message
from statekeeper.core.metrics import TokenUsage
from statekeeper.runs.state import GuardrailResult, RunState

__all__ = [
    "Action",
    "Agent",
    "AskInput",
    "Cancel",
    "Finish",
    "Handoff",
    "ModelCall",
    "Respond",
    "StepInput",
    "Tool",
    "ToolContext",
]


@dataclass(frozen=True)
class ModelCall:
    """The model call an action came from: recorded in the run's metrics and events."""

    model: str
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost: float = 0.0
    latency: float | None = None


@dataclass(frozen=True)
class _Reported:
    call: ModelCall | None = field(default=None, kw_only=True)
    guardrails: Sequence[GuardrailResult] = field(default=(), kw_only=True)
    metadata: Mapping[str, JsonValue] | None = field(default=None, kw_only=True)
    """Keys to set in ``RunState.metadata`` (the agent's own persistent notes)."""


@dataclass(frozen=True)
class Respond(_Reported):
    """Assistant messages. Tool calls in them are run (or wait for approval)."""

    messages: Sequence[Message]


@dataclass(frozen=True)
class Finish(_Reported):
    """The run is done; ``output`` is its result, ``message`` an optional last reply."""

    output: JsonValue = None
    message: Message | None = None


@dataclass(frozen=True)
class AskInput(_Reported):
    """Stop and wait for the user; ``fields`` names what is still missing."""

    prompt: str
    fields: Sequence[str] = ()


@dataclass(frozen=True)
class Handoff(_Reported):
    """Hand the run to agent ``to`` from the next step on."""

    to: str
    message: Message | None = None


@dataclass(frozen=True)
class Cancel(_Reported):
    """End the run as CANCELLED (e.g. the user declined); ``message`` is a last reply."""

    reason: str
    message: Message | None = None


Action = Respond | Finish | AskInput | Handoff | Cancel


@dataclass(frozen=True)
class ToolContext:
    """What a tool function gets besides its arguments."""

    run: RunState
    call_id: str
    context: Any


@dataclass(frozen=True)
class Tool:
    """A tool an agent may call. ``fn(arguments, ctx)`` returns the output (str or JSON).

    ``requires_approval`` (a bool, or a function of the arguments) stops the run in
    WAITING_FOR_APPROVAL until a human decides; ``approval_prompt`` is shown to them.
    Guardrails see the arguments before and the output after the call; a triggered
    one blocks the call (its result says why).
    """

    name: str
    fn: Callable[[dict[str, Any], ToolContext], Awaitable[JsonValue]]
    description: str = ""
    requires_approval: bool | Callable[[dict[str, Any]], bool] = False
    approval_prompt: str | None = None
    input_guardrail: Callable[[dict[str, Any]], GuardrailResult | None] | None = None
    output_guardrail: Callable[[JsonValue], GuardrailResult | None] | None = None

    def needs_approval(self, arguments: dict[str, Any]) -> bool:
        """Whether this call must wait for a human decision."""
        if callable(self.requires_approval):
            return bool(self.requires_approval(arguments))
        return self.requires_approval


@dataclass(frozen=True)
class StepInput:
    """Everything an agent sees for one step. ``state`` is a copy: changes are ignored."""

    state: RunState
    messages: Sequence[Message]
    new_input: Sequence[Message]
    context: Any
    tools: Mapping[str, Tool]


@runtime_checkable
class Agent(Protocol):
    """Anything the runner can drive."""

    name: str

    async def step(self, run: StepInput) -> Action:
        """Decide the next action."""
        ...
