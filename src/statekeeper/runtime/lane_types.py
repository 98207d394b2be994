"""Command lane types: the errors lanes raise, what their callbacks and stats report,
and lane names. Pure (no I/O); the lanes themselves are in `statekeeper.runtime.lanes`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from statekeeper.errors import InvalidInputError, StatekeeperError

__all__ = [
    "DEFAULT_WARN_AFTER",
    "LANES_CLOSED_REASON",
    "MAX_LANE_NAME_LENGTH",
    "LaneClearedError",
    "LaneStats",
    "LanesClosedError",
    "WaitCallback",
    "WaitInfo",
    "closed_by_lanes",
    "validate_lane",
]

MAX_LANE_NAME_LENGTH = 200
DEFAULT_WARN_AFTER = 2.0
"""Seconds a task may wait to start before it counts as having waited too long."""
LANES_CLOSED_REASON = "lane closed"
"""The message of the cancellation `CommandLanes.close(cancel=True)` sends a running task,
and the reason a run cancelled that way is stored with."""


class LaneClearedError(StatekeeperError):
    """The task's lane was cleared (`CommandLanes.clear`) before the task started."""

    def __init__(self, lane: str) -> None:
        super().__init__(
            f"lane {lane!r} was cleared before this task started; submit it again if it is "
            "still needed"
        )
        self.lane = lane


class LanesClosedError(StatekeeperError):
    """The lanes are closed: new work is refused, and queued work may have been dropped."""

    def __init__(self, detail: str = "the command lanes are closed") -> None:
        super().__init__(f"{detail}; create a new CommandLanes to run more work")


@dataclass(frozen=True, slots=True)
class WaitInfo:
    """What the wait callback gets when a task started later than its threshold."""

    lane: str
    waited: float
    """Seconds between enqueueing and starting."""
    ahead: int
    """Tasks queued (not yet started) ahead of it when it was enqueued."""
    running: int
    """Tasks of the lane that were running when it was enqueued."""


WaitCallback = Callable[[WaitInfo], object]


@dataclass(frozen=True, slots=True)
class LaneStats:
    """Counters of one lane, or of all lanes together (forgotten lanes included).

    ``cancelled`` counts tasks withdrawn or cancelled by their caller, cleared, or dropped
    at close; ``waited`` counts tasks that started later than their wait threshold, and
    ``max_wait`` is the longest wait before a start, in seconds.
    """

    queued: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    waited: int = 0
    max_wait: float = 0.0


def closed_by_lanes(exc: BaseException) -> bool:
    """Whether ``exc`` is the cancellation `CommandLanes.close(cancel=True)` sent the
    running task: a task that catches it can record why it stopped (then re-raise it)."""
    return isinstance(exc, asyncio.CancelledError) and exc.args[:1] == (LANES_CLOSED_REASON,)


def validate_lane(name: object) -> str:
    """Return ``name`` if it is a valid lane name, else raise `InvalidInputError`."""
    if isinstance(name, str) and 0 < len(name) <= MAX_LANE_NAME_LENGTH and name.isprintable():
        return name
    raise InvalidInputError(
        f"invalid lane name {repr(name)[:60]}: use 1 to {MAX_LANE_NAME_LENGTH} printable "
        "characters, e.g. 'main' or 'session:<id>'"
    )
