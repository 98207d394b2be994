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

During a step an agent may stream partial text (`StepInput.stream`, published as
``assistant/partial``), take an auth profile for its model call
(`StepInput.auth_profile`), and signal a provider's rate limit by raising
`RateLimited`: the runner rotates to the next profile and asks again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from pydantic import JsonValue

from statekeeper.core.messages import Message
from statekeeper.core.metrics import TokenUsage
from statekeeper.errors import InvalidInputError, StatekeeperError
from statekeeper.runs.state import GuardrailResult, RunState
from statekeeper.runtime.profiles import AuthProfile

__all__ = [
    "Action",
    "Agent",
    "AskInput",
    "Cancel",
    "Finish",
    "Handoff",
    "ModelCall",
    "RateLimited",
    "Respond",
    "StepHandle",
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


class RateLimited(StatekeeperError):
    """Raised by an agent's step when the model provider refused a call for a rate limit.

    The runner puts the auth profile the step took (`StepInput.auth_profile`) in
    cooldown (``retry_after`` seconds when the provider said, else the profiles'
    backoff), and asks the agent again with the next profile. When no profile is free
    (or the runner has none) the run pauses: resume it after ``RunState.error.data
    ["available_at"]``.
    """

    def __init__(
        self, reason: str = "rate limited", *, retry_after: float | timedelta | None = None
    ) -> None:
        if isinstance(retry_after, timedelta):
            retry_after = retry_after.total_seconds()
        if retry_after is not None and not retry_after >= 0:
            raise InvalidInputError(f"retry_after must be >= 0 seconds, not {retry_after}")
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class StepHandle(Protocol):
    """What the runner lends a step (see `StepInput.stream` and `StepInput.auth_profile`)."""

    async def stream(self, text_delta: str) -> None: ...

    async def auth_profile(self) -> AuthProfile: ...


@dataclass(frozen=True)
class StepInput:
    """Everything an agent sees for one step. ``state`` is a copy: changes are ignored.

    ``handle`` is set by the runner (None when an agent is called directly, e.g. in a
    unit test): it is what `stream` and `auth_profile` use.
    """

    state: RunState
    messages: Sequence[Message]
    new_input: Sequence[Message]
    context: Any
    tools: Mapping[str, Tool]
    handle: StepHandle | None = field(default=None, repr=False, compare=False)

    async def stream(self, text_delta: str) -> None:
        """Publish a piece of the reply being generated, as an ``assistant/partial`` event
        (``text``: the reply so far in this step, ``delta``: this piece). Does nothing
        without a runner. The final text is still what the action returns."""
        if not isinstance(text_delta, str):
            raise InvalidInputError(f"stream() takes text, not {type(text_delta).__name__}")
        if self.handle is not None:
            await self.handle.stream(text_delta)

    async def auth_profile(self) -> AuthProfile:
        """The auth profile for this step's model call: the least recently used one not
        cooling down (its use recorded), the same one if asked again in the step. Raise
        `RateLimited` if the provider refuses it. Needs a runner given profiles
        (``Runner(auth=...)``)."""
        if self.handle is None:
            raise InvalidInputError(
                "auth_profile() needs a runner: give Runner(auth=AuthProfiles(...))"
            )
        return await self.handle.auth_profile()


@runtime_checkable
class Agent(Protocol):
    """Anything the runner can drive."""

    name: str

    async def step(self, run: StepInput) -> Action:
        """Decide the next action."""
        ...
