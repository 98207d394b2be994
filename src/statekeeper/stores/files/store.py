"""The plain-files store (``files:///dir``): JSON and JSONL files a person can read.

Layout under the root (every name below the root is a validated id or a fixed name)::

    <root>/.statekeeper                          {"format": "statekeeper-files", "version": 1}
    <root>/<tenant>/sessions/<id>.json           the session head (+ <id>.json.bak)
    <root>/<tenant>/sessions/<id>.jsonl          the transcript, one entry per line
    <root>/<tenant>/records/<namespace>/<key>.json   a versioned record (+ .bak)
    <root>/<tenant>/events/<log>.jsonl           an event log, one event per line
    <root>/<tenant>/locks/{sessions,records,events}/<name>   flock files
    <root>/<tenant>/quarantine/                  damaged files, moved aside, never deleted
    <root>/<tenant>/recoveries.jsonl             what was recovered, when and how

A head file holds the `SessionRecord` and where its transcript ends::

    {"log": {"gen": "9f2c0a41b7d3", "bytes": 1234},
     "session": {"id": "s1", "tenant": "alice", ..., "version": 7}}

**Writes.** JSON files are rewritten atomically (temp file, fsync, the old version kept as
``.bak`` by a hard link, ``os.replace``, fsync of the folder). An append writes the new
entry lines after the committed end of the transcript in one ``pwrite`` (fsynced with
durability ``power``, the default; not with ``process``), then replaces the head, whose
``bytes`` is the commit point (see ``files_logs``). So an append costs the same at any
history length, and a crash at any moment leaves every batch whole or absent.

**Concurrency.** Within a process one worker thread does all the file I/O; across
processes, every session operation (reads too) and every record or event write holds an
``flock`` on a per-session (per record namespace, per event log) lock file, so writers
never interleave or lose updates and different sessions never wait for each other.
Record and event reads take no lock: files are replaced whole, and only finished event
batches count.

**Paths.** Every path comes from `Layout.directory` (``files_layout``): validated ids only,
each folder checked on the way down; a symbolic link (or a FIFO, a folder where a file
belongs) inside the root is refused with `UnsafePathError`, never followed.

**Damage and recovery.** Nothing is dropped silently: every case below is a `Recovery`,
kept on `FileStore.recoveries`, logged (``statekeeper.stores.files``) and appended to
``<tenant>/recoveries.jsonl``; damaged files are moved to ``quarantine/``, not deleted.

- bytes after the committed end (a crash mid-append, never acknowledged) are ignored, and
  cut off by the next append; a line that cannot be decoded inside the committed part is
  served as a ``corrupt`` entry in its place, with the valid entries around it;
- an unreadable head falls back to ``<id>.json.bak`` (the version just before), and the
  whole entries written after that backup are kept; the version jumps by 2 so a writer
  holding the lost version gets a `ConflictError`, never a blind overwrite;
- if the backup is unreadable too, the transcript's whole lines are copied into a new
  session ``recovered-<id>`` whose metadata names the lost session (``recovered_from``)
  and what happened (``recovery``); the call that found the damage raises
  `StoreCorruptError` naming the new session, later lookups of the lost id raise a
  `NotFoundError` that names it too, and the id is free to be used again;
- an unreadable record falls back to its backup; without one it is quarantined:
  `get_record` raises `StoreCorruptError` once, listings skip it, and a put starts the
  key again at version 1;
- a prune that replaced the transcript but died before its head write is completed.

POSIX only (``fcntl.flock``, ``O_NOFOLLOW``), on a case-sensitive file system: the store
refuses a root where "Alice" and "alice" would be the same folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    InvalidInputError,
    NotFoundError,
    SchemaVersionError,
    StoreUnavailableError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, encode_json, loads
from statekeeper.stores.base import (
    AppendResult,
    ClosingStore,
    Durability,
    Entry,
    EntryDraft,
    Event,
    EventDraft,
    Page,
    SessionPatch,
    SessionQuery,
    SessionRecord,
    VersionedRecord,
)
from statekeeper.stores.engine import AppendEngine, Snapshot, Write
from statekeeper.stores.files.layout import (
    FORMAT_VERSION,
    Layout,
    Recovery,
    UnsafePathError,
    child,
    read_at,
    translate_os_error,
)
from statekeeper.stores.files.logs import EPOCH, entry_line, header_line, new_gen
from statekeeper.stores.files.records import EventFiles, RecordFiles
from statekeeper.stores.files.sessions import SessionCtx, SessionFiles
from statekeeper.stores.options import StoreOptions
from statekeeper.stores.rules import (
    apply_patch,
    check_limit,
    check_prunable_kind,
    check_record_ids,
    check_record_listing,
    check_tenant_and_id,
    decode_cursor,
    encode_cursor,
    matches_query,
    new_session_record,
    prunable,
    record_text,
)
from statekeeper.stores.worker import Worker

__all__ = ["FileStore", "Recovery", "UnsafePathError", "open_files"]

T = TypeVar("T")
_MARKER = ".statekeeper"


class FileStore(ClosingStore):
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
        self._engine = AppendEngine(self, max_payload_bytes=max_payload_bytes)
        self._closed = False

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

    async def update_session(
        self,
        tenant: str,
        session_id: str,
        patch: SessionPatch,
        *,
        expected_version: int | None = None,
    ) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)

        return await self._engine.update(
            tenant, session_id, patch, expected_version=expected_version
        )

    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        validate_id(tenant, "tenant")
        position = decode_cursor(query.cursor) if query.cursor is not None else None
        rows = await self._call(lambda: self._sessions.all_records(tenant))
        rows = sorted(
            (r for r in rows if matches_query(r, query)),
            key=lambda r: (r.last_active, r.id),
            reverse=True,
        )
        if position is not None:
            rows = [r for r in rows if (r.last_active, r.id) < position]
        rows = rows[query.offset :]
        items = rows[: query.limit]
        more = len(rows) > query.limit
        cursor = encode_cursor(items[-1].last_active, items[-1].id) if more else None
        return Page(items=items, next_cursor=cursor)

    async def delete_session(self, tenant: str, session_id: str) -> None:
        check_tenant_and_id(tenant, session_id)
        self._engine.forget(tenant, session_id)
        await self._call(lambda: self._sessions.delete(tenant, session_id))

    # -- transcripts ---------------------------------------------------------------------

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
        check_tenant_and_id(tenant, session_id)
        return await self._engine.append(
            tenant,
            session_id,
            drafts,
            expected_version=expected_version,
            patch=patch,
            move_head=move_head,
        )

    def _snapshot(self, ctx: SessionCtx, ids: Sequence[str]) -> Snapshot:
        """The head and stored entries among ``ids``, under the session's lock."""
        fd, index = self._sessions.open_log(ctx, write=False)
        try:
            known = sorted(index.ids[i] for i in ids if i in index.ids)
            found = self._sessions.read_lines(fd, index, known) if fd is not None and known else []
        finally:
            if fd is not None:
                os.close(fd)
        return Snapshot(ctx.head.gen, ctx.head.record, {e.id: e for e in found})

    async def load_head(self, tenant: str, session_id: str, ids: Sequence[str]) -> Snapshot:
        """The engine's read primitive."""
        return await self._in_session(tenant, session_id, lambda ctx: self._snapshot(ctx, ids))

    async def commit_head(
        self,
        tenant: str,
        session_id: str,
        base: Snapshot,
        head: SessionRecord,
        writes: Sequence[Write],
        ids: Sequence[str],
    ) -> Snapshot | None:
        """The engine's write primitive: compare (gen, version) and ids under the lock."""
        sessions = self._sessions

        def commit(ctx: SessionCtx) -> Snapshot | None:
            stored = ctx.head
            if (stored.gen, stored.record.version) != (base.token, base.record.version):
                return self._snapshot(ctx, ids)
            if not writes:
                sessions.save_head(ctx, head, stored.gen, stored.size)
                return None
            fd, index = sessions.open_log(ctx, write=True)
            assert fd is not None
            try:
                if any(i in index.ids for i in ids):
                    os.close(fd)
                    fd = -1
                    return self._snapshot(ctx, ids)
                lines = "".join(entry_line(e, text, side) for e, text, side in writes)
                end = sessions.write_lines(ctx, fd, index, lines.encode())
                # The commit point: the head now says the new lines are part of the log.
                sessions.save_head(ctx, head, stored.gen, end)
                return None
            except BaseException:
                sessions.indexes.pop(ctx.key, None)  # it may hold lines never committed
                raise
            finally:
                if fd >= 0:
                    os.close(fd)

        return await self._in_session(tenant, session_id, commit)

    async def read_entries(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        check_tenant_and_id(tenant, session_id)
        check_limit(limit)

        def read(ctx: SessionCtx) -> list[Entry]:
            fd, index = self._sessions.open_log(ctx, write=False)
            if fd is None:
                return []
            try:
                positions = index.positions(after_seq, until_seq, limit)
                return self._sessions.read_lines(fd, index, positions)
            finally:
                os.close(fd)

        return await self._in_session(tenant, session_id, read)

    async def get_entry(self, tenant: str, session_id: str, entry_id: str) -> Entry:
        check_tenant_and_id(tenant, session_id)
        validate_id(entry_id, "entry id")

        def get(ctx: SessionCtx) -> Entry:
            fd, index = self._sessions.open_log(ctx, write=False)
            try:
                position = index.ids.get(entry_id)
                if fd is None or position is None:
                    raise NotFoundError(f"entry {entry_id!r} not found in session {session_id!r}")
                return self._sessions.read_lines(fd, index, [position])[0]
            finally:
                if fd is not None:
                    os.close(fd)

        return await self._in_session(tenant, session_id, get)

    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        check_tenant_and_id(tenant, session_id)
        check_prunable_kind(kind)

        def prune(ctx: SessionCtx) -> int:
            fd, index = self._sessions.open_log(ctx, write=False)
            if fd is None:
                return 0
            try:
                stubs = [
                    Entry(seq, name, parent, line_kind or "corrupt", EPOCH, {})
                    for seq, name, parent, line_kind in zip(
                        index.seqs, index.names, index.parents, index.kinds, strict=True
                    )
                ]
                doomed = set(prunable(stubs, ctx.head.record, kind, before_seq, id_prefix))
                data = read_at(fd, 0, index.end) if doomed else b""
            finally:
                os.close(fd)
            if not doomed:
                return 0
            gen = new_gen()
            kept = [header_line("transcript", "session", ctx.sid, gen)]
            for stub, start, stop in zip(stubs, index.starts, index.stops, strict=True):
                if stub.seq not in doomed or stub.kind != kind:
                    line = data[start:stop]
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
            log = b"".join(kept)
            # Transcript first, then the head: a crash in between is completed by the next
            # operation (the transcript's gen is not the head's; see SessionFiles).
            self._files.write_atomic(ctx.log_path, log, backup=False)
            self._sessions.indexes.pop(ctx.key, None)
            record = apply_patch(ctx.head.record, SessionPatch(), now=utcnow())
            self._sessions.save_head(ctx, record, gen, len(log))
            return len(doomed)

        async with self._engine.serial(tenant, session_id):
            self._engine.forget(tenant, session_id)
            return await self._in_session(tenant, session_id, prune)

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
    ) -> list[VersionedRecord]:
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
        check_record_ids(tenant, log_id)
        texts = [
            encode_json(e.payload, what=f"event {e.stream}/{e.kind}", limit=self.max_payload_bytes)
            for e in events
        ]
        if not events:
            return []
        return await self._call(lambda: self._events.append(tenant, log_id, events, texts))

    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        check_record_ids(tenant, log_id)
        check_limit(limit)
        return await self._call(lambda: self._events.read(tenant, log_id, after_seq, limit))

    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        check_record_ids(tenant, log_id)
        await self._call(lambda: self._events.delete(tenant, log_id))


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
