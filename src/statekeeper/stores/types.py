"""The records a store keeps and the values its methods take and return.

Pure data (pydantic models, named tuples), no I/O: `statekeeper.stores.base` states the
protocol over them and re-exports them all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, NamedTuple, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.core.typed import TypedModel
from statekeeper.errors import InvalidInputError
from statekeeper.ids import new_id, validate_id

__all__ = [
    "AppendResult",
    "CorruptItem",
    "DeliveryContext",
    "Durability",
    "Entry",
    "EntryDraft",
    "EntryKind",
    "Event",
    "EventBatch",
    "EventDraft",
    "EventNotice",
    "ForkPoint",
    "Page",
    "RecordList",
    "SessionPatch",
    "SessionQuery",
    "SessionRecord",
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


class EntryDraft(TypedModel):
    """An entry to append. ``parent`` is "head" (the active tip), a seq, or None (a root).

    A ``side`` entry (a run checkpoint, say) hangs off the branch: its parent is the tip
    when it is written, but it never becomes the head and nothing chains onto it, so it
    is never part of a branch and can be pruned later. A bad field (a time without a
    zone, say) is an `InvalidPayloadError`.
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
    events: list[Event] = Field(default_factory=list)
    """The events the append logged with its entries (``append_entries(events=...)``),
    in seq order; empty when it was given none, and on a replay (logged once only)."""


class SessionQuery(TypedModel):
    """Filters and paging for listing sessions (newest activity first).

    Bad values raise `InvalidInputError` (`InvalidPayloadError` for a field pydantic refuses).
    """

    model_config = _FROZEN
    # Strict: a limit of "5" or True is a caller's mistake, refused rather than coerced.
    limit: int = Field(default=50, ge=1, le=1000, strict=True)
    cursor: str | None = Field(default=None, strict=True)
    offset: int = Field(default=0, ge=0, strict=True)
    agent_id: str | None = None
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    """Equality on top-level metadata keys; values are JSON scalars."""
    active_after: AwareDatetime | None = None
    active_before: AwareDatetime | None = None

    def __init__(self, **data: Any) -> None:
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            raise InvalidInputError(
                f"metadata filter must be a dict of key to JSON scalar, like {{'key': 'value'}}; "
                f"got {type(metadata).__name__}"
            )
        for key, value in metadata.items():
            validate_id(key, "metadata filter key")
            if isinstance(value, dict | list) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise InvalidInputError(
                    f"metadata filter {key!r} must be a string, number, boolean or null"
                )
        super().__init__(**data)


class CorruptItem(BaseModel):
    """A stored session head or record that could not be decoded, as a listing reports it.

    The listing goes on with the rest (one damaged row never hides the others); ``error``
    is the message of the `StoreCorruptError` a get of ``id`` raises, naming the fix
    (delete it, or restore it from a backup), and ``raw`` the start of the stored text.
    """

    model_config = _FROZEN
    id: str
    """The session id, or the record key."""
    error: str
    raw: str = ""


class Page(BaseModel):
    """One page of a listing; pass ``next_cursor`` back to get the next one.

    A page covers up to ``limit`` stored sessions; one whose head cannot be decoded is
    reported in ``corrupt`` instead of ``items`` (so ``items`` may be shorter than the
    limit while ``next_cursor`` is set: follow it until it is None).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    items: list[SessionRecord]
    next_cursor: str | None = None
    corrupt: list[CorruptItem] = Field(default_factory=list)
    """Sessions of this page whose stored head cannot be decoded, in list order."""


class VersionedRecord(BaseModel):
    """A namespaced JSON value with a version for compare-and-set."""

    model_config = _FROZEN
    namespace: str
    key: str
    value: JsonValue
    version: int
    updated_at: datetime
    expires_at: datetime | None = None


class RecordList(list[VersionedRecord]):
    """What ``list_records`` returns: the live records (a list), and the damaged ones.

    ``corrupt`` reports records whose stored value cannot be decoded, with keys before
    the last listed record's (or anywhere up to the end, on the last page). They do not
    count towards ``limit``, so paging with ``after_key=records[-1].key`` misses nothing.
    """

    def __init__(
        self, records: Iterable[VersionedRecord] = (), corrupt: Iterable[CorruptItem] = ()
    ) -> None:
        super().__init__(records)
        self.corrupt: list[CorruptItem] = list(corrupt)


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


@dataclass(frozen=True, slots=True)
class EventBatch:
    """Events to log in the same atomic write as an append of entries
    (``append_entries(events=...)``): to the log ``log_id`` of the append's tenant."""

    log_id: str
    events: Sequence[EventDraft]


@dataclass(frozen=True, slots=True)
class EventNotice:
    """Events were appended to ``log_id`` of ``tenant``, up to ``last_seq`` (what an
    event feed, `statekeeper.runtime.EventFeed`, tells other processes).

    With ``log_id`` None the notice is a *resync*: the feed has just started listening,
    or listens again after losing its connection, so appends before it may have gone
    unnoticed; re-read every log of interest.
    """

    tenant: str
    log_id: str | None = None
    last_seq: int | None = None
    first_seq: int | None = None
    """The batch's first seq, when the feed knows it (Redis does, PostgreSQL does not)."""
    position: str | None = None
    """Where the notice is in the feed, when the feed can resume from there (Redis)."""

    @property
    def resync(self) -> bool:
        """True when this notice says "appends may have been missed: re-read"."""
        return self.log_id is None


AppendResult.model_rebuild()  # its ``events`` names `Event`, defined after it
