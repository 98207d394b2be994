"""Inspecting a run: items by kind, tool counts, guardrails, model responses, timeline.

Views are cached per checkpoint revision and recomputed only when the run changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from statekeeper.core.messages import Message, Role, ToolCallBlock, ToolResultBlock
from statekeeper.runs.state import ApprovalDecision, GuardrailResult, RunState
from statekeeper.runs.store import RunStore
from statekeeper.sessions.manager import SessionManager
from statekeeper.sessions.view import build_view

__all__ = ["ModelResponse", "RunInspector", "RunItems", "StatusChange"]


@dataclass(frozen=True)
class RunItems:
    """The run's conversation sorted by kind."""

    messages: list[Message]
    user: list[Message] = field(default_factory=list)
    assistant: list[Message] = field(default_factory=list)
    tool_calls: list[ToolCallBlock] = field(default_factory=list)
    tool_results: list[ToolResultBlock] = field(default_factory=list)


@dataclass(frozen=True)
class ModelResponse:
    """One model call of the run, with its usage."""

    turn: int
    agent: str
    model: str
    usage: dict[str, Any]
    cost: float
    at: datetime
    text: str = ""
    """What the call said (the text of its last assistant message, or what it produced)."""
    profile: str | None = None
    """The auth profile the call used, if any."""


@dataclass(frozen=True)
class StatusChange:
    """One step of the run's status timeline."""

    source: str
    target: str
    at: datetime


class RunInspector:
    """Read-only views of one run, cached until the run changes."""

    def __init__(self, runs: RunStore, run_id: str) -> None:
        self.runs = runs
        self.run_id = run_id
        self._revision: int | None = None
        self._state: RunState | None = None
        self._items: RunItems | None = None
        self._events_seen = 0
        self._responses: list[ModelResponse] = []
        self._timeline: list[StatusChange] = []
        self.recomputed = 0
        """How many times the item view was rebuilt (for checking the cache)."""

    async def state(self) -> RunState:
        """The latest checkpoint (re-read every call; views below reuse it)."""
        state, _, _ = await self.runs.load(self.run_id)
        if state.revision != self._revision:
            self._revision, self._state, self._items = state.revision, state, None
        assert self._state is not None
        return self._state

    async def items(self) -> RunItems:
        """Messages the run sees, and its tool calls and results."""
        state = await self.state()
        if self._items is None:
            self.recomputed += 1
            manager = SessionManager(self.runs.store, self.runs.tenant, max_messages=None)
            record = await self.runs.store.get_session(self.runs.tenant, state.session_id)
            view = build_view(await manager.load_branch(record, state.transcript_seq))
            messages = view.messages
            self._items = RunItems(
                messages=messages,
                user=[m for m in messages if m.role == Role.USER],
                assistant=[m for m in messages if m.role == Role.ASSISTANT],
                tool_calls=[c for m in messages for c in m.tool_calls],
                tool_results=[r for m in messages for r in m.tool_results],
            )
        return self._items

    async def tool_counts(self) -> dict[str, int]:
        """Calls per tool."""
        return dict((await self.state()).tool_use)

    async def decisions(self) -> list[ApprovalDecision]:
        """Every approval decision of the run, oldest first: those on calls it settled
        (kept for good), then those on calls still pending (`RunState.decision_history`)."""
        return (await self.state()).decision_history

    async def guardrails(self, kind: str | None = None) -> list[GuardrailResult]:
        """Guardrail results, optionally of one kind (input, output, tool_input, tool_output)."""
        results = (await self.state()).guardrails
        return [g for g in results if kind is None or g.kind == kind]

    async def _read_events(self) -> None:
        events = await self.runs.store.read_events(
            self.runs.tenant, self.run_id, after_seq=self._events_seen
        )
        texts: dict[str, str] = {}
        if any(e.stream == "assistant" and "text" not in e.payload for e in events):
            # The runner's events name the message (``id``): its text is in the session.
            texts = {m.id: m.text for m in (await self.items()).assistant}
        for event in events:
            self._events_seen = event.seq
            payload = event.payload
            if event.stream == "assistant" and "usage" in payload:
                text = payload.get("text", texts.get(str(payload.get("id")), ""))
                self._responses.append(
                    ModelResponse(
                        turn=int(payload.get("turn", 0)),
                        agent=str(payload.get("agent", "")),
                        model=str(payload.get("model", "")),
                        usage=dict(payload["usage"]),
                        cost=float(payload.get("cost", 0.0)),
                        at=event.ts,
                        text=str(text),
                        profile=payload.get("profile"),
                    )
                )
            elif event.stream == "lifecycle" and event.kind == "status" and "from" in payload:
                self._timeline.append(StatusChange(payload["from"], payload["to"], event.ts))

    async def model_responses(self) -> list[ModelResponse]:
        """Every model call with its usage and cost, oldest first."""
        await self._read_events()
        return list(self._responses)

    async def timeline(self) -> list[StatusChange]:
        """Every status change, oldest first."""
        await self._read_events()
        return list(self._timeline)
