"""The plain-files store: opening, sessions, records and events (see `statekeeper.stores.files`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import JsonValue

from statekeeper.errors import (
    InvalidInputError,
    SchemaVersionError,
    StoreUnavailableError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, encode_json, loads
from statekeeper.loops import per_loop
from statekeeper.stores.base import (
    ClosingStore,
    Durability,
    Event,
    EventDraft,
    Page,
    RecordList,
    SessionQuery,
    SessionRecord,
    VersionedRecord,
)
from statekeeper.stores.engine import AppendEngine
from statekeeper.stores.files.layout import (
    FORMAT_VERSION,
    Layout,
    Recovery,
    UnsafePathError,
    child,
    translate_os_error,
)
from statekeeper.stores.files.records import EventFiles, RecordFiles
from statekeeper.stores.files.sessions import SessionCtx, SessionFiles
from statekeeper.stores.files.transcripts import FileTranscripts
from statekeeper.stores.options import StoreOptions
from statekeeper.stores.rules import (
    check_read,
    check_record_ids,
    check_record_listing,
    check_rewrites,
    check_tenant_and_id,
    decode_cursor,
    encode_cursor,
    event_texts,
    matches_query,
    new_session_record,
    record_text,
)
from statekeeper.stores.worker import Worker

__all__ = ["FileStore", "Recovery", "UnsafePathError", "open_files"]

T = TypeVar("T")
_MARKER = ".statekeeper"


class FileStore(FileTranscripts, ClosingStore):
    """A store in plain JSON / JSONL files under one directory.

    Open with ``await FileStore.open(path)`` or ``open_store("files:///path")``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        durability: Durability = Durability.POWER,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        lock_timeout: float = 30.0,
    ) -> None:
        self.root = Path(os.path.realpath(os.path.abspath(root)))
        self.url = f"files://{self.root}"
        self.durability = Durability(durability)
        self.max_payload_bytes = max_payload_bytes
        self._files = Layout(str(self.root), self.durability, lock_timeout)
        self._sessions = SessionFiles(self._files)
        self._records = RecordFiles(self._files)
        self._events = EventFiles(self._files)
        self._worker = Worker("statekeeper-files")
        self._heads: dict[tuple[str, str], Any] = {}
        self._closed = False

    @per_loop
    def _engine(self) -> AppendEngine:
        return AppendEngine(self, max_payload_bytes=self.max_payload_bytes, heads=self._heads)

    @classmethod
    async def open(cls, root: str | os.PathLike[str], **options: Any) -> FileStore:
        """Open (creating if needed) the store under ``root``."""
        store = cls(root, **options)
        try:
            await store._call(store._prepare)
        except BaseException:
            store._worker.shutdown()
            raise
        return store

    async def close(self) -> None:
        """Stop the worker thread. Idempotent."""
        if not self._closed:
            self._closed = True
            self._worker.shutdown()

    @property
    def recoveries(self) -> list[Recovery]:
        """What this handle found damaged and recovered, oldest first.

        Every recovery is also logged (logger ``statekeeper.stores.files``) and appended
        to ``<root>/<tenant>/recoveries.jsonl``, so other processes can see it too.
        """
        return list(self._files.recoveries)

    # -- plumbing ------------------------------------------------------------------------

    async def _call(self, fn: Callable[[], T]) -> T:
        return await self._worker.run(lambda: self._guard(fn))

    def _guard(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except OSError as exc:
            where = exc.filename if isinstance(exc.filename, str) else str(self.root)
            raise translate_os_error(exc, where) from exc

    async def _in_session(self, tenant: str, session_id: str, fn: Callable[[SessionCtx], T]) -> T:
        return await self._call(lambda: self._sessions.run(tenant, session_id, fn))

    def _prepare(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise StoreUnavailableError(
                f"{self.root} is not a directory; a files:// store needs a directory"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        marker = child(str(self.root), _MARKER, internal=True)
        raw = self._files.read_bytes(marker)
        if raw is not None:
            try:
                version = loads(raw).get("version")
            except (ValueError, AttributeError):
                version = None
            if isinstance(version, int) and version > FORMAT_VERSION:
                raise SchemaVersionError(
                    f"{self.root} holds files-store format {version}, but this statekeeper "
                    f"knows formats up to {FORMAT_VERSION}; upgrade statekeeper to open it"
                )
            if isinstance(version, int):
                return
        self._check_case_sensitive()
        doc = {"format": "statekeeper-files", "version": FORMAT_VERSION}
        self._files.write_atomic(marker, (encode_json(doc) + "\n").encode(), backup=False)

    def _check_case_sensitive(self) -> None:
        name = f".case-probe-{os.urandom(4).hex()}"
        probe = child(str(self.root), name, internal=True)
        os.close(self._files.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        try:
            insensitive = self._files.exists(child(str(self.root), name.upper(), internal=True))
        finally:
            self._files.unlink(probe)
        if insensitive:
            raise StoreUnavailableError(
                f"{self.root} is on a case-insensitive file system: ids that differ only "
                "in case (tenants 'Alice' and 'alice') would share files. Put the files "
                "store on a case-sensitive file system, or use sqlite://"
            )

    # -- sessions ------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        record = new_session_record(record, self.max_payload_bytes)
        return await self._call(lambda: self._sessions.create(record))

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)
        return await self._in_session(tenant, session_id, lambda ctx: ctx.head.record)

    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        validate_id(tenant, "tenant")
        position = decode_cursor(query.cursor) if query.cursor is not None else None
        found, lost = await self._call(lambda: self._sessions.all_records(tenant))
        rows = sorted(
            (r for r in found if matches_query(r, query)),
            key=lambda r: (r.last_active, r.id),
            reverse=True,
        )
        if position is not None:
            rows = [r for r in rows if (r.last_active, r.id) < position]
        rows = rows[query.offset :]
        items = rows[: query.limit]
        more = len(rows) > query.limit
        cursor = encode_cursor(items[-1].last_active, items[-1].id) if more else None
        # Sessions lost to damage have no place in the order (their head is unreadable):
        # the first page reports them, each listing again, until they are deleted.
        first = position is None and query.offset == 0
        return Page(items=items, next_cursor=cursor, corrupt=lost if first else [])

    async def delete_session(self, tenant: str, session_id: str) -> None:
        check_tenant_and_id(tenant, session_id)
        self._engine.forget(tenant, session_id)
        await self._call(lambda: self._sessions.delete(tenant, session_id))

    # -- records -------------------------------------------------------------------------

    async def get_record(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        check_record_ids(tenant, namespace, key)
        return await self._call(lambda: self._records.get(tenant, namespace, key))

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
        return await self._call(
            lambda: self._records.put(tenant, namespace, key, text, expected_version, expires_at)
        )

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
        return await self._call(
            lambda: self._records.list(tenant, namespace, prefix, after_key, limit)
        )

    async def delete_record(
        self, tenant: str, namespace: str, key: str, *, expected_version: int | None = None
    ) -> None:
        check_record_ids(tenant, namespace, key)
        await self._call(lambda: self._records.delete(tenant, namespace, key, expected_version))

    # -- events --------------------------------------------------------------------------

    async def append_events(
        self, tenant: str, log_id: str, events: Sequence[EventDraft]
    ) -> list[Event]:
        texts = event_texts(tenant, log_id, events, self.max_payload_bytes)
        if not events:
            return []
        return await self._call(lambda: self._events.append(tenant, log_id, events, texts))

    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        check_record_ids(tenant, log_id)
        check_read(after_seq, None, limit)
        return await self._call(lambda: self._events.read(tenant, log_id, after_seq, limit))

    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        check_record_ids(tenant, log_id)
        await self._call(lambda: self._events.delete(tenant, log_id))

    async def rewrite_event_payloads(
        self, tenant: str, log_id: str, payloads: Mapping[int, tuple[Any, Any]]
    ) -> int:
        """See ``docs/stores.md``, "Rewriting payloads in place" (what reseal uses)."""
        check_record_ids(tenant, log_id)
        checked = check_rewrites(payloads, events=True, limit=self.max_payload_bytes)
        return await self._call(lambda: self._events.rewrite(tenant, log_id, checked))


async def open_files(location: str, options: StoreOptions) -> FileStore:
    """``files:///absolute/dir`` or ``files://relative/dir``.

    Options: ``durability=power|process`` (default power: fsync every write),
    ``max_payload_bytes=<n>``, ``lock_timeout=<seconds>`` (default 30).
    """
    if not location:
        raise InvalidInputError("files URL needs a directory, e.g. files:///var/lib/agents")
    durability = options.durability()
    limit = options.max_payload_bytes()
    lock_timeout = options.take("lock_timeout", float, 30.0, positive=True)
    options.done()
    return await FileStore.open(
        location,
        durability=durability,
        max_payload_bytes=limit,
        lock_timeout=lock_timeout,
    )
