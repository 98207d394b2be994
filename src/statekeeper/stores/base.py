"""The store protocol: what every backend implements, and the records it stores.

A store keeps four kinds of data, each scoped to a tenant (a user id) so that another
tenant's data is invisible rather than merely forbidden:

- **sessions**: a small head record per conversation, updated with compare-and-set on
  ``version``;
- **transcript entries**: an append-only, per-session log; an entry is written once and
  never rewritten; ``parent_seq`` links make the log a DAG, and the session's
  ``head_seq`` names the tip of the active branch;
- **versioned records**: namespaced JSON values with compare-and-set (registries,
  profiles, run heads, key-value state);
- **event logs**: per-owner logs with gap-free, monotonic sequence numbers.

The rules every backend follows live in pure functions in `statekeeper.stores.rules`
(`plan_append`, `apply_patch`, ...), so the backends only do I/O. The conformance suite in
``tests/conformance`` proves each backend keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from types import TracebackType
from typing import Any, Literal, NamedTuple, Protocol, Self, get_args, runtime_checkable

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    InvalidInputError,
)
from statekeeper.ids import new_id, validate_id

__all__ = [
    "AppendResult",
    "ClosingStore",
    "DeliveryContext",
    "Durability",
    "Entry",
    "EntryDraft",
    "EntryKind",
    "Event",
    "EventDraft",
    "EventLogStore",
    "ForkPoint",
    "Page",
    "RecordStore",
    "SessionPatch",
    "SessionQuery",
    "SessionRecord",
    "SessionStore",
    "Store",
    "TranscriptStore",
    "VersionedRecord",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Durability(StrEnum):
    """What an acknowledged write survives."""

    POWER = "power"
    """A power loss or OS crash: data is fsynced before the write returns (the default)."""
    PROCESS = "process"
    """A crash of the process only; the OS may lose the last writes on power loss."""


# -- records ------------------------------------------------------------------------------


class DeliveryContext(BaseModel):
    """Where a conversation's replies go: the channel and the sender it came from."""

    model_config = _FROZEN
    channel: str | None = None
    sender: str | None = None
    extra: dict[str, JsonValue] = Field(default_factory=dict)


class ForkPoint(BaseModel):
    """Where a forked session's history starts: an entry of another session."""

    model_config = _FROZEN
    session_id: str
    seq: int = Field(ge=0)


class SessionRecord(BaseModel):
    """The head record of a session. Small; updated with compare-and-set on ``version``.

    ``head_seq`` is the tip of the active branch (0: empty), ``last_seq`` the highest
    sequence number used. ``fresh_tokens`` counts the tokens of the active view (what the
    next model call would see before packing); ``total_tokens`` every token ever added.
    """

    model_config = _FROZEN

    id: str
    tenant: str
    agent_id: str | None = None
    title: str | None = None
    created_at: AwareDatetime = Field(default_factory=utcnow)
    last_active: AwareDatetime = Field(default_factory=utcnow)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    model_override: str | None = None
    thinking_level: str | None = None
    total_tokens: int = 0
    fresh_tokens: int = 0
    message_count: int = 0
    compaction_count: int = 0
    delivery: DeliveryContext | None = None
    continued_from: str | None = None
    continued_to: str | None = None
    continuation_index: int = 0
    forked_from: ForkPoint | None = None
    state: dict[str, JsonValue] = Field(default_factory=dict)
    head_seq: int = 0
    last_seq: int = 0
    version: int = 0

    def to_doc(self) -> dict[str, Any]:
        """JSON data of the record (what backends store)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> SessionRecord:
        """Validate a stored record."""
        return cls.model_validate(doc)


_PATCHABLE = frozenset(
    {
        "agent_id",
        "title",
        "metadata",
        "model_override",
        "thinking_level",
        "fresh_tokens",
        "delivery",
        "continued_from",
        "continued_to",
        "continuation_index",
        "state",
        "head_seq",
    }
)
Counter = Literal["total_tokens", "fresh_tokens", "message_count", "compaction_count"]


class SessionPatch(BaseModel):
    """A change to a session head: fields to set, and counters to add to atomically."""

    model_config = _FROZEN
    set: dict[str, Any] = Field(default_factory=dict)
    add: dict[Counter, int] = Field(default_factory=dict)

    def __init__(self, **data: Any) -> None:
        # Checked before pydantic runs, so callers get statekeeper's error type.
        unknown = set(data.get("set") or {}) - _PATCHABLE
        unknown_counters = set(data.get("add") or {}) - set(get_args(Counter))
        if unknown or unknown_counters:
            raise InvalidInputError(
                f"cannot set session field(s) {sorted(unknown | unknown_counters)}; "
                f"settable: {sorted(_PATCHABLE)}; counters: {sorted(get_args(Counter))}"
            )
        super().__init__(**data)


class EntryKind(StrEnum):
    """What a transcript entry holds. Other strings are allowed for custom entries."""

    MESSAGE = "message"
    COMPACTION = "compaction"
    MARKER = "marker"
    STATE = "state"
    CORRUPT = "corrupt"


class Entry(NamedTuple):
    """One stored transcript entry. Never rewritten once written.

    ``kind == "corrupt"`` marks a stored row that could not be decoded: its payload
    holds the error and the start of the raw text, so it is reported, never skipped.
    (A named tuple: reading 10,000 entries makes 10,000 of them.)
    """

    seq: int
    id: str
    parent_seq: int | None
    kind: str
    created_at: datetime
    payload: dict[str, Any]


class EntryDraft(BaseModel):
    """An entry to append. ``parent`` is "head" (the active tip), a seq, or None (a root).

    A ``side`` entry (a run checkpoint, say) hangs off the branch: its parent is the tip
    when it is written, but it never becomes the head and nothing chains onto it, so it
    is never part of a branch and can be pruned later.
    """

    model_config = _FROZEN
    id: str = Field(default_factory=lambda: new_id("ent"))
    kind: str = EntryKind.MESSAGE
    payload: dict[str, Any]
    parent: Literal["head"] | int | None = "head"
    side: bool = False
    created_at: AwareDatetime = Field(default_factory=utcnow)


class AppendResult(BaseModel):
    """What an append wrote (or found already written), and the session after it."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    session: SessionRecord
    entries: list[Entry]
    replayed: bool = False
    """True when every draft was already stored identically (an idempotent retry)."""


class SessionQuery(BaseModel):
    """Filters and paging for listing sessions (newest activity first)."""

    model_config = _FROZEN
    limit: int = Field(default=50, ge=1, le=1000)
    cursor: str | None = None
    offset: int = Field(default=0, ge=0)
    agent_id: str | None = None
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    """Equality on top-level metadata keys; values are JSON scalars."""
    active_after: AwareDatetime | None = None
    active_before: AwareDatetime | None = None

    def __init__(self, **data: Any) -> None:
        for key, value in (data.get("metadata") or {}).items():
            validate_id(key, "metadata filter key")
            if isinstance(value, dict | list) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise InvalidInputError(
                    f"metadata filter {key!r} must be a string, number, boolean or null"
                )
        super().__init__(**data)


class Page(BaseModel):
    """One page of a listing; pass ``next_cursor`` back to get the next one."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    items: list[SessionRecord]
    next_cursor: str | None = None


class VersionedRecord(BaseModel):
    """A namespaced JSON value with a version for compare-and-set."""

    model_config = _FROZEN
    namespace: str
    key: str
    value: JsonValue
    version: int
    updated_at: datetime
    expires_at: datetime | None = None


class EventDraft(BaseModel):
    """An event to append to a log."""

    model_config = _FROZEN
    stream: str
    kind: str
    payload: dict[str, Any] = Field(default_factory=dict)
    ts: AwareDatetime = Field(default_factory=utcnow)


@dataclass(frozen=True, slots=True)
class Event:
    """A stored event: ``seq`` is per log, starts at 1 and has no gaps."""

    log_id: str
    seq: int
    stream: str
    kind: str
    ts: datetime
    payload: dict[str, Any]


# -- the protocol ------------------------------------------------------------------------


@runtime_checkable
class SessionStore(Protocol):
    """Session head records."""

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        """Store a new session (version 1). `AlreadyExistsError` if the id is taken."""
        ...

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        """The session, or `NotFoundError`."""
        ...

    async def update_session(
        self,
        tenant: str,
        session_id: str,
        patch: SessionPatch,
        *,
        expected_version: int | None = None,
    ) -> SessionRecord:
        """Apply ``patch``; `ConflictError` if ``expected_version`` is stale."""
        ...

    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        """A page of the tenant's sessions, most recently active first."""
        ...

    async def delete_session(self, tenant: str, session_id: str) -> None:
        """Delete the session and all its entries. `NotFoundError` if absent."""
        ...


@runtime_checkable
class TranscriptStore(Protocol):
    """Append-only transcript entries, per session."""

    async def append_entries(
        self,
        tenant: str,
        session_id: str,
        drafts: Sequence[EntryDraft],
        *,
        expected_version: int | None = None,
        patch: SessionPatch | None = None,
        move_head: bool = True,
    ) -> AppendResult:
        """Append all drafts and update the head atomically (all or nothing).

        Drafts whose id is already stored with the same content are not written again
        (idempotent retries); the same id with other content is a `ConflictError`.
        """
        ...

    async def read_entries(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        """Entries with ``after_seq < seq <= until_seq`` in seq order."""
        ...

    async def get_entry(self, tenant: str, session_id: str, entry_id: str) -> Entry:
        """One entry by id, or `NotFoundError`."""
        ...

    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        """Delete entries of ``kind`` (ids starting ``id_prefix``) with ``seq < before_seq``.

        The head and every parent of another entry are kept, so no branch is broken.
        Returns how many were deleted.
        """
        ...


@runtime_checkable
class RecordStore(Protocol):
    """Namespaced, versioned JSON records."""

    async def get_record(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        """The record, or `NotFoundError` (also when expired)."""
        ...

    async def put_record(
        self,
        tenant: str,
        namespace: str,
        key: str,
        value: JsonValue,
        *,
        expected_version: int | None = None,
        expires_at: datetime | None = None,
    ) -> VersionedRecord:
        """Write a record. ``expected_version`` 0 means "must not exist yet"."""
        ...

    async def list_records(
        self,
        tenant: str,
        namespace: str,
        *,
        prefix: str = "",
        after_key: str | None = None,
        limit: int = 100,
    ) -> list[VersionedRecord]:
        """Live records of a namespace in key order."""
        ...

    async def delete_record(
        self, tenant: str, namespace: str, key: str, *, expected_version: int | None = None
    ) -> None:
        """Delete a record; `NotFoundError` if absent."""
        ...


@runtime_checkable
class EventLogStore(Protocol):
    """Per-owner event logs with gap-free sequence numbers."""

    async def append_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft]
    ) -> list[Event]:
        """Append events atomically; they get the next sequence numbers."""
        ...

    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        """Events with ``seq > after_seq`` in order."""
        ...

    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        """Delete a whole log (no error if it is empty)."""
        ...


@runtime_checkable
class Store(SessionStore, TranscriptStore, RecordStore, EventLogStore, Protocol):
    """Everything a backend implements. Open one with `statekeeper.open_store`.

    A store is an async context manager: ``async with await open_store(url) as store``
    (or ``async with open_store(url) as store``) closes it on the way out.
    """

    url: str

    async def close(self) -> None:
        """Release connections and threads. Idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class ClosingStore:
    """Mixin for backends: ``async with store:`` closes the store on the way out."""

    async def close(self) -> None:
        raise NotImplementedError  # every backend defines its own

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
