"""`RunLifecycle`: moves runs through their transition table and reports what happens."""

from __future__ import annotations

from typing import Any

from statekeeper.core.lifecycle import AgentStatus, TransitionTable
from statekeeper.errors import InvalidTransitionError
from statekeeper.runs.results import EventSink
from statekeeper.runs.state import RunState
from statekeeper.tracing import current_span_id

__all__ = ["FINISHED", "RunLifecycle"]

FINISHED = frozenset({AgentStatus.COMPLETED, AgentStatus.CANCELLED, AgentStatus.ERROR})
"""Statuses a run never leaves (the runner publishes ``lifecycle/end`` on reaching one)."""


class RunLifecycle:
    """Status moves checked against ``transitions``, and the run events for ``events``.

    A move is synchronous (it only changes the state in memory); its ``status`` event is
    queued and published before the next event, or by `flush`, so subscribers see status
    changes in the order they happened and interleaved correctly with the rest.
    """

    def __init__(self, transitions: TransitionTable, events: EventSink) -> None:
        self.transitions = transitions
        self.events = events
        self._pending: list[tuple[str, dict[str, Any]]] = []

    def move(self, state: RunState, target: str, **details: Any) -> None:
        """Set ``state.status`` to ``target``; `InvalidTransitionError` (no change) if the
        table does not allow it. ``details`` (JSON values) go into the status event."""
        if not self.transitions.allows(state.status, target):
            raise InvalidTransitionError(
                state.status, target, self.transitions.allowed(state.status)
            )
        source, state.status = state.status, target
        payload = {"status": target, "from": source, "to": target, **details}
        self._pending.append((state.run_id, _traced(state, payload)))

    def cancel(self, state: RunState, reason: str | None) -> None:
        """Move to CANCELLED (through PAUSED when the table wants it) and say why."""
        if not self.transitions.allows(state.status, AgentStatus.CANCELLED):
            self.move(state, AgentStatus.PAUSED)
        self.move(state, AgentStatus.CANCELLED)
        state.cancel_requested = True
        state.metadata = {**state.metadata, "cancel_reason": reason or "cancelled"}

    async def publish(
        self, state: RunState, stream: str, kind: str, payload: dict[str, Any]
    ) -> None:
        """Publish an event of the run (after the queued status events), with its trace
        id and, when traced, ``span_id``: the span it happened in."""
        await self.flush()
        payload = _traced(state, {**payload, "turn": state.turn})
        await self.events.publish(state.run_id, stream, kind, payload)

    async def flush(self) -> None:
        """Publish the queued status events."""
        pending, self._pending = self._pending, []
        for run_id, payload in pending:
            await self.events.publish(run_id, "lifecycle", "status", payload)


def _traced(state: RunState, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with the run's trace id, and the span it happened in when traced."""
    payload["trace_id"] = state.trace.trace_id
    span_id = current_span_id()
    if span_id is not None:
        payload["span_id"] = span_id
    return payload
