"""Asking the agent for one step, and saying what it said.

`ask` calls ``agent.step`` with a `LiveStep` handle: the agent streams partial text
through it (``assistant/partial`` events) and takes an auth profile for its model call.
When the agent raises `RateLimited`, the profile it took is put in cooldown, an
``auth/rotated`` event names the next one, and the agent is asked again with it; when
no profile is free (or there are none) `ask` raises `StepPaused` and the run pauses.

`said` turns an action into its ``assistant/complete`` events: one per assistant
message, naming it (``id``: its entry id in the session, written in the same commit; the
text and the tool calls' arguments are there, not repeated) with its tool calls' ids and
names; the model call behind the action (model, usage, cost, the auth profile) rides on
the last one, or on an event of its own carrying what the call produced when the action
has no assistant message (a `Finish` output, say).
`account` records what an action reports (its model call, metadata, guardrail results)
in the run state.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from statekeeper.core.messages import Message, Role, utcnow
from statekeeper.errors import InvalidInputError
from statekeeper.runs.agent import (
    Action,
    Agent,
    Cancel,
    Finish,
    Handoff,
    RateLimited,
    StepInput,
)
from statekeeper.runs.lifecycle import RunLifecycle
from statekeeper.runs.state import ErrorDetails, RunState
from statekeeper.runtime.profiles import AllProfilesCoolingDownError, AuthProfile, AuthProfiles

__all__ = ["TEXT_LIMIT", "LiveStep", "StepPaused", "account", "ask", "said"]

TEXT_LIMIT = 8000
"""Characters of a message's text an ``assistant/complete`` event carries (``truncated``
is set when it has more)."""


class StepPaused(Exception):
    """The step could not get a model call through (rate limited, no profile free)."""

    def __init__(self, reason: str, available_at: datetime | None, profile: str | None) -> None:
        super().__init__(reason)
        self.reason, self.available_at, self.profile = reason, available_at, profile

    def details(self, turn: int) -> ErrorDetails:
        """The run's ``error`` while it is paused for this (cleared when it runs again)."""
        available = self.available_at.isoformat() if self.available_at else None
        return ErrorDetails(
            type=RateLimited.__name__,  # what `traffic_control_state` looks for
            message=self.reason[:2000],
            turn=turn,
            data={"available_at": available, "profile": self.profile},
        )


class LiveStep:
    """The `StepHandle` of one attempt at a step."""

    def __init__(
        self,
        lifecycle: RunLifecycle,
        state: RunState,
        profiles: AuthProfiles | None,
        profile: AuthProfile | None = None,
    ) -> None:
        self.lifecycle, self.state, self.profiles = lifecycle, state, profiles
        self.profile = profile
        """The profile this attempt took (or was given after a rotation)."""
        self.text = ""

    async def stream(self, text_delta: str) -> None:
        """Publish ``assistant/partial``: the text so far and this piece."""
        self.text += text_delta
        payload = {"text": self.text, "delta": text_delta, "agent": self.state.agent}
        await self.lifecycle.publish(self.state, "assistant", "partial", payload)

    async def auth_profile(self) -> AuthProfile:
        """Pick a profile (once per attempt)."""
        if self.profile is None:
            if self.profiles is None:
                raise InvalidInputError(
                    f"agent {self.state.agent!r} has no auth profiles: give "
                    "Runner(auth=AuthProfiles(...)) or a mapping of agent name to profiles"
                )
            self.profile = await self.profiles.pick()
        return self.profile


async def ask(
    agent: Agent,
    step_input: StepInput,
    lifecycle: RunLifecycle,
    state: RunState,
    profiles: AuthProfiles | None,
) -> tuple[Action, AuthProfile | None]:
    """The agent's action, and the profile its model call used (see the module docstring)."""
    given: AuthProfile | None = None
    failures = 0
    while True:
        live = LiveStep(lifecycle, state, profiles, given)
        try:
            action = await agent.step(replace(step_input, handle=live))
        except AllProfilesCoolingDownError as exc:
            raise StepPaused(str(exc), exc.available_at, exc.profile_id) from exc
        except RateLimited as exc:
            failures += 1
            given = await _rotate(live, exc, lifecycle, state, failures)
            continue
        if live.profile is not None and live.profile.failure_count and profiles is not None:
            await profiles.report_success(live.profile.id)
        return action, live.profile


async def _rotate(
    live: LiveStep, exc: RateLimited, lifecycle: RunLifecycle, state: RunState, failures: int
) -> AuthProfile:
    """Cool the profile ``live`` took down and return the next one; `StepPaused` if none."""
    profiles, failed = live.profiles, live.profile
    if profiles is None or failed is None:
        rest = exc.retry_after
        available = utcnow() + timedelta(seconds=rest) if rest is not None else None
        raise StepPaused(f"rate limited: {exc.reason}", available, None) from exc
    try:
        given = await profiles.report_failure(failed.id, exc.reason, retry_after=exc.retry_after)
    except AllProfilesCoolingDownError as cooling:
        raise StepPaused(str(cooling), cooling.available_at, cooling.profile_id) from exc
    cooled = await profiles.get(failed.id)
    payload: dict[str, Any] = {
        "from": failed.id,
        "to": given.id,
        "reason": exc.reason,
        "cooldown_until": cooled.cooldown_until.isoformat() if cooled.cooldown_until else None,
    }
    await lifecycle.publish(state, "auth", "rotated", payload)
    if failures >= len(await profiles.list()):
        # Every profile was refused in this step (the provider asked for no rest): stop.
        raise StepPaused(f"rate limited on every profile: {exc.reason}", None, given.id) from exc
    return given


def said(
    action: Action, messages: Sequence[Message], agent: str, profile: AuthProfile | None
) -> list[dict[str, Any]]:
    """The ``assistant/complete`` payloads of ``action`` whose step wrote ``messages``."""
    events = [_message_payload(m, agent) for m in messages if m.role == Role.ASSISTANT]
    call = action.call
    if call is None:
        return events
    details: dict[str, Any] = {
        "model": call.model,
        "usage": call.usage.model_dump(mode="json"),
        "cost": call.cost,
        "latency": call.latency,
    }
    if profile is not None:
        details["profile"] = profile.id
    if not events:
        events.append({"text": "", "agent": agent, **_produced(action)})
    events[-1].update(details)
    return events


def _message_payload(message: Message, agent: str) -> dict[str, Any]:
    payload: dict[str, Any] = {"id": message.id, "agent": agent}
    if message.tool_calls:
        payload["tool_calls"] = [{"id": c.id, "name": c.name} for c in message.tool_calls]
    return payload


def _produced(action: Action) -> dict[str, Any]:
    """What a model call without an assistant message produced, for its event."""
    if isinstance(action, Finish):
        output = action.output
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
        text = "" if output is None else text
        return {"text": text[:TEXT_LIMIT], "output": output}
    if isinstance(action, Handoff):
        return {"handoff": action.to}
    if isinstance(action, Cancel):
        return {"text": action.reason, "cancelled": True}
    return {}


def account(state: RunState, action: Action) -> None:
    """Record what the action reports: its model call, metadata and guardrail results."""
    if action.call is not None:
        call = action.call
        state.metrics.add(call.model, cost=call.cost, usage=call.usage, latency=call.latency)
        state.measure_spend()
    if action.metadata:
        state.metadata = {**state.metadata, **action.metadata}
    if action.guardrails:
        state.guardrails = [
            *state.guardrails,
            *(g.model_copy(update={"turn": state.turn}) for g in action.guardrails),
        ]
