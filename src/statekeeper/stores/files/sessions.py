"""Session heads and transcript files of the ``files://`` store.

`SessionFiles` runs every session operation holding the session's lock with its head
loaded (`SessionFiles.run`), falls back to the backup or a recovery session when a head
is damaged, and keeps each transcript's line index in step with the head, so the store
only applies the protocol's rules. All methods block: call them on the
store's worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    AlreadyExistsError,
    InvalidIdError,
    NotFoundError,
    StatekeeperError,
    StoreCorruptError,
)
from statekeeper.ids import MAX_ID_LENGTH, validate_id
from statekeeper.jsoncodec import gc_paused
from statekeeper.stores.base import CorruptItem, Entry, SessionPatch, SessionRecord
from statekeeper.stores.files.layout import (
    Layout,
    Lock,
    Recovery,
    UnsafePathError,
    child,
    read_at,
    write_all,
)
from statekeeper.stores.files.logs import (
    LogIndex,
    header_line,
    new_gen,
    parse_entry,
    remember,
)
from statekeeper.stores.files.lost import (
    LOST_SUFFIX,
    SESSION_FIX,
    Lost,
    read_lost,
    session_gone,
    session_not_found,
    write_lost,
)
from statekeeper.stores.files.recovery import (
    BadFileError,
    decode_head,
    encode_head,
    recovery_record,
    roll_forward,
    salvage_lines,
)
from statekeeper.stores.rules import apply_patch, corrupt_item

__all__ = ["Head", "SessionCtx", "SessionFiles"]

T = TypeVar("T")
HEADS_KEPT = 4096
"""Parsed heads a store keeps (a head is re-read on every use; this only skips parsing)."""


@dataclass(frozen=True, slots=True)
class Head:
    """A session head as stored: the record, the transcript's gen and committed bytes."""

    record: SessionRecord
    gen: str
    size: int
    raw: bytes


NO_HEAD = Head(SessionRecord(id="none", tenant="none"), "", 0, b"")


@dataclass
class SessionCtx:
    """One session operation: where the session's files are, and the lock held on it."""

    tenant: str
    sid: str
    folder: str
    lock: Lock
    head: Head = NO_HEAD

    @property
    def key(self) -> tuple[str, str]:
        return self.tenant, self.sid

    @property
    def subject(self) -> str:
        return f"session {self.sid}"

    @property
    def head_path(self) -> str:
        return child(self.folder, f"{self.sid}.json")

    @property
    def backup_path(self) -> str:
        return child(self.folder, f"{self.sid}.json.bak")

    @property
    def log_path(self) -> str:
        return child(self.folder, f"{self.sid}.jsonl")

    @property
    def lost_path(self) -> str:
        """The marker of a session lost to damage (see ``lost``)."""
        return child(self.folder, f"{self.sid}{LOST_SUFFIX}")


class SessionFiles:
    """Heads, transcripts and their recovery, for one store."""

    def __init__(self, files: Layout) -> None:
        self.files = files
        self.heads: OrderedDict[tuple[str, str], Head] = OrderedDict()
        self.indexes: OrderedDict[tuple[str, str], LogIndex] = OrderedDict()

    def folder(self, tenant: str, *, create: bool = False) -> str | None:
        return self.files.directory(tenant, "sessions", create=create)

    def forget(self, key: tuple[str, str]) -> None:
        self.heads.pop(key, None)
        self.indexes.pop(key, None)

    def gone(self, tenant: str, session_id: str) -> StatekeeperError:
        """`StoreCorruptError` for a session lost to damage, else `not_found`."""
        return session_gone(self.files, tenant, session_id)

    def not_found(self, tenant: str, session_id: str) -> NotFoundError:
        """`NotFoundError`, naming the recovery session if this id was lost to damage."""
        return session_not_found(self.files, tenant, session_id)

    # -- heads -----------------------------------------------------------------------------

    def run(self, tenant: str, session_id: str, fn: Callable[[SessionCtx], T]) -> T:
        """Run ``fn`` holding the session's lock, with its head loaded (or `NotFoundError`)."""
        folder = self.folder(tenant)
        if folder is None or not self.files.exists(child(folder, f"{session_id}.json")):
            raise self.gone(tenant, session_id)
        with self.files.locked(tenant, "sessions", session_id) as lock:
            ctx = SessionCtx(tenant, session_id, folder, lock)
            ctx.head = self.load_head(ctx)
            return fn(ctx)

    def load_head(self, ctx: SessionCtx) -> Head:
        raw = self.files.read_bytes(ctx.head_path)
        if raw is None:
            ctx.lock.remove()
            self.forget(ctx.key)
            raise self.gone(ctx.tenant, ctx.sid)
        cached = self.heads.get(ctx.key)
        if cached is not None and cached.raw == raw:
            return cached
        try:
            head = Head(*decode_head(raw, ctx.tenant, ctx.sid), raw)
        except BadFileError as exc:
            head = self.recover_head(ctx, str(exc), raw)
        return remember(self.heads, ctx.key, head, HEADS_KEPT)

    def save_head(
        self, ctx: SessionCtx, record: SessionRecord, gen: str, size: int, *, backup: bool = True
    ) -> Head:
        """Replace the head (keeping the old one as backup); it becomes ``ctx.head``."""
        raw = encode_head(record, gen, size)
        self.files.write_atomic(ctx.head_path, raw, backup=backup)
        ctx.head = remember(self.heads, ctx.key, Head(record, gen, size, raw), HEADS_KEPT)
        return ctx.head

    def create(self, record: SessionRecord) -> SessionRecord:
        folder = self.folder(record.tenant, create=True)
        assert folder is not None
        with self.files.locked(record.tenant, "sessions", record.id) as lock:
            ctx = SessionCtx(record.tenant, record.id, folder, lock)
            if self.files.exists(ctx.head_path):
                raise AlreadyExistsError(f"session {record.id!r} already exists")
            # Leftovers of a delete that stopped half way belong to no session; the id
            # of a session lost to damage is free again (its quarantined files stay).
            self.files.unlink(ctx.backup_path)
            self.files.unlink(ctx.log_path)
            self.files.unlink(ctx.lost_path)
            self.forget(ctx.key)
            self.save_head(ctx, record, new_gen(), 0, backup=False)
            return record

    def delete(self, tenant: str, session_id: str) -> None:
        folder = self.folder(tenant)
        names = (f"{session_id}.json", f"{session_id}{LOST_SUFFIX}")
        if folder is None or not any(self.files.exists(child(folder, n)) for n in names):
            raise self.not_found(tenant, session_id)
        with self.files.locked(tenant, "sessions", session_id) as lock:
            ctx = SessionCtx(tenant, session_id, folder, lock)
            # No need to read the head: a damaged session can be deleted too, and one
            # lost to damage loses its marker (its quarantined files stay).
            found = self.files.unlink(ctx.head_path)
            found = self.files.unlink(ctx.lost_path) or found
            self.files.unlink(ctx.backup_path)
            self.files.unlink(ctx.log_path)
            if self.files.sync:
                self.files.fsync_dir(folder)
            self.forget(ctx.key)
            lock.remove()
            if not found:
                raise self.not_found(tenant, session_id)

    def all_records(
        self, tenant: str, *, rescan: bool = True
    ) -> tuple[list[SessionRecord], list[CorruptItem]]:
        """Every session of the tenant, and those lost to damage (until deleted): damaged
        heads are recovered on the way (from the backup, else as a recovery session)."""
        folder = self.folder(tenant)
        if folder is None:
            return [], []
        records: list[SessionRecord] = []
        lost: list[CorruptItem] = []
        names = sorted(os.listdir(folder))
        heads = {name for name in names if name.endswith(".json")}
        again = False
        for name in names:
            if name.endswith(LOST_SUFFIX) and f"{name[:-5]}.json" not in heads:
                lost += self._lost_item(tenant, folder, name[:-5])
            if not name.endswith(".json") or name.startswith("."):
                continue
            session_id = name[:-5]
            try:
                validate_id(session_id)
                raw = self.files.read_bytes(child(folder, name))
            except (InvalidIdError, UnsafePathError):
                continue  # not a file this store wrote
            if raw is None:
                continue  # deleted meanwhile
            cached = self.heads.get((tenant, session_id))
            if cached is not None and cached.raw == raw:
                records.append(cached.record)
                continue
            try:
                records.append(decode_head(raw, tenant, session_id)[0])
            except BadFileError:
                try:
                    records.append(self.run(tenant, session_id, lambda ctx: ctx.head.record))
                except StoreCorruptError as exc:
                    if rescan:
                        again = True  # lost: a marker and a recovery session now
                    else:
                        lost.append(corrupt_item(session_id, exc, raw))
                except NotFoundError:
                    continue  # deleted meanwhile
        if again:
            return self.all_records(tenant, rescan=False)
        return records, lost

    def _lost_item(self, tenant: str, folder: str, session_id: str) -> list[CorruptItem]:
        try:
            validate_id(session_id)
            marker = child(folder, f"{session_id}{LOST_SUFFIX}")
            lost = read_lost(self.files, marker, f"session {session_id!r}")
        except (InvalidIdError, UnsafePathError):
            return []  # not a file this store wrote
        return [] if lost is None else [lost.item(session_id, SESSION_FIX)]

    # -- damaged heads -------------------------------------------------------------------

    def recover_head(self, ctx: SessionCtx, reason: str, raw: bytes) -> Head:
        """The head from its backup (plus later entries), or a recovery session."""
        files = self.files
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
                self.indexes.pop(ctx.key, None)
                head = self.save_head(ctx, record, gen, size, backup=False)
                files.report(
                    Recovery(
                        "head-from-backup",
                        ctx.tenant,
                        ctx.subject,
                        f"{reason}; restored version {backup[0].version} from the backup as "
                        f"version {record.version}{note}",
                        files.relative(ctx.head_path),
                        quarantined=(moved,) if moved else (),
                    )
                )
                return head
        lost = self.recovery_session(ctx, f"{reason}; {backup_problem}", raw)
        raise lost.error(SESSION_FIX)

    def recovery_session(self, ctx: SessionCtx, reason: str, damaged: bytes) -> Lost:
        """Quarantine a lost session's files; copy its transcript into a new session."""
        files = self.files
        lines, summary = salvage_lines(files.read_bytes(ctx.log_path) or b"")
        paths = (ctx.head_path, ctx.backup_path, ctx.log_path)
        moved = tuple(m for m in (files.quarantine(ctx.tenant, p) for p in paths) if m)
        base = f"recovered-{ctx.sid}"
        if len(base) > MAX_ID_LENGTH:
            digest = hashlib.sha256(ctx.sid.encode()).hexdigest()[:8]
            base = f"recovered-{ctx.sid[:100]}-{digest}"
        number = 1
        while True:
            new_id = validate_id(base if number == 1 else f"{base}-{number}", "session id")
            number += 1
            if files.exists(child(ctx.folder, f"{new_id}.json")):
                continue
            with files.locked(ctx.tenant, "sessions", new_id):
                if files.exists(child(ctx.folder, f"{new_id}.json")):
                    continue
                gen = new_gen()
                data = header_line("transcript", "session", new_id, gen) + b"".join(lines)
                record = recovery_record(
                    new_id, ctx.tenant, ctx.sid, reason, summary, moved, now=utcnow()
                )
                files.write_atomic(child(ctx.folder, f"{new_id}.jsonl"), data, backup=False)
                raw = encode_head(record, gen, len(data))
                files.write_atomic(child(ctx.folder, f"{new_id}.json"), raw, backup=False)
                break
        recovery = Recovery(
            "recovery-session",
            ctx.tenant,
            ctx.subject,
            f"{reason}; {summary['entries']} entries copied to the new session",
            files.relative(ctx.head_path),
            recovered_as=new_id,
            quarantined=moved,
        )
        lost = write_lost(files, ctx.lost_path, f"session {ctx.sid!r}", recovery, reason, damaged)
        ctx.lock.remove()
        self.forget(ctx.key)
        files.report(recovery)
        return lost

    # -- transcripts ---------------------------------------------------------------------

    def open_log(self, ctx: SessionCtx, *, write: bool) -> tuple[int | None, LogIndex]:
        """An open transcript and its index, synced to the head (``ctx.head`` may move)."""
        if ctx.head.size == 0 and not write:
            return None, LogIndex(ctx.head.gen, (0, 0))
        flags = os.O_RDWR | os.O_CREAT if write else os.O_RDONLY
        try:
            fd = self.files.open(ctx.log_path, flags)
        except FileNotFoundError:
            self.files.report_once(
                ("log-missing", ctx.key, ctx.head.raw),
                Recovery(
                    "log-missing",
                    ctx.tenant,
                    ctx.subject,
                    f"the transcript file is gone, but the head says {ctx.head.size} bytes "
                    "were written; the session is served without its entries",
                    self.files.relative(ctx.log_path),
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

    def _sync_index(self, ctx: SessionCtx, fd: int, info: os.stat_result) -> LogIndex:
        head = ctx.head
        file_id = (info.st_dev, info.st_ino)
        limit = min(head.size, info.st_size)
        index = self.indexes.get(ctx.key)
        if index is None or (index.gen, index.file_id) != (head.gen, file_id) or index.end > limit:
            index = LogIndex(head.gen, file_id)
            index.scan(read_at(fd, 0, limit), 0)
            if index.header_gen is not None and index.header_gen != head.gen:
                index = self._complete_prune(ctx, fd, info, index.header_gen)
            elif index.header_damaged:
                self.files.report_once(
                    ("corrupt-header", ctx.key, head.gen),
                    Recovery(
                        "corrupt-header",
                        ctx.tenant,
                        ctx.subject,
                        "the first line of the transcript is damaged; its entries are served",
                        self.files.relative(ctx.log_path),
                    ),
                )
        elif index.end < limit:
            index.scan(read_at(fd, index.end, limit - index.end), index.end)
        if info.st_size < ctx.head.size:
            self.files.report_once(
                ("log-truncated", ctx.key, ctx.head.raw, info.st_size),
                Recovery(
                    "log-truncated",
                    ctx.tenant,
                    ctx.subject,
                    f"the transcript has {info.st_size} bytes but {ctx.head.size} were "
                    "committed; the entries that remain are served (a cut line as a "
                    "corrupt entry)",
                    self.files.relative(ctx.log_path),
                ),
            )
        return remember(self.indexes, ctx.key, index)

    def _complete_prune(self, ctx: SessionCtx, fd: int, info: os.stat_result, gen: str) -> LogIndex:
        """The transcript was replaced by a prune that stopped before its head write."""
        data = read_at(fd, 0, info.st_size)
        end = data.rfind(b"\n") + 1
        record = apply_patch(ctx.head.record, SessionPatch(), now=utcnow())
        self.save_head(ctx, record, gen, end)
        self.files.report(
            Recovery(
                "prune-completed",
                ctx.tenant,
                ctx.subject,
                "a prune replaced the transcript but stopped before updating the head; "
                "the head now points to the pruned transcript",
                self.files.relative(ctx.head_path),
            )
        )
        index = LogIndex(gen, (info.st_dev, info.st_ino))
        index.scan(data[:end], 0)
        return index

    def read_lines(self, fd: int, index: LogIndex, positions: Sequence[int]) -> list[Entry]:
        """The entries at ``positions`` of the index (in file order), in one read."""
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

    def write_lines(self, ctx: SessionCtx, fd: int, index: LogIndex, data: bytes) -> int:
        """Write lines after the committed end (not yet committed); the new end.

        Bytes after the committed end (a crashed append) are cut first, with a report.
        ``index`` is extended when it still describes the file, else dropped.
        """
        committed = ctx.head.size
        size = os.fstat(fd).st_size
        offset, prefix, clean = committed, b"", index.end == committed
        if size > committed:
            self.files.report(
                Recovery(
                    "uncommitted-tail",
                    ctx.tenant,
                    ctx.subject,
                    f"cut {size - committed} bytes after the last committed entry (an append "
                    "that crashed before it was acknowledged)",
                    self.files.relative(ctx.log_path),
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
            if self.files.sync:
                os.fdatasync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, offset)
            raise
        if offset == 0 and self.files.sync:
            self.files.fsync_dir(ctx.folder)
        if clean:
            index.scan(payload, offset)
            remember(self.indexes, ctx.key, index)
        else:
            self.indexes.pop(ctx.key, None)
        return offset + len(payload)
