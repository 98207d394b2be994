"""The in-memory reference store (``memory://``).

For tests, demos and debugging: nothing survives the process. It follows exactly the
same rules as the durable backends (it runs the same conformance suite) and stores JSON
text, never live objects, so callers cannot change stored data by mutating a result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from pydantic import JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import AlreadyExistsError, NotFoundError
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, decode_json
from statekeeper.loops import per_loop
from statekeeper.stores.base import (
    ClosingStore,
    Entry,
    Event,
    EventDraft,
    Page,
    RecordList,
    SessionPatch,
    SessionQuery,
    SessionRecord,
    VersionedRecord,
)
from statekeeper.stores.engine import AppendEngine, EventWrite, Snapshot, Write
from statekeeper.stores.engine_writes import EngineWrites
from statekeeper.stores.options import StoreOptions
from statekeeper.stores.rules import (
    apply_patch,
    check_limit,
    check_prunable_kind,
    check_read,
    check_record_ids,
    check_record_listing,
    check_record_version,
    check_rewrites,
    check_tenant_and_id,
    decode_cursor,
    encode_cursor,
    event_texts,
    matches_query,
    new_session_record,
    prunable,
    record_not_found,
    record_text,
    same_payload,
    session_not_found,
)

__all__ = ["MemoryStore"]

T = TypeVar("T")


@dataclass(eq=False)
class _Transcript:
    gen: int
    rows: dict[int, tuple[str, int | None, str, datetime, str]] = field(default_factory=dict)
    by_id: dict[str, int] = field(default_factory=dict)

    def entry(self, seq: int) -> Entry:
        entry_id, parent, kind, created, text = self.rows[seq]
        return Entry(seq, entry_id, parent, kind, created, decode_json(text))


@dataclass
class _Record:
    text: str
    version: int
    updated_at: datetime
    expires_at: datetime | None

    def live(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at > now


def _locked(
    method: Callable[..., Coroutine[Any, Any, T]],
) -> Callable[..., Coroutine[Any, Any, T]]:
    async def call(self: Any, *args: Any, **kwargs: Any) -> T:
        with self._mutex:  # the body never suspends: the lock is never held across a wait
            return await method(self, *args, **kwargs)

    call.__name__, call.__doc__ = method.__name__, method.__doc__
    return call


class MemoryStore(EngineWrites, ClosingStore):
    """A store that keeps everything in this process's memory.

    Any thread and loop may call it (see `statekeeper.loops`): each loop has an append
    engine of its own, and every operation's body is synchronous and holds the store's
    mutex, so another thread never sees half of a change.
    """

    def __init__(self, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        self.url = "memory://"
        self.max_payload_bytes = max_payload_bytes
        self._sessions: dict[tuple[str, str], SessionRecord] = {}
        self._transcripts: dict[tuple[str, str], _Transcript] = {}
        self._records: dict[tuple[str, str, str], _Record] = {}
        self._events: dict[tuple[str, str], list[tuple[str, str, datetime, str]]] = {}
        self._created = 0  # generations: tell a re-created session from the deleted one
        self._mutex = threading.RLock()
        self._heads: dict[tuple[str, str], Any] = {}

    @per_loop
    def _engine(self) -> AppendEngine:
        return AppendEngine(self, max_payload_bytes=self.max_payload_bytes, heads=self._heads)

    async def close(self) -> None:
        """Nothing to release."""

    # -- sessions ------------------------------------------------------------------------

    def _session(self, tenant: str, session_id: str) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)
        try:
            return self._sessions[tenant, session_id]
        except KeyError:
            raise session_not_found(session_id) from None

    @_locked
    async def create_session(self, record: SessionRecord) -> SessionRecord:
        record = new_session_record(record, self.max_payload_bytes)
        if (record.tenant, record.id) in self._sessions:
            raise AlreadyExistsError(f"session {record.id!r} already exists")
        self._created += 1
        self._sessions[record.tenant, record.id] = record
        self._transcripts[record.tenant, record.id] = _Transcript(self._created)
        return record

    @_locked
    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        return self._session(tenant, session_id)

    @_locked
    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        validate_id(tenant, "tenant")
        rows = sorted(
            (r for (t, _), r in self._sessions.items() if t == tenant and matches_query(r, query)),
            key=lambda r: (r.last_active, r.id),
            reverse=True,
        )
        if query.cursor is not None:
            position = decode_cursor(query.cursor)
            rows = [r for r in rows if (r.last_active, r.id) < position]
        rows = rows[query.offset :]
        items = rows[: query.limit]
        more = len(rows) > query.limit
        cursor = encode_cursor(items[-1].last_active, items[-1].id) if more else None
        return Page(items=items, next_cursor=cursor)

    @_locked
    async def delete_session(self, tenant: str, session_id: str) -> None:
        self._session(tenant, session_id)
        del self._sessions[tenant, session_id]
        del self._transcripts[tenant, session_id]
        self._engine.forget(tenant, session_id)

    # -- transcripts ---------------------------------------------------------------------

    @_locked
    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        """The engine's read primitive."""
        record = self._session(tenant, session_id)
        transcript = self._transcripts[tenant, session_id]
        existing = {i: transcript.entry(transcript.by_id[i]) for i in ids if i in transcript.by_id}
        return Snapshot(transcript.gen, record, existing)

    @_locked
    async def commit_head(
        self,
        tenant: str,
        session_id: str,
        base: Snapshot,
        head: SessionRecord,
        writes: Sequence[Write],
        ids: Sequence[str],
        *,
        events: Sequence[EventWrite] = (),
    ) -> Snapshot | None:
        """The engine's write primitive: compare-and-set on (generation, version)."""
        current = await self.load_head(tenant, session_id, ids)
        if (current.token, current.record.version) != (base.token, base.record.version):
            return current
        if current.existing:
            return current
        transcript = self._transcripts[tenant, session_id]
        for entry, text, _ in writes:
            transcript.rows[entry.seq] = (
                entry.id,
                entry.parent_seq,
                entry.kind,
                entry.created_at,
                text,
            )
            transcript.by_id[entry.id] = entry.seq
        self._sessions[tenant, session_id] = head
        for log in events:
            self._log_events(tenant, log)
        return None

    @_locked
    async def read_entries(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        self._session(tenant, session_id)
        transcript = self._transcripts[tenant, session_id]
        check_read(after_seq, until_seq, limit)
        last = 2**62 if until_seq is None else until_seq
        seqs = [s for s in transcript.rows if after_seq < s <= last]
        return [transcript.entry(seq) for seq in seqs[:limit]]

    @_locked
    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        record = self._session(tenant, session_id)
        check_prunable_kind(kind)
        transcript = self._transcripts[tenant, session_id]
        doomed = prunable(
            [transcript.entry(seq) for seq in transcript.rows], record, kind, before_seq, id_prefix
        )
        for seq in doomed:
            del transcript.by_id[transcript.rows.pop(seq)[0]]
        if doomed:
            self._sessions[tenant, session_id] = apply_patch(record, SessionPatch(), now=utcnow())
            self._engine.forget(tenant, session_id)
        return len(doomed)

    @_locked
    async def rewrite_entry_payloads(
        self, tenant: str, session_id: str, payloads: Mapping[str, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses)."""
        self._session(tenant, session_id)
        checked = check_rewrites(payloads, events=False, limit=self.max_payload_bytes)
        transcript = self._transcripts[tenant, session_id]
        done = 0
        for entry_id, (expected, text) in checked.items():
            seq = transcript.by_id.get(entry_id)
            if seq is not None and same_payload(transcript.rows[seq][4], expected):
                transcript.rows[seq] = (*transcript.rows[seq][:4], text)
                done += 1
        return done

    @_locked
    async def get_entry(self, tenant: str, session_id: str, entry_id: str) -> Entry:
        validate_id(entry_id, "entry id")
        self._session(tenant, session_id)
        transcript = self._transcripts[tenant, session_id]
        try:
            return transcript.entry(transcript.by_id[entry_id])
        except KeyError:
            raise NotFoundError(f"entry {entry_id!r} not found in session {session_id!r}") from None

    # -- records -------------------------------------------------------------------------

    def _live(self, tenant: str, namespace: str, key: str) -> _Record | None:
        check_record_ids(tenant, namespace, key)
        found = self._records.get((tenant, namespace, key))
        return found if found is not None and found.live(utcnow()) else None

    @_locked
    async def get_record(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        found = self._live(tenant, namespace, key)
        if found is None:
            raise record_not_found(namespace, key)
        return _versioned(namespace, key, found)

    @_locked
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
        text = record_text(tenant, namespace, key, value, expires_at, self.max_payload_bytes)
        found = self._live(tenant, namespace, key)
        version = found.version if found else 0
        check_record_version(namespace, key, version, expected_version)
        stored = _Record(text, version + 1, utcnow(), expires_at)
        self._records[tenant, namespace, key] = stored
        return _versioned(namespace, key, stored)

    @_locked
    async def list_records(
        self,
        tenant: str,
        namespace: str,
        *,
        prefix: str = "",
        after_key: str | None = None,
        limit: int = 100,
    ) -> RecordList:
        check_record_listing(tenant, namespace, prefix, limit)
        now = utcnow()
        keys = sorted(
            k
            for (t, ns, k), r in self._records.items()
            if t == tenant and ns == namespace and k.startswith(prefix) and r.live(now)
        )
        if after_key is not None:
            keys = [k for k in keys if k > after_key]
        return RecordList(
            _versioned(namespace, k, self._records[tenant, namespace, k]) for k in keys[:limit]
        )

    @_locked
    async def delete_record(
        self, tenant: str, namespace: str, key: str, *, expected_version: int | None = None
    ) -> None:
        found = self._live(tenant, namespace, key)
        if found is None:
            raise record_not_found(namespace, key)
        check_record_version(namespace, key, found.version, expected_version)
        del self._records[tenant, namespace, key]

    # -- events --------------------------------------------------------------------------

    @_locked
    async def append_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft]
    ) -> list[Event]:
        texts = event_texts(tenant, log_id, events, self.max_payload_bytes)
        return self._log_events(tenant, EventWrite(log_id, events, texts))

    def _log_events(self, tenant: str, write: EventWrite) -> list[Event]:
        log = self._events.setdefault((tenant, write.log_id), [])
        first = len(log) + 1
        for event, text in zip(write.drafts, write.texts, strict=True):
            log.append((event.stream, event.kind, event.ts, text))
        return write.stored(first)

    @_locked
    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        check_record_ids(tenant, log_id)
        check_read(after_seq, None, limit)
        log = self._events.get((tenant, log_id), [])
        start = max(after_seq, 0)
        stop = len(log) if check_limit(limit) is None else min(len(log), start + (limit or 0))
        return [
            Event(log_id, seq + 1, *log[seq][:3], decode_json(log[seq][3]))
            for seq in range(start, stop)
        ]

    @_locked
    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        check_record_ids(tenant, log_id)
        self._events.pop((tenant, log_id), None)

    @_locked
    async def rewrite_event_payloads(
        self, tenant: str, log_id: str, payloads: Mapping[int, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses)."""
        check_record_ids(tenant, log_id)
        checked = check_rewrites(payloads, events=True, limit=self.max_payload_bytes)
        log = self._events.get((tenant, log_id), [])
        done = 0
        for seq, (expected, text) in checked.items():
            if seq <= len(log) and same_payload(log[seq - 1][3], expected):
                log[seq - 1] = (*log[seq - 1][:3], text)
                done += 1
        return done


def _versioned(namespace: str, key: str, stored: _Record) -> VersionedRecord:
    return VersionedRecord(
        namespace=namespace,
        key=key,
        value=decode_json(stored.text),
        version=stored.version,
        updated_at=stored.updated_at,
        expires_at=stored.expires_at,
    )


async def open_memory(location: str, options: StoreOptions) -> MemoryStore:
    """``memory://``: a fresh, empty store in this process."""
    limit = options.max_payload_bytes()
    options.done()
    return MemoryStore(max_payload_bytes=limit)
