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

The rules every backend follows live in the pure functions at the bottom of this module
(`plan_append`, `apply_patch`), so the backends only do I/O. The conformance suite in
``tests/conformance`` proves each backend keeps them.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, NamedTuple, Protocol, get_args, runtime_checkable

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    InvalidPayloadError,
    StatekeeperError,
)
from statekeeper.ids import new_id, validate_id
from statekeeper.jsoncodec import decode_json, encode_json, loads

__all__ = [
    "AppendResult",
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
    """Everything a backend implements. Open one with `statekeeper.open_store`."""

    url: str

    async def close(self) -> None:
        """Release connections and threads. Idempotent."""
        ...


# -- rules shared by every backend (pure) ---------------------------------------------------


def check_tenant_and_id(tenant: str, session_id: str) -> None:
    """Validate the two ids every session operation takes."""
    validate_id(tenant, "tenant")
    validate_id(session_id, "session id")


def apply_patch(
    record: SessionRecord,
    patch: SessionPatch,
    *,
    now: datetime,
    internal: dict[str, Any] | None = None,
) -> SessionRecord:
    """The record after ``patch``: fields set, counters added, version bumped.

    ``internal`` carries store-maintained fields (``last_seq``, ``head_seq``) of an append.
    """
    changes: dict[str, Any] = dict(internal or {})
    changes.update({name: getattr(record, name) + n for name, n in patch.add.items()})
    changes["version"] = record.version + 1
    changes["last_active"] = now
    if patch.set:
        data = record.model_dump()
        data.update(patch.set)
        data.update(changes)
        try:
            updated = SessionRecord.model_validate(data)
        except ValueError as exc:
            raise InvalidPayloadError(f"invalid session update: {exc}") from exc
    else:
        # Counters are ints and the rest is unchanged: nothing to validate again.
        updated = record.model_copy(update=changes)
    if not 0 <= updated.head_seq <= updated.last_seq:
        raise InvalidInputError(
            f"head_seq {updated.head_seq} is not an entry of session {record.id!r} "
            f"(entries 1..{updated.last_seq})"
        )
    return updated


def check_version(record: SessionRecord, expected_version: int | None) -> None:
    """Raise `ConflictError` if ``expected_version`` is set and stale."""
    if expected_version is not None and expected_version != record.version:
        raise ConflictError(
            f"session {record.id!r} is at version {record.version}, not {expected_version}: "
            "another writer changed it; reload and retry",
            expected=expected_version,
            actual=record.version,
        )


_NO_PATCH = SessionPatch()


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """What a backend must write for an append: new entries and the new head record."""

    entries: list[Entry]
    encoded: list[str]
    session: SessionRecord
    replayed: list[Entry]


def plan_append(
    record: SessionRecord,
    drafts: Sequence[EntryDraft],
    existing: Mapping[str, Entry],
    *,
    expected_version: int | None,
    patch: SessionPatch | None,
    move_head: bool,
    max_payload_bytes: int,
    now: datetime,
) -> AppendPlan:
    """Decide an append. ``existing`` maps the drafts' ids already stored to their entries.

    Raises `ConflictError` for a stale version or a reused id with other content, and
    `InvalidInputError` for a parent that is not an entry of the session.
    """
    if not drafts:
        raise InvalidInputError("append needs at least one entry")
    seen: set[str] = set()
    replayed: list[Entry] = []
    fresh: list[EntryDraft] = []
    for draft in drafts:
        validate_id(draft.id, "entry id")
        if draft.id in seen:
            raise InvalidInputError(f"entry id {draft.id!r} appears twice in one append")
        seen.add(draft.id)
        stored = existing.get(draft.id)
        if stored is None:
            fresh.append(draft)
        elif stored.kind == draft.kind and stored.payload == _roundtrip(draft.payload):
            replayed.append(stored)
        else:
            raise ConflictError(
                f"entry id {draft.id!r} is already stored in session {record.id!r} with "
                "different content; use a new id for a new entry"
            )
    if not fresh:
        return AppendPlan([], [], record, replayed)
    if replayed:
        raise ConflictError(
            f"append to session {record.id!r} mixes already-stored entries "
            f"({', '.join(e.id for e in replayed)}) with new ones; retry the exact batch "
            "or append only the new entries"
        )
    check_version(record, expected_version)

    entries: list[Entry] = []
    encoded: list[str] = []
    seq = record.last_seq
    previous: int | None = record.head_seq or None
    head = record.head_seq
    for draft in fresh:
        seq += 1
        if draft.parent == "head":
            parent = previous
        elif draft.parent is None:
            parent = None
        else:
            parent = draft.parent
            if not 1 <= parent < seq:
                raise InvalidInputError(
                    f"parent {parent} of entry {draft.id!r} is not an entry of session "
                    f"{record.id!r} (entries 1..{seq - 1})"
                )
        text = encode_json(draft.payload, what=f"entry {draft.id!r}", limit=max_payload_bytes)
        encoded.append(text)
        # The entry as a read returns it: decoded from what is stored (tuples as lists ...).
        entries.append(Entry(seq, draft.id, parent, str(draft.kind), draft.created_at, loads(text)))
        if not draft.side:
            previous = head = seq

    moved = {"last_seq": seq, "head_seq": head} if move_head else {"last_seq": seq}
    session = apply_patch(record, patch or _NO_PATCH, now=now, internal=moved)
    return AppendPlan(entries, encoded, session, [])


def prunable(
    entries: Sequence[Entry], record: SessionRecord, kind: str, before_seq: int, id_prefix: str
) -> list[int]:
    """Seqs of ``entries`` (all of a session's) that `prune_entries` may delete."""
    referenced = {e.parent_seq for e in entries} | {record.head_seq}
    return [
        e.seq
        for e in entries
        if e.kind == kind
        and e.seq < before_seq
        and e.seq not in referenced
        and e.id.startswith(id_prefix)
    ]


def _roundtrip(payload: dict[str, Any]) -> Any:
    """The payload as it reads back from storage (tuples become lists, etc.)."""
    return decode_json(encode_json(payload))


def corrupt_entry(
    seq: int, entry_id: str, parent_seq: int | None, created_at: datetime, raw: str, error: str
) -> Entry:
    """The stand-in for a stored entry that cannot be decoded (reported, not skipped)."""
    return Entry(
        seq, entry_id, parent_seq, EntryKind.CORRUPT, created_at, {"error": error, "raw": raw[:200]}
    )


def encode_cursor(last_active: datetime, session_id: str) -> str:
    """An opaque paging cursor after the given session."""
    text = encode_json([last_active.isoformat(), session_id])
    return base64.urlsafe_b64encode(text.encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The position a cursor points after; `InvalidInputError` if it was tampered with."""
    try:
        stamp, session_id = decode_json(base64.urlsafe_b64decode(cursor.encode()))
        position = datetime.fromisoformat(stamp)
        if position.tzinfo is None:
            raise ValueError("cursor time has no timezone")
        return position, validate_id(session_id, "session id")
    except (ValueError, TypeError, binascii.Error, StatekeeperError) as exc:
        raise InvalidInputError(
            f"invalid paging cursor {cursor[:40]!r}; pass next_cursor from the previous page"
        ) from exc


def matches_query(record: SessionRecord, query: SessionQuery) -> bool:
    """Whether a session passes a query's filters (for backends that filter in Python)."""
    if query.agent_id is not None and record.agent_id != query.agent_id:
        return False
    if query.active_after is not None and record.last_active <= query.active_after:
        return False
    if query.active_before is not None and record.last_active >= query.active_before:
        return False
    return all(
        k in record.metadata and json_scalar_equal(record.metadata[k], v)
        for k, v in query.metadata.items()
    )


def json_scalar_equal(stored: Any, wanted: Any) -> bool:
    """JSON equality for filter values: numbers by value, booleans only equal booleans."""
    if isinstance(wanted, bool) or isinstance(stored, bool):
        return type(stored) is type(wanted) and stored == wanted
    if wanted is None or stored is None:
        return stored is None and wanted is None
    if isinstance(wanted, int | float):
        return isinstance(stored, int | float) and stored == wanted
    return type(stored) is type(wanted) and bool(stored == wanted)
