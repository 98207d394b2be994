"""The typed errors statekeeper raises.

Every error says what went wrong and how to fix it. Driver errors (sqlite3, psycopg,
redis) are translated at the store boundary into the most specific type here, with the
original exception chained as ``__cause__``.

    StatekeeperError
    ├── InvalidInputError            bad input from the caller; nothing was written
    │   ├── InvalidIdError           an id that is empty, too long or could escape a path
    │   ├── InvalidPayloadError      not JSON (NaN, bytes, objects ...), or not the shape expected
    │   └── PayloadTooLargeError     over the store's size limit
    ├── NotFoundError                unknown session, entry or record (or another tenant's)
    ├── AlreadyExistsError           an id that is already taken
    ├── ConflictError                a stale version: someone else wrote first
    ├── InvalidTransitionError       a lifecycle transition the table does not allow
    ├── LimitReachedError            an iteration, budget, token or time limit was hit
    ├── SchemaVersionError           stored data is newer than this library
    ├── MissingExtraError            an optional dependency is not installed
    ├── SessionLockTimeoutError      a session lock stayed with another holder (also TimeoutError)
    ├── SessionLockLostError         a held session lock expired or lost its connection
    └── StoreError                   the backend failed; stored data is intact
        ├── StoreUnavailableError    cannot reach or open the store (retry later)
        ├── StoreReadOnlyError       the store refuses writes (permissions, read-only mode)
        ├── StoreFullError           no space left for the write
        └── StoreCorruptError        stored bytes cannot be decoded
            └── StateTamperedError   (codec) an encrypted state failed authentication
                └── WrongKeyError    (codec) encrypted with a key this codec does not have

Errors of one feature are defined beside it, under the bases above:
``runtime.lanes`` (LaneClearedError, LanesClosedError), ``runtime.followups``
(FollowupQueueFullError, FollowupQueueClosedError), ``runtime.events``
(UnknownEventKindError < InvalidInputError, SubscriberLaggedError, WaitTimeoutError),
``runtime.profiles`` (AllProfilesCoolingDownError), ``runtime.subagents``
(SubagentFinishedError < InvalidTransitionError), ``runs.handlers`` (HandlerError),
``runs.recovery`` (CheckpointCorruptError < StoreCorruptError).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyExistsError",
    "ConflictError",
    "InvalidIdError",
    "InvalidInputError",
    "InvalidPayloadError",
    "InvalidTransitionError",
    "LimitReachedError",
    "MissingExtraError",
    "NotFoundError",
    "PayloadTooLargeError",
    "SchemaVersionError",
    "SessionLockLostError",
    "SessionLockTimeoutError",
    "StatekeeperError",
    "StoreCorruptError",
    "StoreError",
    "StoreFullError",
    "StoreReadOnlyError",
    "StoreUnavailableError",
]


class StatekeeperError(Exception):
    """Base class of every error statekeeper raises on purpose."""


class InvalidInputError(StatekeeperError, ValueError):
    """The caller passed something statekeeper cannot accept; nothing was written."""


class InvalidIdError(InvalidInputError):
    """An id is empty, too long, or contains characters that could escape a path."""


class InvalidPayloadError(InvalidInputError):
    """A value is not plain JSON, or not the shape the operation expects."""


class PayloadTooLargeError(InvalidInputError):
    """A value is larger than the store's configured limit."""


class NotFoundError(StatekeeperError, LookupError):
    """The thing asked for does not exist for this tenant."""


class AlreadyExistsError(StatekeeperError):
    """An id is already taken."""


class ConflictError(StatekeeperError):
    """A compare-and-set failed: the stored version moved on since it was read.

    Re-read, re-apply the change and try again (see ``statekeeper.retry_on_conflict``).
    """

    def __init__(self, message: str, *, expected: int | None = None, actual: int | None = None):
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class InvalidTransitionError(StatekeeperError):
    """A lifecycle transition that the transition table does not allow."""

    def __init__(self, source: str, target: str, allowed: frozenset[str]):
        allowed_text = ", ".join(sorted(allowed)) or "none (terminal state)"
        super().__init__(
            f"cannot move from {source!r} to {target!r}; allowed from {source!r}: {allowed_text}"
        )
        self.source = source
        self.target = target
        self.allowed = allowed


class LimitReachedError(StatekeeperError):
    """A control flag reached its maximum.

    ``state`` may carry the run state at the moment the limit was hit (a run stopped,
    resumable, in PAUSED), so a caller can raise the limit and resume it; ``hint`` replaces
    the generic advice at the end of the message (the runner names the run and the call).
    """

    def __init__(
        self,
        name: str,
        current: float,
        maximum: float,
        *,
        state: Any = None,
        hint: str | None = None,
    ):
        advice = hint or "raise the limit and resume, or stop the run"
        super().__init__(f"{name} limit reached: {current:g} of {maximum:g}; {advice}")
        self.name = name
        self.current = current
        self.maximum = maximum
        self.state = state


class SchemaVersionError(StatekeeperError):
    """Stored data was written by a newer statekeeper (or is of an unknown version)."""


class MissingExtraError(StatekeeperError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, feature: str, extra: str):
        super().__init__(
            f"{feature} requires the {extra!r} extra. "
            f"Install it with: pip install 'statekeeper[{extra}]'"
        )
        self.extra = extra


class SessionLockTimeoutError(StatekeeperError, TimeoutError):
    """Another holder kept the session's lock for longer than the caller would wait;
    nothing was locked (see `statekeeper.runtime.SessionLocks`)."""

    def __init__(self, session_id: str, waited: float, detail: str = "") -> None:
        super().__init__(
            f"session {session_id!r} stayed locked by another holder for {waited:.1f}s"
            f"{detail}; wait longer, or retry later"
        )
        self.session_id = session_id
        self.waited = waited


class SessionLockLostError(StatekeeperError):
    """A session lock was lost (expired, taken over, its connection dropped) while held."""

    def __init__(self, session_id: str, detail: str = "") -> None:
        super().__init__(
            f"the lock on session {session_id!r} was lost{detail}; stop writing, and take "
            "the lock again to continue"
        )
        self.session_id = session_id


class StoreError(StatekeeperError):
    """The storage backend failed. Stored data is as it was before the operation."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached or opened right now; the operation can be retried."""


class StoreReadOnlyError(StoreError):
    """The store refuses writes (read-only file, mode or permissions)."""


class StoreFullError(StoreError):
    """The disk or the store's size limit is full."""


class StoreCorruptError(StoreError):
    """Stored bytes cannot be decoded. Valid data around them stays readable."""
