"""Runtime coordination: command lanes and follow-up queues."""

from statekeeper.runtime.followups import (
    DropPolicy,
    DropReason,
    FollowupMode,
    FollowupQueue,
    FollowupQueueClosedError,
    FollowupQueueFullError,
    SubmitOutcome,
    SubmitStatus,
)
from statekeeper.runtime.lanes import (
    CommandLanes,
    LaneClearedError,
    LanesClosedError,
    LaneStats,
    WaitInfo,
)

__all__ = [
    "CommandLanes",
    "DropPolicy",
    "DropReason",
    "FollowupMode",
    "FollowupQueue",
    "FollowupQueueClosedError",
    "FollowupQueueFullError",
    "LaneClearedError",
    "LaneStats",
    "LanesClosedError",
    "SubmitOutcome",
    "SubmitStatus",
    "WaitInfo",
]
