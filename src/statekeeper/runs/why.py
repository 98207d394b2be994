"""Why a run is not going: the one line an operator needs beside its status.

`why_stopped` reads a run's index and state (nothing else) and names the cause: the
decision or input it waits for, the limit it reached and by how much, the rate limit and
until when, the lane that was cleared or closed before its turn, a process that went
away mid-run (a crash), a cancel, an error, or a start that never got to its first
checkpoint. The CLI (``runs show`` / ``runs list``), the server (``stopped`` in a run's
JSON) and the control UI show the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.core.limits import ControlFlag
from statekeeper.runs.agent import RateLimited
from statekeeper.runs.approvals import settle
from statekeeper.runs.index import RunIndex, held
from statekeeper.runs.state import RunState
from statekeeper.runtime.lane_types import LaneClearedError, LanesClosedError

__all__ = ["LANE_ERRORS", "PAUSE_REASONS", "StopKind", "StopReason", "why_stopped"]

StopKind = Literal[
    "approval",
    "input",
    "limit",
    "rate_limited",
    "lane",
    "crashed",
    "failed_to_start",
    "cancelled",
    "error",
    "paused",
]

LANE_ERRORS = (LaneClearedError, LanesClosedError)
"""Why a run's turn in its lane never came: kept as its ``error`` (the type's name) while
it is paused (see `RunLoop.drive`)."""
PAUSE_REASONS = frozenset({RateLimited.__name__, *(kind.__name__ for kind in LANE_ERRORS)})
"""``error.type`` values that explain a pause, cleared when the run goes on."""


@dataclass(frozen=True)
class StopReason:
    """Why a run stopped: a ``kind`` to act on and a ``text`` to show a person.

    ``limit`` / ``current`` / ``maximum`` name a reached limit; ``until`` is when a rate
    limit lifts (None: unknown)."""

    kind: StopKind
    text: str
    limit: str | None = None
    current: float | None = None
    maximum: float | None = None
    until: datetime | None = None

    def to_dict(self) -> dict[str, object]:
        """The reason as JSON data (``until`` as ISO 8601)."""
        return {
            "kind": self.kind,
            "text": self.text,
            "limit": self.limit,
            "current": self.current,
            "maximum": self.maximum,
            "until": None if self.until is None else self.until.isoformat(),
        }


def why_stopped(index: RunIndex, state: RunState | None) -> StopReason | None:
    """Why the run is not going, or None while it runs (or after it completed)."""
    if index.failed_to_start:
        return StopReason(
            "failed_to_start",
            "failed to start: its process stopped before the first checkpoint; "
            "cancel or delete it, or start it again",
        )
    status = state.status if state is not None else index.status
    if status == AgentStatus.COMPLETED:
        return None
    if status == AgentStatus.RUNNING:
        if held(index):
            return None
        return StopReason(
            "crashed",
            "stopped mid-run: the process driving it went away (a crash or a kill); "
            "resume it to go on from its last checkpoint",
        )
    if state is None:
        return None if status == AgentStatus.INITIALIZING else StopReason("paused", status)
    return _from_state(state, status)


def _from_state(state: RunState, status: str) -> StopReason | None:
    error = state.error
    if status == AgentStatus.WAITING_FOR_APPROVAL:
        pending = settle(state).pending
        calls = ", ".join(f"{c.tool} ({c.call_id})" for c in pending) or "a tool call"
        return StopReason("approval", f"waits for a decision on {calls}")
    if status == AgentStatus.WAITING_FOR_INPUT:
        return StopReason("input", "waits for input: the agent's question is its last message")
    if status == AgentStatus.CANCELLED:
        why = state.metadata.get("cancel_reason")
        return StopReason("cancelled", f"cancelled: {why}" if why else "cancelled")
    if status == AgentStatus.ERROR:
        text = f"{error.type}: {error.message}" if error else "failed"
        return StopReason("error", text)
    if status != AgentStatus.PAUSED:
        return None
    if error is not None and error.type == RateLimited.__name__:
        until = _when(error.data.get("available_at"))
        after = f" until {until:%Y-%m-%d %H:%M:%S} UTC" if until else ""
        return StopReason("rate_limited", f"rate limited{after}: {error.message}", until=until)
    if error is not None and error.type in PAUSE_REASONS:
        return StopReason("lane", f"its turn never came: {error.message}; resume it")
    reached = state.limits.reached()
    if reached:
        return _limit(reached[0])
    return StopReason("paused", "paused; resume it to go on")


def _limit(flag: ControlFlag) -> StopReason:
    maximum = flag.maximum if flag.maximum is not None else 0.0
    over = flag.current - maximum
    used = f"{_amount(flag, flag.current)} of {_amount(flag, maximum)}"
    extra = f", over by {_amount(flag, over)}" if over > 0 else ""
    return StopReason(
        "limit",
        f"{flag.name} limit reached: {used}{extra}; raise it to go on",
        limit=flag.name,
        current=flag.current,
        maximum=maximum,
    )


def _amount(flag: ControlFlag, value: float) -> str:
    if flag.name == "budget":
        return f"${value:.4f}"
    if flag.integral or float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}"


def _when(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
