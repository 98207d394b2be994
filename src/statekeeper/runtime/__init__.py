"""Runtime coordination: lanes, follow-ups, the event bus, subagents, auth profiles, and
the protocols of cross-process session locks and event feeds (`coordination`)."""

from statekeeper.runtime.coordination import (
    EventFeed,
    EventNotice,
    HeldLock,
    SessionLockLostError,
    SessionLocks,
    SessionLockTimeoutError,
    feed_bus,
)
from statekeeper.runtime.events import (
    STREAM_KINDS,
    BusEvent,
    EventBus,
    RunSnapshot,
    SubscriberLaggedError,
    Subscription,
    UnknownEventKindError,
    WaitTimeoutError,
    check_event,
)
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
from statekeeper.runtime.profiles import (
    AllProfilesCoolingDownError,
    AuthProfile,
    AuthProfiles,
    resolve_secret,
)
from statekeeper.runtime.subagents import (
    Recovery,
    SubagentEntry,
    SubagentFinishedError,
    SubagentRegistry,
    SubagentStatus,
)

__all__ = [
    "STREAM_KINDS",
    "AllProfilesCoolingDownError",
    "AuthProfile",
    "AuthProfiles",
    "BusEvent",
    "CommandLanes",
    "DropPolicy",
    "DropReason",
    "EventBus",
    "EventFeed",
    "EventNotice",
    "FollowupMode",
    "FollowupQueue",
    "FollowupQueueClosedError",
    "FollowupQueueFullError",
    "HeldLock",
    "LaneClearedError",
    "LaneStats",
    "LanesClosedError",
    "Recovery",
    "RunSnapshot",
    "SessionLockLostError",
    "SessionLockTimeoutError",
    "SessionLocks",
    "SubagentEntry",
    "SubagentFinishedError",
    "SubagentRegistry",
    "SubagentStatus",
    "SubmitOutcome",
    "SubmitStatus",
    "SubscriberLaggedError",
    "Subscription",
    "UnknownEventKindError",
    "WaitInfo",
    "WaitTimeoutError",
    "check_event",
    "feed_bus",
    "resolve_secret",
]
