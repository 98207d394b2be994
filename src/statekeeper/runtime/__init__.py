"""Runtime coordination: command lanes and follow-up queues."""

from statekeeper.runtime.lanes import (
    CommandLanes,
    LaneClearedError,
    LanesClosedError,
    LaneStats,
    WaitInfo,
)

__all__ = [
    "CommandLanes",
    "LaneClearedError",
    "LaneStats",
    "LanesClosedError",
    "WaitInfo",
]
