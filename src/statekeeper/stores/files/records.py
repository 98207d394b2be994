"""Versioned records and event logs of the ``files://`` store (blocking; worker thread).

Records: ``<tenant>/records/<namespace>/<key>.json`` rewritten atomically with a backup;
writes hold the namespace's lock; reads need none (a file is replaced whole). A damaged
record falls back to its backup; without one it is quarantined, and a ``<key>.lost``
marker (``lost``) keeps it reported (listings' ``corrupt``, `StoreCorruptError` on get)
until it is deleted or put again.

Event logs: ``<tenant>/events/<log>.jsonl``; appends hold the log's lock; reads need none,
because only finished batches count and a finished batch never changes (see
``logs``).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from contextlib import suppress
from datetime import datetime
from typing import Any

from statekeeper.core.messages import utcnow
from statekeeper.errors import InvalidIdError
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import gc_paused, loads
from statekeeper.stores.base import Event, EventDraft, RecordList, VersionedRecord
from statekeeper.stores.files.layout import (
    Layout,
    Recovery,
    UnsafePathError,
    child,
    read_at,
    write_all,
)
from statekeeper.stores.files.logs import (
    EventIndex,
    event_line,
    header_line,
    holds_payload,
    new_gen,
    parse_event,
    remember,
    with_payload,
)
from statekeeper.stores.files.lost import LOST_SUFFIX, Lost, read_lost, write_lost
from statekeeper.stores.files.recovery import BadFileError, decode_record, encode_record
from statekeeper.stores.rules import check_record_version, record_not_found

__all__ = ["EventFiles", "RecordFiles"]


_FIX = (
    "put a new value to use the key again (it starts over at version 1), or delete it "
    "(delete_record) to stop this report; the quarantined files are kept"
)


def _marker(path: str) -> str:
    """The ``<key>.lost`` marker beside a record's ``<key>.json``."""
    return path[: -len(".json")] + LOST_SUFFIX


def _live(record: VersionedRecord, now: datetime) -> bool:
    return record.expires_at is None or record.expires_at > now


class RecordFiles:
    """Versioned records, one JSON file each."""

    def __init__(self, files: Layout) -> None:
        self.files = files

    def _path(self, tenant: str, namespace: str, key: str, *, create: bool) -> str | None:
        folder = self.files.directory(tenant, "records", namespace, create=create)
        return None if folder is None else self.files.file(folder, f"{key}.json")

    def _read(
        self, tenant: str, namespace: str, key: str, path: str, *, locked: bool
    ) -> tuple[VersionedRecord | None, Lost | None]:
        """(the record or None, what its marker says if it was lost to damage)."""
        raw = self.files.read_bytes(path)
        if raw is None:
            return None, read_lost(self.files, _marker(path), f"record {namespace}/{key}")
        try:
            return decode_record(raw, namespace, key), None
        except BadFileError as exc:
            if locked:
                return self._repair(tenant, namespace, key, path, str(exc), raw)
            with self.files.locked(tenant, "records", namespace):
                return self._read(tenant, namespace, key, path, locked=True)

    def _repair(
        self, tenant: str, namespace: str, key: str, path: str, reason: str, raw: bytes
    ) -> tuple[VersionedRecord | None, Lost | None]:
        files = self.files
        backup_path = path + ".bak"
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
                return restored, None
        moved_all = tuple(
            m for m in (files.quarantine(tenant, p) for p in (path, backup_path)) if m
        )
        recovery = Recovery(
            "record-lost",
            tenant,
            subject,
            f"{reason}; no usable backup, the damaged files were quarantined",
            where,
            quarantined=moved_all,
        )
        # The marker before the report, so every handle sees the loss once it is logged.
        lost = write_lost(
            files, _marker(path), subject, recovery, f"{reason}; no usable backup", raw
        )
        files.report(recovery)
        return None, lost

    def get(self, tenant: str, namespace: str, key: str) -> VersionedRecord:
        path = self._path(tenant, namespace, key, create=False)
        found, lost = (
            (None, None) if path is None else self._read(tenant, namespace, key, path, locked=False)
        )
        if found is None and lost is not None:
            raise lost.error(_FIX)
        if found is None or not _live(found, utcnow()):
            raise record_not_found(namespace, key)
        return found

    def put(
        self,
        tenant: str,
        namespace: str,
        key: str,
        text: str,
        expected_version: int | None,
        expires_at: datetime | None,
    ) -> VersionedRecord:
        path = self._path(tenant, namespace, key, create=True)
        assert path is not None
        with self.files.locked(tenant, "records", namespace):
            found, _ = self._read(tenant, namespace, key, path, locked=True)
            now = utcnow()
            version = found.version if found is not None and _live(found, now) else 0
            check_record_version(namespace, key, version, expected_version)
            raw = encode_record(namespace, key, version + 1, now, expires_at, text)
            self.files.write_atomic(path, raw, backup=True)
            self.files.unlink(_marker(path))  # the key is in use again
        return VersionedRecord(
            namespace=namespace,
            key=key,
            value=loads(text),
            version=version + 1,
            updated_at=now,
            expires_at=expires_at,
        )

    def list(
        self, tenant: str, namespace: str, prefix: str, after_key: str | None, limit: int
    ) -> RecordList:
        folder = self.files.directory(tenant, "records", namespace)
        if folder is None:
            return RecordList()
        keys = sorted(  # records, and records lost to damage (their markers)
            {
                name[:-5]
                for name in os.listdir(folder)
                if name.endswith((".json", LOST_SUFFIX)) and not name.startswith(".")
            }
        )
        out = RecordList()
        now = utcnow()
        for key in keys:
            if len(out) >= limit:
                break
            if not key.startswith(prefix) or (after_key is not None and key <= after_key):
                continue
            try:
                validate_id(key)
                found, lost = self._read(
                    tenant, namespace, key, child(folder, f"{key}.json"), locked=False
                )
            except (InvalidIdError, UnsafePathError):
                continue  # not a file this store wrote
            if found is None and lost is not None:  # reported until deleted or put again
                out.corrupt.append(lost.item(key, _FIX))
            elif found is not None and _live(found, now):
                out.append(found)
        return out

    def delete(self, tenant: str, namespace: str, key: str, expected_version: int | None) -> None:
        path = self._path(tenant, namespace, key, create=False)
        if path is None or not (self.files.exists(path) or self.files.exists(_marker(path))):
            raise record_not_found(namespace, key)
        with self.files.locked(tenant, "records", namespace):
            found, lost = self._read(tenant, namespace, key, path, locked=True)
            if found is None and lost is None:
                raise record_not_found(namespace, key)
            if found is not None:
                if not _live(found, utcnow()):
                    raise record_not_found(namespace, key)
                check_record_version(namespace, key, found.version, expected_version)
            # A lost record's damaged files stay in quarantine; its marker goes.
            self.files.unlink(path)
            self.files.unlink(path + ".bak")
            self.files.unlink(_marker(path))
            if self.files.sync:
                self.files.fsync_dir(os.path.dirname(path))


class EventFiles:
    """Event logs, one JSONL file each, with an index of committed lines per log."""

    def __init__(self, files: Layout) -> None:
        self.files = files
        self.indexes: OrderedDict[tuple[str, str], EventIndex] = OrderedDict()

    def _index(self, tenant: str, log_id: str, fd: int, info: os.stat_result) -> EventIndex:
        key = (tenant, log_id)
        file_id = (info.st_dev, info.st_ino)
        index = self.indexes.get(key)
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
                self.files.report_once(
                    ("corrupt-header", key, file_id),
                    Recovery(
                        "corrupt-header",
                        tenant,
                        f"events {log_id}",
                        "the first line of the event log is damaged; its events are served",
                        f"{tenant}/events/{log_id}.jsonl",
                    ),
                )
        elif index.end < info.st_size:
            index.scan(read_at(fd, index.end, info.st_size - index.end), index.end)
        return remember(self.indexes, key, index)

    def append(
        self, tenant: str, log_id: str, events: Sequence[EventDraft], texts: Sequence[str]
    ) -> list[Event]:
        folder = self.files.directory(tenant, "events", create=True)
        assert folder is not None
        path = self.files.file(folder, f"{log_id}.jsonl")
        with self.files.locked(tenant, "events", log_id):
            fd = self.files.open(path, os.O_RDWR | os.O_CREAT)
            try:
                first = self._write(tenant, log_id, events, texts, fd, path)
            except BaseException:
                self.indexes.pop((tenant, log_id), None)
                raise
            finally:
                os.close(fd)
        return [
            Event(log_id, first + i, e.stream, e.kind, e.ts, loads(text))
            for i, (e, text) in enumerate(zip(events, texts, strict=True))
        ]

    def _write(
        self,
        tenant: str,
        log_id: str,
        events: Sequence[EventDraft],
        texts: Sequence[str],
        fd: int,
        path: str,
    ) -> int:
        """Write one batch after the last committed line; its first seq."""
        info = os.fstat(fd)
        index = self._index(tenant, log_id, fd, info)
        committed = index.end
        if info.st_size > committed:
            self.files.report(
                Recovery(
                    "uncommitted-tail",
                    tenant,
                    f"events {log_id}",
                    f"cut {info.st_size - committed} bytes after the last committed event "
                    "(an append that crashed before it was acknowledged)",
                    self.files.relative(path),
                )
            )
            os.ftruncate(fd, committed)
        prefix = b""
        if committed == 0:
            gen = new_gen()
            index = EventIndex(gen, (info.st_dev, info.st_ino))
            prefix = header_line("events", "log", log_id, gen)
        first = index.last_seq() + 1
        last = len(events) - 1
        lines = "".join(
            event_line(first + i, e.stream, e.kind, e.ts, text, more=i < last)
            for i, (e, text) in enumerate(zip(events, texts, strict=True))
        )
        payload = prefix + lines.encode()
        try:
            write_all(fd, payload, committed)
            if self.files.sync:
                os.fdatasync(fd)
        except BaseException:
            with suppress(OSError):
                os.ftruncate(fd, committed)
            raise
        if committed == 0 and self.files.sync:
            self.files.fsync_dir(os.path.dirname(path))
        index.scan(payload, committed)
        remember(self.indexes, (tenant, log_id), index)
        return first

    def read(self, tenant: str, log_id: str, after_seq: int, limit: int | None) -> list[Event]:
        folder = self.files.directory(tenant, "events")
        if folder is None:
            return []
        try:
            fd = self.files.open(self.files.file(folder, f"{log_id}.jsonl"), os.O_RDONLY)
        except FileNotFoundError:
            return []
        try:
            index = self._index(tenant, log_id, fd, os.fstat(fd))
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

    def rewrite(self, tenant: str, log_id: str, checked: Mapping[int, tuple[Any, str]]) -> int:
        """Rewrite payloads (seq -> (expected, new JSON)): the whole file again, under the
        log's lock, renamed over the old one (readers of the old file keep reading it)."""
        folder = self.files.directory(tenant, "events")
        path = None if folder is None else self.files.file(folder, f"{log_id}.jsonl")
        if path is None or not checked or not self.files.exists(path):
            return 0
        with self.files.locked(tenant, "events", log_id):
            try:
                fd = self.files.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return 0
            try:
                index = self._index(tenant, log_id, fd, os.fstat(fd))
                data = read_at(fd, 0, index.end)
            finally:
                os.close(fd)
            pieces, done, copied = [], 0, 0
            for seq, start, stop in zip(index.seqs, index.starts, index.stops, strict=True):
                wanted = checked.get(seq)
                line = data[start:stop]
                if wanted is None or not holds_payload(line, wanted[0]):
                    continue
                replaced = with_payload(line, wanted[1])
                if replaced is not None:
                    pieces += [data[copied:start], replaced]
                    copied, done = stop, done + 1
            if not done:
                return 0
            pieces.append(data[copied:])
            if index.gen is not None:  # a new gen: every handle's index of it is stale
                header = header_line("events", "log", log_id, new_gen())
                first = data.find(b"\n") + 1
                pieces[0] = header + pieces[0][first:]
            self.files.write_atomic(path, b"".join(pieces), backup=False)
            self.indexes.pop((tenant, log_id), None)
            return done

    def delete(self, tenant: str, log_id: str) -> None:
        folder = self.files.directory(tenant, "events")
        if folder is None:
            return
        path = self.files.file(folder, f"{log_id}.jsonl")
        if not self.files.exists(path):
            return
        with self.files.locked(tenant, "events", log_id) as lock:
            self.files.unlink(path)
            if self.files.sync:
                self.files.fsync_dir(folder)
            self.indexes.pop((tenant, log_id), None)
            lock.remove()
