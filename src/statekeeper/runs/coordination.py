"""`Coordination`: how a runner shares sessions and runs with others.

events          where run events go (default: an `EventBus` on the runner's store)
lanes           in-process lanes: one run per session at a time (``session:<id>``)
session_locks   the same rule across processes and machines (`SessionLocks`)
followups       messages arriving mid-run steer it at its next step
subagents       delegated runs are registered, marked paused and running again as they
                stop and resume, and settled when they end
owner           this runner's lease owner id (default ``host:pid:<random>``)
lease_ttl       seconds a run's lease lasts without a write renewing it
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError, NotFoundError
from statekeeper.ids import new_id
from statekeeper.runs.agent import RateLimited
from statekeeper.runs.lifecycle import FINISHED
from statekeeper.runs.limiting import reached
from statekeeper.runs.results import EventSink, SessionLocks
from statekeeper.runs.state import RunState
from statekeeper.runtime.followups import FollowupQueue
from statekeeper.runtime.lanes import CommandLanes
from statekeeper.runtime.subagents import SubagentFinishedError, SubagentRegistry

__all__ = ["Coordination"]

T = TypeVar("T")


def _default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{new_id()[-6:]}"


@dataclass(frozen=True)
class Coordination:
    """Lanes, locks, follow-ups, the subagent registry, the event sink and the lease.

    Every part is optional; see the module docstring.
    """

    events: EventSink | None = None
    lanes: CommandLanes | None = None
    session_locks: SessionLocks | None = None
    followups: FollowupQueue | None = None
    subagents: SubagentRegistry | None = None
    owner: str = field(default_factory=_default_owner)
    lease_ttl: float = 300.0

    def __post_init__(self) -> None:
        if not self.lease_ttl > 0:
            raise InvalidInputError(f"lease_ttl must be > 0 seconds, got {self.lease_ttl!r}")

    async def exclusive(self, tenant: str, state: RunState, body: Callable[[], Awaitable[T]]) -> T:
        """Run ``body`` as the only run of the state's session: in its lane, holding the
        cross-process session lock, marked active for follow-ups (each if configured)."""

        async def locked() -> T:
            if self.session_locks is None:
                return await followed()
            async with self.session_locks.hold(tenant, state.session_id):
                return await followed()

        async def followed() -> T:
            if self.followups is None:
                return await body()
            with self.followups.active(state.session_id, state.run_id):
                return await body()

        if self.lanes is None:
            return await locked()
        return await self.lanes.run(f"session:{state.session_id}", locked)

    def steering(self, session_id: str) -> list[Message]:
        """Follow-ups that arrived for the session since the last step (and are taken)."""
        return [] if self.followups is None else self.followups.take_steering(session_id)

    async def register_child(
        self, run_id: str, *, child_session_id: str, requester_session_id: str, task: str
    ) -> None:
        """Register a delegated run with the subagent registry, if there is one."""
        if self.subagents is not None:
            await self.subagents.register(
                run_id,
                child_session_id=child_session_id,
                requester_session_id=requester_session_id,
                task=task,
            )

    async def settle_child(self, state: RunState) -> None:
        """Mark a finished delegated run's registry entry completed or failed."""
        if self.subagents is None or state.delegation is None:
            return
        try:
            if state.status == AgentStatus.COMPLETED:
                output = state.output
                outcome = output if isinstance(output, str) else json.dumps(output)
                await self.subagents.complete(state.run_id, outcome)
            else:
                why = state.metadata.get("cancel_reason")  # a cancelled run says why
                reason = state.error.message if state.error else str(state.status)
                reason += f": {why}" if why and state.error is None else ""
                await self.subagents.fail(state.run_id, reason)
        except (NotFoundError, SubagentFinishedError):
            pass  # not registered here, or already settled (killed, say)

    async def track_child(self, state: RunState) -> None:
        """Bring a delegated run's registry entry up to its stored state (one no process
        is driving): settled if it ended, paused if it stopped resumable."""
        if state.status in FINISHED:
            await self.settle_child(state)
        elif state.status != AgentStatus.RUNNING:
            await self.pause_child(state)

    async def pause_child(self, state: RunState) -> None:
        """Mark a stopped, resumable delegated run's registry entry paused, saying why."""
        if self.subagents is None or state.delegation is None:
            return
        # Not registered here, or settled meanwhile (killed, say): nothing to mark.
        with contextlib.suppress(NotFoundError, SubagentFinishedError):
            await self.subagents.pause(state.run_id, pause_reason(state))

    async def resume_child(self, state: RunState) -> None:
        """Mark a delegated run's registry entry running again (it is being driven)."""
        if self.subagents is None or state.delegation is None:
            return
        with contextlib.suppress(NotFoundError, SubagentFinishedError):
            await self.subagents.resume(state.run_id)


def pause_reason(state: RunState) -> str:
    """Why a stopped run that is not finished stopped: the limit it reached, a rate
    limit, the input or approval it waits for."""
    if state.status == AgentStatus.WAITING_FOR_INPUT:
        return "waiting for input"
    if state.status == AgentStatus.WAITING_FOR_APPROVAL:
        return "waiting for approval"
    found = reached(state.limits)
    if found is not None:
        flag = found[1]
        return f"{flag.name} limit reached: {flag.current:g} of {flag.maximum or 0:g}"
    if state.error is not None and state.error.type == RateLimited.__name__:
        return f"rate limited: {state.error.message}"
    return str(state.status)
