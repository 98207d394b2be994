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

from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

from pydantic import JsonValue

from statekeeper.stores.types import (
    AppendResult,
    CorruptItem,
    DeliveryContext,
    Durability,
    Entry,
    EntryDraft,
    EntryKind,
    Event,
    EventBatch,
    EventDraft,
    EventNotice,
    ForkPoint,
    Page,
    RecordList,
    SessionPatch,
    SessionQuery,
    SessionRecord,
    VersionedRecord,
)

__all__ = [
    "AppendResult",
    "ClosingStore",
    "CorruptItem",
    "DeliveryContext",
    "Durability",
    "Entry",
    "EntryDraft",
    "EntryKind",
    "Event",
    "EventBatch",
    "EventDraft",
    "EventLogStore",
    "EventNotice",
    "ForkPoint",
    "Page",
    "RecordList",
    "RecordStore",
    "SessionPatch",
    "SessionQuery",
    "SessionRecord",
    "SessionStore",
    "Store",
    "TranscriptStore",
    "VersionedRecord",
    "WrappingStore",
]

# -- the protocol ------------------------------------------------------------------------


@runtime_checkable
class SessionStore(Protocol):
    """Session head records."""

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        """Store a new session (version 1). `AlreadyExistsError` if the id is taken."""
        ...

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        """The session, or `NotFoundError`; `StoreCorruptError` (naming the id) if its
        stored head cannot be decoded."""
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
        """A page of the tenant's sessions, most recently active first.

        A session whose stored head cannot be decoded is reported in ``Page.corrupt``
        (with the error `get_session` raises for it), never allowed to fail the listing;
        paging cursors come from the stored position, so they pass damaged rows too.
        """
        ...

    async def delete_session(self, tenant: str, session_id: str) -> None:
        """Delete the session and all its entries. `NotFoundError` if absent.

        Works on a session whose head cannot be decoded (how an operator cleans up).
        """
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
        events: EventBatch | None = None,
    ) -> AppendResult:
        """Append all drafts and update the head atomically (all or nothing).

        Drafts whose id is already stored with the same content are not written again
        (idempotent retries); the same id with other content is a `ConflictError`.

        ``events`` are logged in the same atomic write (to ``events.log_id`` of this
        tenant, with that log's next seqs, returned in `AppendResult.events`): the
        entries and the events are stored together or not at all. They are checked as
        `append_events` checks them; a replayed append logs them no second time.
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
    ) -> RecordList:
        """Live records of a namespace in key order, at most ``limit``.

        A record whose stored value cannot be decoded is reported in
        ``RecordList.corrupt``, not listed, and does not count towards ``limit``.
        """
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


class WrappingStore:
    """Base of stores that wrap another (``wrapped``): what they do not define passes
    through to it, and closing (or leaving ``async with``) closes it."""

    wrapped: Store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    async def close(self) -> None:
        """Close the wrapped store."""
        await self.wrapped.close()

    async def __aenter__(self) -> Self:
        await self.wrapped.__aenter__()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.wrapped.__aexit__(kind, exc, tb)
