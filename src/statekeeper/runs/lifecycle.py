"""`RunLifecycle`: moves runs through their transition table and reports what happens."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from statekeeper.core.lifecycle import AgentStatus, TransitionTable
from statekeeper.errors import InvalidTransitionError
from statekeeper.runs.results import EventSink
from statekeeper.runs.state import RunState
from statekeeper.runtime.events import EventBus
from statekeeper.stores.base import Event, EventBatch
from statekeeper.tracing import TracedStore, current_span_id

__all__ = ["FINISHED", "RunLifecycle"]

FINISHED = frozenset({AgentStatus.COMPLETED, AgentStatus.CANCELLED, AgentStatus.ERROR})
"""Statuses a run never leaves (the runner publishes ``lifecycle/end`` on reaching one)."""

_Queued = tuple[str, str, str, dict[str, Any]]  # run id, stream, kind, payload


class RunLifecycle:
    """Status moves checked against ``transitions``, and the run events for ``events``.

    A move is synchronous (it only changes the state in memory); its ``status`` event is
    queued and published before the next event, or by `flush`, so subscribers see status
    changes in the order they happened and interleaved correctly with the rest. An event
    published with ``hold=True`` waits in the same queue; `publish_with` logs the run's
    queued events in the run's next checkpoint append (one transaction for both). One
    published with ``ahead=True`` (and the run's queued ones before it) reaches this
    process's subscribers at once and is logged by that append too
    (`EventBus.publish_ahead`).
    """

    def __init__(self, transitions: TransitionTable, events: EventSink) -> None:
        self.transitions = transitions
        self.events = events
        self._pending: list[_Queued] = []

    def move(self, state: RunState, target: str, **details: Any) -> None:
        """Set ``state.status`` to ``target``; `InvalidTransitionError` (no change) if the
        table does not allow it. ``details`` (JSON values) go into the status event."""
        if not self.transitions.allows(state.status, target):
            raise InvalidTransitionError(
                state.status, target, self.transitions.allowed(state.status)
            )
        source, state.status = state.status, target
        payload = {"status": target, "from": source, "to": target, **details}
        self._pending.append((state.run_id, "lifecycle", "status", _traced(state, payload)))

    def cancel(self, state: RunState, reason: str | None) -> None:
        """Move to CANCELLED (through PAUSED when the table wants it) and say why."""
        if not self.transitions.allows(state.status, AgentStatus.CANCELLED):
            self.move(state, AgentStatus.PAUSED)
        self.move(state, AgentStatus.CANCELLED)
        state.cancel_requested = True
        state.metadata = {**state.metadata, "cancel_reason": reason or "cancelled"}

    async def publish(
        self,
        state: RunState,
        stream: str,
        kind: str,
        payload: dict[str, Any],
        *,
        hold: bool = False,
        ahead: bool = False,
    ) -> None:
        """Publish an event of the run (after the queued events), with its trace id and,
        when traced, ``span_id``: the span it happened in.

        ``hold`` queues it instead, to go with the run's next checkpoint (`publish_with`)
        or the next event published, whichever comes first: for an event that describes
        the step being written (what the agent said), not one a watcher waits for live.
        ``ahead`` fans it out at once and logs it with the next checkpoint (for an event
        a watcher waits for live, when the sink is an `EventBus`; else it is published).
        """
        payload = _traced(state, {**payload, "turn": state.turn})
        if hold:
            self._pending.append((state.run_id, stream, kind, payload))
            return
        if ahead and isinstance(self.events, EventBus):
            for _, queued_stream, queued_kind, queued in self._take(state.run_id):
                await self.events.publish_ahead(state.run_id, queued_stream, queued_kind, queued)
            await self.events.publish_ahead(state.run_id, stream, kind, payload)
            return
        await self.flush()
        await self.events.publish(state.run_id, stream, kind, payload)

    async def flush(self) -> None:
        """Publish the queued events."""
        pending, self._pending = self._pending, []
        for run_id, stream, kind, payload in pending:
            await self.events.publish(run_id, stream, kind, payload)

    async def settle(self, state: RunState) -> None:
        """Publish the queued events, and log the run's events published ahead."""
        await self.flush()
        if isinstance(self.events, EventBus):
            await self.events.flush_ahead(state.run_id)

    def joins(self, store: object, tenant: str) -> bool:
        """Whether the run's events can be logged by an append to ``store`` for
        ``tenant``: the sink is an `EventBus` logging there."""
        bus = self.events
        return isinstance(bus, EventBus) and bus.tenant == tenant and _same(bus.store, store)

    def _take(self, run_id: str) -> list[_Queued]:
        """The run's queued events, out of the queue (other runs' stay)."""
        mine = [queued for queued in self._pending if queued[0] == run_id]
        self._pending = [queued for queued in self._pending if queued[0] != run_id]
        return mine

    async def publish_with(
        self,
        state: RunState,
        store: object,
        tenant: str,
        write: Callable[[EventBatch | None], Awaitable[Sequence[Event]]],
    ) -> None:
        """Run ``write`` (an append to ``store`` for ``tenant``) with the run's queued
        events in it, when the sink is an `EventBus` logging to that store and tenant
        (`EventBus.publish_with`); otherwise publish them first and ``write(None)``."""
        bus = self.events
        if not isinstance(bus, EventBus) or not self.joins(store, tenant):
            await self.flush()
            await write(None)
            return
        # Other runs' queued events wait for their own runs' next write or publish.
        mine = [(s, k, p) for _, s, k, p in self._take(state.run_id)]
        await bus.publish_with(state.run_id, mine, write)


def _same(a: object, b: object) -> bool:
    """Whether two stores are one (a traced store logs what the store it traces does)."""
    a = a.wrapped if isinstance(a, TracedStore) else a
    b = b.wrapped if isinstance(b, TracedStore) else b
    return a is b


def _traced(state: RunState, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with the run's trace id, and the span it happened in when traced."""
    payload["trace_id"] = state.trace.trace_id
    span_id = current_span_id()
    if span_id is not None:
        payload["span_id"] = span_id
    return payload
