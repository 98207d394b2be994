"""Follow-up queue types: modes, drop policies, what `FollowupQueue.submit` reports, and
the queue's errors. Pure (no I/O); the queue is in `statekeeper.runtime.followups`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError, StatekeeperError

__all__ = [
    "DropPolicy",
    "DropReason",
    "ErrorCallback",
    "FollowupMode",
    "FollowupQueueClosedError",
    "FollowupQueueFullError",
    "StartRun",
    "SubmitOutcome",
    "SubmitStatus",
    "parse_choice",
]

StartRun = Callable[[str, Message], Awaitable[object]]
"""``start_run(session_id, message)``: run the agent on the session with that message."""
ErrorCallback = Callable[[str, Message, Exception], object]
"""``on_error(session_id, message, error)``: a run started by the drain failed."""


class FollowupMode(StrEnum):
    """What a follow-up does when a run is active for its session."""

    STEER = "steer"
    """Join the active run at its next step (`FollowupQueue.take_steering`)."""
    QUEUE = "queue"
    """Wait for the active run to end, then become a run of its own."""


class DropPolicy(StrEnum):
    """What to do with a new follow-up when ``max_pending`` are already pending."""

    OLDEST = "oldest"
    NEWEST = "newest"
    REJECT = "reject"


class SubmitStatus(StrEnum):
    """What `FollowupQueue.submit` did with a message."""

    STARTED = "started"
    """The session was idle: a run was started with it."""
    STEERED = "steered"
    """Pending for the active run to take at its next step."""
    QUEUED = "queued"
    """Pending until the active run ends; then it is a run of its own."""
    DEDUPLICATED = "deduplicated"
    """The same message was already pending: dropped."""
    DROPPED = "dropped"
    """Dropped: see the outcome's ``reason``."""


class DropReason(StrEnum):
    """Why a follow-up was dropped."""

    DUPLICATE = "duplicate"
    TOO_FAST = "too_fast"
    QUEUE_FULL = "queue_full"


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """The result of `FollowupQueue.submit`."""

    status: SubmitStatus
    session_id: str
    message: Message
    mode: FollowupMode
    """The mode the message was handled in."""
    reason: DropReason | None = None
    """Why it was not accepted (DEDUPLICATED and DROPPED only)."""
    evicted: Message | None = None
    """The oldest pending follow-up, dropped to make room (policy ``oldest``)."""
    pending: int = 0
    """Follow-ups pending for the session after this call."""

    @property
    def accepted(self) -> bool:
        """True if the message will reach a run."""
        return self.reason is None


class FollowupQueueFullError(StatekeeperError):
    """A session already has ``max_pending`` follow-ups and the drop policy is ``reject``."""

    def __init__(self, session_id: str, max_pending: int) -> None:
        super().__init__(
            f"session {session_id!r} already has {max_pending} pending follow-ups; "
            "retry after the active run ends, or raise max_pending"
        )
        self.session_id = session_id
        self.max_pending = max_pending


class FollowupQueueClosedError(StatekeeperError):
    """The follow-up queue is closed and accepts no new messages."""

    def __init__(self) -> None:
        super().__init__("the follow-up queue is closed; create a new FollowupQueue")


_E = TypeVar("_E", bound=StrEnum)


def parse_choice(kind: type[_E], value: _E | str, what: str) -> _E:
    """``value`` as a member of ``kind``, or `InvalidInputError` naming the choices."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise InvalidInputError(f"{what} must be one of {allowed}; got {value!r}") from None
