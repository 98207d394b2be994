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
processes, each read-modify-write holds an ``flock`` on a per-session (per record
namespace, per event log) lock file, so writers never interleave or lose updates and
different sessions never wait for each other.

**Damage and recovery** (each case is reported, see `Recovery` and `FileStore.recoveries`):

- bytes after the committed end (a crash mid-append) are ignored, and cut off by the next
  append; a line that cannot be decoded in the middle of a transcript is served as a
  ``corrupt`` entry, and the valid entries around it are served as usual;
- an unreadable head falls back to ``<id>.json.bak`` (the version just before), and the
  whole entries written after that backup are kept; the version jumps by 2 so a writer
  holding the lost version gets a `ConflictError`, never a blind overwrite;
- if the backup is unreadable too, the damaged files are moved to ``quarantine/`` and the
  transcript's whole lines are copied into a new session ``recovered-<id>`` whose
  metadata names the lost session (``recovered_from``) and what happened
  (``recovery``); the call that found the damage raises `StoreCorruptError` naming the new
  session, and later lookups of the lost id raise `NotFoundError` that names it too;
- an unreadable record falls back to its backup; without one it is quarantined:
  `get_record` raises `StoreCorruptError` once, listings skip it (reported), and a put
  starts it again at version 1.

Ids must be unique ignoring case on a case-insensitive file system; the store refuses to
open a root on one (two tenants "Alice" and "alice" would share files).
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import JsonValue

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    AlreadyExistsError,
    InvalidIdError,
    InvalidInputError,
    NotFoundError,
    SchemaVersionError,
    StatekeeperError,
    StoreCorruptError,
    StoreUnavailableError,
)
from statekeeper.ids import MAX_ID_LENGTH, validate_id
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, encode_json, gc_paused, loads
from statekeeper.stores.base import (
    AppendResult,
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
    apply_patch,
    check_tenant_and_id,
    check_version,
    decode_cursor,
    encode_cursor,
    matches_query,
    plan_append,
    prunable,
)
from statekeeper.stores.common import (
    check_expiry,
    check_limit,
    check_prunable_kind,
    check_record_ids,
    check_record_version,
    check_session_record,
    new_session_record,
    record_not_found,
)
from statekeeper.stores.files_layout import (
    FORMAT_VERSION,
    Layout,
    Lock,
    Recovery,
    UnsafePathError,
    read_at,
    translate_os_error,
    write_all,
)
from statekeeper.stores.files_logs import (
    EPOCH,
    EventIndex,
    LogIndex,
    entry_line,
    event_line,
    header_line,
    new_gen,
    parse_entry,
    parse_event,
)
from statekeeper.stores.files_recovery import (
    BadFileError,
    decode_head,
    decode_record,
    encode_head,
    encode_record,
    recovery_record,
    roll_forward,
    salvage_lines,
)
from statekeeper.stores.worker import Worker

__all__ = ["FileStore", "Recovery", "UnsafePathError", "open_files"]

T = TypeVar("T")
_INDEXES_KEPT = 256  # transcripts / event logs whose line index stays in memory
_MARKER = ".statekeeper"


@dataclass(frozen=True, slots=True)
class _Head:
    record: SessionRecord
    gen: str
    size: int
    raw: bytes


@dataclass
class _Ctx:
    """One session operation: where the session's files are, and the lock held on it."""

    tenant: str
    sid: str
    folder: Path
    lock: Lock
    head: _Head

    @property
    def key(self) -> tuple[str, str]:
        return self.tenant, self.sid

    @property
    def head_path(self) -> Path:
        return self.folder / f"{self.sid}.json"

    @property
    def backup_path(self) -> Path:
        return self.folder / f"{self.sid}.json.bak"

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.sid}.jsonl"


class FileStore:
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
        self._files = Layout(self.root, self.durability, lock_timeout)
        self._worker = Worker("statekeeper-files")
        self._heads: dict[tuple[str, str], _Head] = {}
        self._indexes: OrderedDict[tuple[str, str], LogIndex] = OrderedDict()
        self._event_indexes: OrderedDict[tuple[str, str], EventIndex] = OrderedDict()
        self._reported: set[tuple[Any, ...]] = set()
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

    def _prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        marker = self.root / _MARKER
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
        probe = self.root / f".case-probe-{os.urandom(4).hex()}"
        fd = self._files.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.close(fd)
        try:
            insensitive = self._files.exists(probe.with_name(probe.name.upper()))
        finally:
            self._files.unlink(probe)
        if insensitive:
            raise StoreUnavailableError(
                f"{self.root} is on a case-insensitive file system: ids that differ only "
                "in case (tenants 'Alice' and 'alice') would share files. Put the files "
                "store on a case-sensitive file system, or use sqlite://"
            )

    def _remember(self, cache: OrderedDict[tuple[str, str], Any], key: tuple[str, str]) -> None:
        cache.move_to_end(key)
        while len(cache) > _INDEXES_KEPT:
            cache.popitem(last=False)

    def _forget(self, key: tuple[str, str]) -> None:
        self._heads.pop(key, None)
        self._indexes.pop(key, None)

    def _report_once(self, token: tuple[Any, ...], recovery: Recovery) -> None:
        if token not in self._reported:
            self._reported.add(token)
            self._files.report(recovery)

    # -- session heads -------------------------------------------------------------------

    def _session_folder(self, tenant: str, *, create: bool = False) -> Path | None:
        return self._files.directory(tenant, "sessions", create=create)

    def _not_found(self, tenant: str, session_id: str) -> NotFoundError:
        """`NotFoundError`, naming the recovery session if this id was lost to damage."""
        message = f"session {session_id!r} not found"
        try:
            folder = self._files.directory(tenant)
            raw = None if folder is None else self._files.read_bytes(folder / "recoveries.jsonl")
        except (OSError, StatekeeperError):
            raw = None
        for line in (raw or b"").splitlines():
            try:
                doc = loads(line)
            except ValueError:
                continue
            if (
                isinstance(doc, dict)
                and doc.get("kind") == "recovery-session"
                and doc.get("subject") == f"session {session_id}"
            ):
                message = (
                    f"session {session_id!r} not found: it was damaged beyond repair on "
                    f"{doc.get('at')} and its transcript was saved as session "
                    f"{doc.get('recovered_as')!r}"
                )
        return NotFoundError(message)

    def _session_op(self, tenant: str, session_id: str, fn: Callable[[_Ctx], T]) -> T:
        """Run ``fn`` holding the session's lock, with its head loaded (or `NotFoundError`)."""
        folder = self._session_folder(tenant)
        if folder is None or not self._files.exists(folder / f"{session_id}.json"):
            raise self._not_found(tenant, session_id)
        with self._files.locked(tenant, "sessions", session_id) as lock:
            ctx = _Ctx(tenant, session_id, folder, lock, _NO_HEAD)
            ctx.head = self._load_head(ctx)
            return fn(ctx)

    def _load_head(self, ctx: _Ctx) -> _Head:
        raw = self._files.read_bytes(ctx.head_path)
        if raw is None:
            ctx.lock.remove()
            self._forget(ctx.key)
            raise self._not_found(ctx.tenant, ctx.sid)
        cached = self._heads.get(ctx.key)
        if cached is not None and cached.raw == raw:
            return cached
        try:
            record, gen, size = decode_head(raw, ctx.tenant, ctx.sid)
            head = _Head(record, gen, size, raw)
        except BadFileError as exc:
            head = self._recover_head(ctx, str(exc))
        self._heads[ctx.key] = head
        return head

    def _save_head(
        self, ctx: _Ctx, record: SessionRecord, gen: str, size: int, *, backup: bool = True
    ) -> _Head:
        raw = encode_head(record, gen, size)
        self._files.write_atomic(ctx.head_path, raw, backup=backup)
        ctx.head = _Head(record, gen, size, raw)
        self._heads[ctx.key] = ctx.head
        return ctx.head

    def _recover_head(self, ctx: _Ctx, reason: str) -> _Head:
        """The head from its backup (plus later entries), or a recovery session."""
        files = self._files
        subject, where = f"session {ctx.sid}", files.relative(ctx.head_path)
        backup_raw = files.read_bytes(ctx.backup_path)
        backup_problem = "there is no backup"
        if backup_raw is not None:
            try:
                backup = decode_head(backup_raw, ctx.tenant, ctx.sid)
            except BadFileError as exc:
                backup_problem = f"the backup is unreadable too ({exc})"
            else:
                log = files.read_bytes(ctx.log_path)
                record, gen, size, note = roll_forward(*backup, log, now=utcnow())
                moved = files.quarantine(ctx.tenant, ctx.head_path)
                self._indexes.pop(ctx.key, None)
                head = self._save_head(ctx, record, gen, size, backup=False)
                files.report(
                    Recovery(
                        "head-from-backup",
                        ctx.tenant,
                        subject,
                        f"{reason}; restored version {backup[0].version} from the backup as "
                        f"version {record.version}{note}",
                        where,
                        quarantined=(moved,) if moved else (),
                    )
                )
                return head
        recovered = self._recovery_session(ctx, f"{reason}; {backup_problem}")
        raise StoreCorruptError(
            f"session {ctx.sid!r} could not be read ({reason}; {backup_problem}); its "
            f"transcript was saved as session {recovered!r} and the damaged files were "
            f"moved to {ctx.tenant}/quarantine"
        )

    def _recovery_session(self, ctx: _Ctx, reason: str) -> str:
        """Quarantine a lost session's files; copy its transcript into a new session."""
        files = self._files
        log = files.read_bytes(ctx.log_path) or b""
        lines, summary = salvage_lines(log)
        moved = tuple(
            m
            for m in (
                files.quarantine(ctx.tenant, path)
                for path in (ctx.head_path, ctx.backup_path, ctx.log_path)
            )
            if m
        )
        base = f"recovered-{ctx.sid}"
        if len(base) > MAX_ID_LENGTH:
            digest = hashlib.sha256(ctx.sid.encode()).hexdigest()[:8]
            base = f"recovered-{ctx.sid[:100]}-{digest}"
        number = 1
        while True:
            new_id = validate_id(base if number == 1 else f"{base}-{number}", "session id")
            number += 1
            if files.exists(ctx.folder / f"{new_id}.json"):
                continue
            with files.locked(ctx.tenant, "sessions", new_id):
                if files.exists(ctx.folder / f"{new_id}.json"):
                    continue
                gen = new_gen()
                data = header_line("transcript", "session", new_id, gen) + b"".join(lines)
                record = recovery_record(
                    new_id, ctx.tenant, ctx.sid, reason, summary, moved, now=utcnow()
                )
                files.write_atomic(ctx.folder / f"{new_id}.jsonl", data, backup=False)
                raw = encode_head(record, gen, len(data))
                files.write_atomic(ctx.folder / f"{new_id}.json", raw, backup=False)
                break
        ctx.lock.remove()
        self._forget(ctx.key)
        files.report(
            Recovery(
                "recovery-session",
                ctx.tenant,
                f"session {ctx.sid}",
                f"{reason}; {summary['entries']} entries copied to the new session",
                files.relative(ctx.head_path),
                recovered_as=new_id,
                quarantined=moved,
            )
        )
        return new_id

    # -- transcript files --------------------------------------------------------------

    def _open_log(self, ctx: _Ctx, *, write: bool) -> tuple[int | None, LogIndex]:
        """An open transcript file and its index, synced to the head (ctx.head may move)."""
        if ctx.head.size == 0 and not write:
            return None, LogIndex(ctx.head.gen, (0, 0))
        flags = os.O_RDWR | os.O_CREAT if write else os.O_RDONLY
        try:
            fd = self._files.open(ctx.log_path, flags)
        except FileNotFoundError:
            self._report_once(
                ("log-missing", ctx.key, ctx.head.raw),
                Recovery(
                    "log-missing",
                    ctx.tenant,
                    f"session {ctx.sid}",
                    f"the transcript file is gone, but the head says {ctx.head.size} bytes "
                    "were written; the session is served without its entries",
                    self._files.relative(ctx.log_path),
                ),
            )
            return None, LogIndex(ctx.head.gen, (0, 0))
        try:
            info = os.fstat(fd)
            if ctx.head.size == 0:
                return fd, LogIndex(ctx.head.gen, (info.st_dev, info.st_ino))
            return fd, self._sync_index(ctx, fd, info)
        except BaseException:
            os.close(fd)
            raise

    def _sync_index(self, ctx: _Ctx, fd: int, info: os.stat_result) -> LogIndex:
        head = ctx.head
        file_id = (info.st_dev, info.st_ino)
        limit = min(head.size, info.st_size)
        if info.st_size < head.size:
            self._report_once(
                ("log-truncated", ctx.key, head.raw, info.st_size),
                Recovery(
                    "log-truncated",
                    ctx.tenant,
                    f"session {ctx.sid}",
                    f"the transcript has {info.st_size} bytes but {head.size} were committed; "
                    "the entries that remain are served (a cut line as a corrupt entry)",
                    self._files.relative(ctx.log_path),
                ),
            )
        index = self._indexes.get(ctx.key)
        if index is None or (index.gen, index.file_id) != (head.gen, file_id) or index.end > limit:
            index = LogIndex(head.gen, file_id)
            index.scan(read_at(fd, 0, limit), 0)
            if index.header_gen is not None and index.header_gen != head.gen:
                index = self._complete_prune(ctx, fd, info, index.header_gen)
            elif index.header_damaged:
                self._report_once(
                    ("corrupt-header", ctx.key, head.gen),
                    Recovery(
                        "corrupt-header",
                        ctx.tenant,
                        f"session {ctx.sid}",
                        "the first line of the transcript is damaged; its entries are served",
                        self._files.relative(ctx.log_path),
                    ),
                )
        elif index.end < limit:
            index.scan(read_at(fd, index.end, limit - index.end), index.end)
        self._indexes[ctx.key] = index
        self._remember(self._indexes, ctx.key)
        return index

    def _complete_prune(self, ctx: _Ctx, fd: int, info: os.stat_result, gen: str) -> LogIndex:
        """The transcript was replaced by a prune that stopped before its head write."""
        data = read_at(fd, 0, info.st_size)
        end = data.rfind(b"\n") + 1
        record = apply_patch(ctx.head.record, SessionPatch(), now=utcnow())
        self._save_head(ctx, record, gen, end)
        self._files.report(
            Recovery(
                "prune-completed",
                ctx.tenant,
                f"session {ctx.sid}",
                "a prune replaced the transcript but stopped before updating the head; "
                "the head now points to the pruned transcript",
                self._files.relative(ctx.head_path),
            )
        )
        index = LogIndex(gen, (info.st_dev, info.st_ino))
        index.scan(data[:end], 0)
        return index

    def _read_lines(self, fd: int, index: LogIndex, positions: Sequence[int]) -> list[Entry]:
        if not positions:
            return []
        base = index.starts[positions[0]]
        data = read_at(fd, base, index.stops[positions[-1]] - base)
        out: list[Entry] = []
        with gc_paused():
            for i in positions:
                raw = data[index.starts[i] - base : index.stops[i] - base].rstrip(b"\n")
                out.append(parse_entry(raw, index.seqs[i], index.names[i], index.parents[i]))
        return out

    def _write_lines(self, ctx: _Ctx, fd: int, index: LogIndex, data: bytes) -> tuple[int, bool]:
        """Write lines after the committed end; (new end, whether ``index`` still fits)."""
        committed = ctx.head.size
        size = os.fstat(fd).st_size
        offset, prefix, clean = committed, b"", index.end == committed
        if size > committed:
            self._files.report(
                Recovery(
                    "uncommitted-tail",
                    ctx.tenant,
                    f"session {ctx.sid}",
                    f"cut {size - committed} bytes after the last committed entry (an append "
                    "that crashed before it was acknowledged)",
                    self._files.relative(ctx.log_path),
                )
            )
            os.ftruncate(fd, committed)
        elif size < committed:
            offset, clean = size, False
            if size and read_at(fd, size - 1, 1) != b"\n":
                prefix = b"\n"  # keep a cut line whole, as a corrupt entry
        if offset == 0:
            prefix = header_line("transcript", "session", ctx.sid, ctx.head.gen)
            clean = clean and committed == 0
        payload = prefix + data
        try:
            write_all(fd, payload, offset)
            if self._files.sync:
                os.fdatasync(fd)
        except BaseException:
            try:
                os.ftruncate(fd, offset)
            except OSError:
                pass
            raise
        if offset == 0 and self._files.sync:
            self._files.fsync_dir(ctx.folder)
        if clean:
            index.scan(payload, offset)
        return offset + len(payload), clean

    # -- sessions ------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        record = new_session_record(record, self.max_payload_bytes)

        def create() -> SessionRecord:
            folder = self._session_folder(record.tenant, create=True)
            assert folder is not None
            with self._files.locked(record.tenant, "sessions", record.id) as lock:
                ctx = _Ctx(record.tenant, record.id, folder, lock, _NO_HEAD)
                if self._files.exists(ctx.head_path):
                    raise AlreadyExistsError(f"session {record.id!r} already exists")
                # Leftovers of a delete that stopped half way belong to no session.
                self._files.unlink(ctx.backup_path)
                self._files.unlink(ctx.log_path)
                self._forget(ctx.key)
                self._save_head(ctx, record, new_gen(), 0, backup=False)
                return record

        return await self._call(create)

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)
        return await self._call(
            lambda: self._session_op(tenant, session_id, lambda ctx: ctx.head.record)
        )

    async def update_session(
        self,
        tenant: str,
        session_id: str,
        patch: SessionPatch,
        *,
        expected_version: int | None = None,
    ) -> SessionRecord:
        check_tenant_and_id(tenant, session_id)

        def update(ctx: _Ctx) -> SessionRecord:
            head = ctx.head
            check_version(head.record, expected_version)
            updated = check_session_record(
                apply_patch(head.record, patch, now=utcnow()), self.max_payload_bytes
            )
            self._save_head(ctx, updated, head.gen, head.size)
            return updated

        return await self._call(lambda: self._session_op(tenant, session_id, update))

    async def list_sessions(self, tenant: str, query: SessionQuery) -> Page:
        validate_id(tenant, "tenant")
        position = decode_cursor(query.cursor) if query.cursor is not None else None
        rows = await self._call(lambda: self._all_sessions(tenant))
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

    def _all_sessions(self, tenant: str) -> list[SessionRecord]:
        folder = self._session_folder(tenant)
        if folder is None:
            return []
        records: list[SessionRecord] = []
        repaired = False
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".json") or name.startswith("."):
                continue
            session_id = name[:-5]
            try:
                validate_id(session_id)
                raw = self._files.read_bytes(folder / name)
            except (InvalidIdError, UnsafePathError):
                continue  # not a file this store wrote
            if raw is None:
                continue  # deleted meanwhile
            cached = self._heads.get((tenant, session_id))
            if cached is not None and cached.raw == raw:
                records.append(cached.record)
                continue
            try:
                records.append(decode_head(raw, tenant, session_id)[0])
            except BadFileError:
                try:
                    records.append(
                        self._session_op(tenant, session_id, lambda ctx: ctx.head.record)
                    )
                except (StoreCorruptError, NotFoundError):
                    repaired = True  # now a recovery session: list the folder again
        return self._all_sessions(tenant) if repaired else records

    async def delete_session(self, tenant: str, session_id: str) -> None:
        check_tenant_and_id(tenant, session_id)

        def delete() -> None:
            folder = self._session_folder(tenant)
            head_path = None if folder is None else folder / f"{session_id}.json"
            if folder is None or head_path is None or not self._files.exists(head_path):
                raise self._not_found(tenant, session_id)
            with self._files.locked(tenant, "sessions", session_id) as lock:
                # No need to read the head: a damaged session can be deleted too.
                found = self._files.unlink(head_path)
                self._files.unlink(folder / f"{session_id}.json.bak")
                self._files.unlink(folder / f"{session_id}.jsonl")
                if self._files.sync:
                    self._files.fsync_dir(folder)
                self._forget((tenant, session_id))
                lock.remove()
                if not found:
                    raise self._not_found(tenant, session_id)

        await self._call(delete)

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

        def append(ctx: _Ctx) -> AppendResult:
            fd, index = self._open_log(ctx, write=True)
            assert fd is not None
            try:
                head = ctx.head
                known = [index.ids[d.id] for d in drafts if d.id in index.ids]
                existing = {e.id: e for e in self._read_lines(fd, index, sorted(known))}
                plan = plan_append(
                    head.record,
                    drafts,
                    existing,
                    expected_version=expected_version,
                    patch=patch,
                    move_head=move_head,
                    max_payload_bytes=self.max_payload_bytes,
                    now=utcnow(),
                )
                if plan.replayed:
                    return AppendResult(session=head.record, entries=plan.replayed, replayed=True)
                if patch is not None and patch.set:
                    check_session_record(plan.session, self.max_payload_bytes)
                lines = "".join(
                    entry_line(entry, text, draft.side)
                    for entry, text, draft in zip(plan.entries, plan.encoded, drafts, strict=True)
                ).encode()
                end, clean = self._write_lines(ctx, fd, index, lines)
                self._save_head(ctx, plan.session, head.gen, end)
                if clean:
                    self._indexes[ctx.key] = index
                    self._remember(self._indexes, ctx.key)
                else:
                    self._indexes.pop(ctx.key, None)
                return AppendResult(session=plan.session, entries=plan.entries)
            except BaseException:
                self._indexes.pop(ctx.key, None)  # it may hold lines that were not committed
                raise
            finally:
                os.close(fd)

        return await self._call(lambda: self._session_op(tenant, session_id, append))

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

        def read(ctx: _Ctx) -> list[Entry]:
            fd, index = self._open_log(ctx, write=False)
            if fd is None:
                return []
            try:
                return self._read_lines(fd, index, index.positions(after_seq, until_seq, limit))
            finally:
                os.close(fd)

        return await self._call(lambda: self._session_op(tenant, session_id, read))

    async def get_entry(self, tenant: str, session_id: str, entry_id: str) -> Entry:
        check_tenant_and_id(tenant, session_id)
        validate_id(entry_id, "entry id")

        def get(ctx: _Ctx) -> Entry:
            fd, index = self._open_log(ctx, write=False)
            try:
                position = index.ids.get(entry_id)
                if fd is None or position is None:
                    raise NotFoundError(f"entry {entry_id!r} not found in session {session_id!r}")
                return self._read_lines(fd, index, [position])[0]
            finally:
                if fd is not None:
                    os.close(fd)

        return await self._call(lambda: self._session_op(tenant, session_id, get))

    async def prune_entries(
        self, tenant: str, session_id: str, *, kind: str, before_seq: int, id_prefix: str = ""
    ) -> int:
        check_tenant_and_id(tenant, session_id)
        check_prunable_kind(kind)

        def prune(ctx: _Ctx) -> int:
            fd, index = self._open_log(ctx, write=False)
            if fd is None:
                return 0
            try:
                stubs = [
                    Entry(seq, name, parent, kind_ or "corrupt", EPOCH, {})
                    for seq, name, parent, kind_ in zip(
                        index.seqs, index.names, index.parents, index.kinds, strict=True
                    )
                ]
                doomed = set(prunable(stubs, ctx.head.record, kind, before_seq, id_prefix))
                if not doomed:
                    return 0
                data = read_at(fd, 0, index.end)
            finally:
                os.close(fd)
            gen = new_gen()
            parts = [header_line("transcript", "session", ctx.sid, gen)]
            for i, seq in enumerate(index.seqs):
                if seq not in doomed or (index.kinds[i] or "corrupt") != kind:
                    line = data[index.starts[i] : index.stops[i]]
                    parts.append(line if line.endswith(b"\n") else line + b"\n")
            new_log = b"".join(parts)
            # Transcript first, then the head: a crash in between is completed on the next
            # read (the transcript's gen is newer than the head's; see _complete_prune).
            self._files.write_atomic(ctx.log_path, new_log, backup=False)
            self._indexes.pop(ctx.key, None)
            record = apply_patch(ctx.head.record, SessionPatch(), now=utcnow())
            self._save_head(ctx, record, gen, len(new_log))
            return len(doomed)

        return await self._call(lambda: self._session_op(tenant, session_id, prune))

    # -- records -------------------------------------------------------------------------

    def _read_record(
        self, tenant: str, namespace: str, key: str, path: Path, *, locked: bool
    ) -> tuple[VersionedRecord | None, bool]:
        """(the record or None, whether it was lost to damage just now)."""
        raw = self._files.read_bytes(path)
        if raw is None:
            return None, False
        try:
            return decode_record(raw, namespace, key), False
        except BadFileError as exc:
            if locked:
                return self._repair_record(tenant, namespace, key, path, str(exc))
            with self._files.locked(tenant, "records", namespace):
                return self._read_record(tenant, namespace, key, path, locked=True)

    def _repair_record(
        self, tenant: str, namespace: str, key: str, path: Path, reason: str
    ) -> tuple[VersionedRecord | None, bool]:
        files = self._files
        backup_path = path.with_name(path.name + ".bak")
        backup_raw = files.read_bytes(backup_path)
        subject, where = f"record {namespace}/{key}", files.relative(path)
        if backup_raw is not None:
            try:
                restored = decode_record(backup_raw, namespace, key)
            except BadFileError as exc:
                reason = f"{reason}; the backup is unreadable too ({exc})"
            else:
                moved = files.quarantine(tenant, path)
                files.write_atomic(path, backup_raw, backup=False)
                files.report(
                    Recovery(
                        "record-from-backup",
                        tenant,
                        subject,
                        f"{reason}; restored version {restored.version} from the backup",
                        where,
                        quarantined=(moved,) if moved else (),
                    )
                )
                return restored, False
        moved_all = tuple(m for m in (files.quarantine(tenant, p) for p in (path,)) if m)
        if files.exists(backup_path):
            moved_all += tuple(m for m in [files.quarantine(tenant, backup_path)] if m)
        files.report(
            Recovery(
                "record-lost",
                tenant,
                subject,
                f"{reason}; no usable backup, the damaged files were quarantined",
                where,
                quarantined=moved_all,
            )
        )
        return None, True

    def _record_path(self, tenant: str, namespace: str, key: str, *, create: bool) -> Path | None:
        folder = self._files.directory(tenant, "records", namespace, create=create)
        return None if folder is None else self._files.file(folder, f"{key}.json")

    async def get_record(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        check_record_ids(tenant, namespace, key)

        def get() -> VersionedRecord:
            path = self._record_path(tenant, namespace, key, create=False)
            found, lost = (
                (None, False)
                if path is None
                else self._read_record(tenant, namespace, key, path, locked=False)
            )
            if lost:
                raise StoreCorruptError(
                    f"record {namespace}/{key} is damaged and has no usable backup; the file "
                    f"was moved to {tenant}/quarantine"
                )
            if found is None or not _live(found, utcnow()):
                raise record_not_found(namespace, key)
            return found

        return await self._call(get)

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
        check_record_ids(tenant, namespace, key)
        check_expiry(expires_at)
        text = encode_json(value, what=f"record {namespace}/{key}", limit=self.max_payload_bytes)

        def put() -> VersionedRecord:
            path = self._record_path(tenant, namespace, key, create=True)
            assert path is not None
            with self._files.locked(tenant, "records", namespace):
                found, _ = self._read_record(tenant, namespace, key, path, locked=True)
                now = utcnow()
                version = found.version if found is not None and _live(found, now) else 0
                check_record_version(namespace, key, version, expected_version)
                raw = encode_record(namespace, key, version + 1, now, expires_at, text)
                self._files.write_atomic(path, raw, backup=True)
            return VersionedRecord(
                namespace=namespace,
                key=key,
                value=loads(text),
                version=version + 1,
                updated_at=now,
                expires_at=expires_at,
            )

        return await self._call(put)

    async def list_records(
        self,
        tenant: str,
        namespace: str,
        *,
        prefix: str = "",
        after_key: str | None = None,
        limit: int = 100,
    ) -> list[VersionedRecord]:
        check_record_ids(tenant, namespace)
        check_limit(limit)
        if prefix:
            validate_id(prefix, "key prefix")

        def run() -> list[VersionedRecord]:
            folder = self._files.directory(tenant, "records", namespace)
            if folder is None:
                return []
            keys = sorted(
                name[:-5]
                for name in os.listdir(folder)
                if name.endswith(".json") and not name.startswith(".")
            )
            out: list[VersionedRecord] = []
            now = utcnow()
            for key in keys:
                if len(out) >= limit:
                    break
                if not key.startswith(prefix) or (after_key is not None and key <= after_key):
                    continue
                try:
                    validate_id(key)
                    found, _ = self._read_record(
                        tenant, namespace, key, folder / f"{key}.json", locked=False
                    )
                except (InvalidIdError, UnsafePathError):
                    continue  # not a file this store wrote
                if found is not None and _live(found, now):
                    out.append(found)
            return out

        return await self._call(run)

    async def delete_record(
        self, tenant: str, namespace: str, key: str, *, expected_version: int | None = None
    ) -> None:
        check_record_ids(tenant, namespace, key)

        def delete() -> None:
            path = self._record_path(tenant, namespace, key, create=False)
            if path is None or not self._files.exists(path):
                raise record_not_found(namespace, key)
            with self._files.locked(tenant, "records", namespace):
                found, lost = self._read_record(tenant, namespace, key, path, locked=True)
                if lost:
                    return  # already moved out of the way, as a delete would have
                if found is None or not _live(found, utcnow()):
                    raise record_not_found(namespace, key)
                check_record_version(namespace, key, found.version, expected_version)
                self._files.unlink(path)
                self._files.unlink(path.with_name(path.name + ".bak"))
                if self._files.sync:
                    self._files.fsync_dir(path.parent)

        await self._call(delete)

    # -- events --------------------------------------------------------------------------

    def _event_index(self, tenant: str, log_id: str, fd: int, info: os.stat_result) -> EventIndex:
        key = (tenant, log_id)
        file_id = (info.st_dev, info.st_ino)
        index = self._event_indexes.get(key)
        header = read_at(fd, 0, 512).split(b"\n", 1)[0]
        if (
            index is None
            or index.gen is None
            or index.file_id != file_id
            or index.end > info.st_size
            or f'"gen":"{index.gen}"'.encode() not in header
        ):
            index = EventIndex(None, file_id)
            index.scan(read_at(fd, 0, info.st_size), 0)
            if index.header_damaged:
                self._report_once(
                    ("corrupt-header", key, file_id),
                    Recovery(
                        "corrupt-header",
                        tenant,
                        f"events {log_id}",
                        "the first line of the event log is damaged; its events are served",
                        self._files.relative(Path(f"{tenant}/events/{log_id}.jsonl")),
                    ),
                )
        elif index.end < info.st_size:
            index.scan(read_at(fd, index.end, info.st_size - index.end), index.end)
        self._event_indexes[key] = index
        self._remember(self._event_indexes, key)
        return index

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

        def append() -> list[Event]:
            folder = self._files.directory(tenant, "events", create=True)
            assert folder is not None
            path = self._files.file(folder, f"{log_id}.jsonl")
            with self._files.locked(tenant, "events", log_id):
                fd = self._files.open(path, os.O_RDWR | os.O_CREAT)
                try:
                    return self._append_events(tenant, log_id, events, texts, fd, path)
                except BaseException:
                    self._event_indexes.pop((tenant, log_id), None)
                    raise
                finally:
                    os.close(fd)

        return await self._call(append)

    def _append_events(
        self,
        tenant: str,
        log_id: str,
        events: Sequence[EventDraft],
        texts: list[str],
        fd: int,
        path: Path,
    ) -> list[Event]:
        info = os.fstat(fd)
        index = self._event_index(tenant, log_id, fd, info)
        committed = index.end
        if info.st_size > committed:
            self._files.report(
                Recovery(
                    "uncommitted-tail",
                    tenant,
                    f"events {log_id}",
                    f"cut {info.st_size - committed} bytes after the last committed event "
                    "(an append that crashed before it was acknowledged)",
                    self._files.relative(path),
                )
            )
            os.ftruncate(fd, committed)
        prefix = b""
        if committed == 0:
            index = EventIndex(new_gen(), (info.st_dev, info.st_ino))
            prefix = header_line("events", "log", log_id, index.gen or "")
        first = index.last_seq() + 1
        last = len(events) - 1
        lines = "".join(
            event_line(first + i, e.stream, e.kind, e.ts, text, more=i < last)
            for i, (e, text) in enumerate(zip(events, texts, strict=True))
        )
        payload = prefix + lines.encode()
        try:
            write_all(fd, payload, committed)
            if self._files.sync:
                os.fdatasync(fd)
        except BaseException:
            try:
                os.ftruncate(fd, committed)
            except OSError:
                pass
            raise
        if committed == 0 and self._files.sync:
            self._files.fsync_dir(path.parent)
        index.scan(payload, committed)
        self._event_indexes[tenant, log_id] = index
        return [
            Event(log_id, first + i, e.stream, e.kind, e.ts, loads(text))
            for i, (e, text) in enumerate(zip(events, texts, strict=True))
        ]

    async def read_events(
        self, tenant: str, log_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]:
        check_record_ids(tenant, log_id)
        check_limit(limit)

        def read() -> list[Event]:
            # No lock: only whole, finished batches count, and they never change.
            folder = self._files.directory(tenant, "events")
            if folder is None:
                return []
            try:
                fd = self._files.open(self._files.file(folder, f"{log_id}.jsonl"), os.O_RDONLY)
            except FileNotFoundError:
                return []
            try:
                index = self._event_index(tenant, log_id, fd, os.fstat(fd))
                positions = index.positions(after_seq, limit)
                if not positions:
                    return []
                base = index.starts[positions[0]]
                data = read_at(fd, base, index.stops[positions[-1]] - base)
            finally:
                os.close(fd)
            with gc_paused():
                return [
                    parse_event(
                        data[index.starts[i] - base : index.stops[i] - base - 1],
                        log_id,
                        index.seqs[i],
                    )
                    for i in positions
                ]

        return await self._call(read)

    async def delete_event_log(self, tenant: str, log_id: str) -> None:
        check_record_ids(tenant, log_id)

        def delete() -> None:
            folder = self._files.directory(tenant, "events")
            if folder is None:
                return
            path = self._files.file(folder, f"{log_id}.jsonl")
            if not self._files.exists(path):
                return
            with self._files.locked(tenant, "events", log_id) as lock:
                self._files.unlink(path)
                if self._files.sync:
                    self._files.fsync_dir(folder)
                self._event_indexes.pop((tenant, log_id), None)
                lock.remove()

        await self._call(delete)


_NO_HEAD = _Head(SessionRecord(id="none", tenant="none"), "", 0, b"")


def _live(record: VersionedRecord, now: datetime) -> bool:
    return record.expires_at is None or record.expires_at > now


def _option(options: dict[str, str], name: str, kind: type[int] | type[float], default: T) -> T:
    raw = options.pop(name, None)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise InvalidInputError(f"store option {name}={raw!r} is not a valid number") from None
    if value <= 0:
        raise InvalidInputError(f"store option {name}={raw!r} must be greater than 0")
    return value  # type: ignore[return-value]


async def open_files(location: str, options: dict[str, str]) -> FileStore:
    """``files:///absolute/dir`` or ``files://relative/dir``.

    Options: ``durability=power|process`` (default power: fsync every write),
    ``max_payload_bytes=<n>``, ``lock_timeout=<seconds>`` (default 30).
    """
    if not location:
        raise InvalidInputError("files URL needs a directory, e.g. files:///var/lib/agents")
    options = dict(options)
    durability = options.pop("durability", Durability.POWER.value)
    if durability not in {d.value for d in Durability}:
        raise InvalidInputError(
            f"durability={durability!r} is not one of: {', '.join(d.value for d in Durability)}"
        )
    limit = _option(options, "max_payload_bytes", int, DEFAULT_MAX_PAYLOAD_BYTES)
    lock_timeout = _option(options, "lock_timeout", float, 30.0)
    if options:
        raise InvalidInputError(f"unknown files store option(s): {', '.join(sorted(options))}")
    return await FileStore.open(
        location,
        durability=Durability(durability),
        max_payload_bytes=limit,
        lock_timeout=lock_timeout,
    )
