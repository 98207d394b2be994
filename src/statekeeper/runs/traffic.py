"""`TrafficControlState`: OpenHands' deprecated rate-limiting states, derived from a run.

Code ported from OpenHands reads ``state.traffic_control_state``; here it is read-only and
derived, never stored: a run paused because its model calls were rate limited (every
auth profile cooling down) is ``THROTTLING``, any other paused run ``PAUSED``, and every
other run ``NORMAL``. Set a run's course with its status and limits instead.
"""

from __future__ import annotations

from enum import StrEnum

from statekeeper.core.lifecycle import AgentStatus
from statekeeper.runs.agent import RateLimited
from statekeeper.runs.state import RunState

__all__ = ["TrafficControlState", "traffic_control_state"]

RATE_LIMITED = RateLimited.__name__
"""The ``error.type`` of a run paused because its model calls were rate limited."""


class TrafficControlState(StrEnum):
    """OpenHands' ``TrafficControlState`` (deprecated there), for ported code."""

    NORMAL = "normal"
    THROTTLING = "throttling"
    PAUSED = "paused"


def traffic_control_state(state: RunState) -> TrafficControlState:
    """The `TrafficControlState` a run's state amounts to (see the module docstring)."""
    if state.status != AgentStatus.PAUSED:
        return TrafficControlState.NORMAL
    if state.error is not None and state.error.type == RATE_LIMITED:
        return TrafficControlState.THROTTLING
    return TrafficControlState.PAUSED
