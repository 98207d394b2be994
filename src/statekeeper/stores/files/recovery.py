"""JSON files of the ``files://`` store (session heads, records) and how damage is repaired.

Pure functions over bytes: the store does the I/O and the locking. A file that cannot be
decoded raises `BadFileError` (internal), which the store turns into a fallback to the
backup, a recovery session, or a typed `StoreCorruptError`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from statekeeper.jsoncodec import loads
from statekeeper.stores.base import Entry, EntryKind, SessionRecord, VersionedRecord
from statekeeper.stores.files.logs import LogIndex, parse_entry

__all__ = [
    "BadFileError",
    "decode_head",
    "decode_record",
    "encode_head",
    "encode_record",
    "recovery_record",
    "roll_forward",
    "salvage_lines",
]


class BadFileError(Exception):
    """Internal: a JSON file of the store cannot be decoded (the message says why)."""


def encode_head(record: SessionRecord, gen: str, size: int) -> bytes:
    """A session head file: the transcript's gen and committed bytes, and the record."""
    body = record.model_dump_json(indent=2)
    return f'{{\n"log": {{"gen": "{gen}", "bytes": {size}}},\n"session": {body}\n}}\n'.encode()


def decode_head(raw: bytes, tenant: str, session_id: str) -> tuple[SessionRecord, str, int]:
    """(record, gen, committed bytes) of a head file; `BadFileError` if it is damaged."""
    try:
        doc = loads(raw)
    except ValueError as exc:
        raise BadFileError(f"the head is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("log"), dict):
        raise BadFileError("the head is not a session head (no 'log' object)")
    gen, size = doc["log"].get("gen"), doc["log"].get("bytes")
    if not isinstance(gen, str) or type(size) is not int or size < 0:
        raise BadFileError("the head's 'log' has no valid gen and bytes")
    try:
        record = SessionRecord.model_validate(doc.get("session"))
    except ValueError as exc:
        raise BadFileError(f"the head's session record is invalid ({exc})") from exc
    if (record.tenant, record.id) != (tenant, session_id):
        raise BadFileError(
            f"the head holds session {record.id!r} of tenant {record.tenant!r}, "
            f"not {session_id!r} of {tenant!r}"
        )
    return record, gen, size


def encode_record(
    namespace: str,
    key: str,
    version: int,
    updated_at: datetime,
    expires_at: datetime | None,
    value_text: str,
) -> bytes:
    """A record file (ids are validated, so they need no escaping)."""
    expires = "null" if expires_at is None else f'"{expires_at.isoformat()}"'
    return (
        f'{{"namespace": "{namespace}", "key": "{key}", "version": {version}, '
        f'"updated_at": "{updated_at.isoformat()}", "expires_at": {expires},\n'
        f' "value": {value_text}}}\n'
    ).encode()


def _aware(value: Any) -> datetime:
    stamp = datetime.fromisoformat(value)
    if stamp.tzinfo is None:
        raise ValueError("timestamp has no timezone")
    return stamp


def decode_record(raw: bytes, namespace: str, key: str) -> VersionedRecord:
    """The record a file holds; `BadFileError` if it is damaged."""
    try:
        doc = loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if (doc.get("namespace"), doc.get("key")) != (namespace, key):
            raise ValueError(f"it holds {doc.get('namespace')!r}/{doc.get('key')!r}")
        version = doc["version"]
        if type(version) is not int or version < 1:
            raise ValueError(f"version {version!r} is not a positive integer")
        expires = doc["expires_at"]
        return VersionedRecord(
            namespace=namespace,
            key=key,
            value=doc["value"],
            version=version,
            updated_at=_aware(doc["updated_at"]),
            expires_at=None if expires is None else _aware(expires),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise BadFileError(f"the record file is damaged ({exc})") from exc


def roll_forward(
    record: SessionRecord, gen: str, size: int, log: bytes | None, *, now: datetime
) -> tuple[SessionRecord, str, int, str]:
    """A head restored from its backup, with the whole entries written after the backup.

    The backup is the version just before the lost head, so at most one append (or one
    prune) happened in between: its whole, valid lines are kept, and the counters an
    append of their messages adds (messages, tokens) are counted again from them, so
    the limits that read the counters see what the transcript holds. The version moves
    2 past the backup's, past the lost one, so a writer that saw the lost head gets a
    conflict instead of overwriting blindly. Returns (record, gen, bytes, note).
    """
    adopted: list[tuple[Entry, bool]] = []  # (entry, whether it is a side entry)
    if log is None:
        end, note = 0, "; the transcript file is missing" if size else ""
    else:
        index = LogIndex(None, (0, 0))
        index.scan(log, 0)
        if index.header_gen is None or index.header_gen == gen:
            end = min(size, len(log))
            last = record.last_seq
            for i, start in enumerate(index.starts):
                if start < size:
                    continue
                raw = log[start : index.stops[i]]
                entry = parse_entry(raw.rstrip(b"\n"), index.seqs[i], None, None)
                if not raw.endswith(b"\n") or entry.kind == EntryKind.CORRUPT or entry.seq <= last:
                    break
                end, last = index.stops[i], entry.seq
                adopted.append((entry, index.sides[i]))
        else:  # a prune replaced the transcript: it is whole (written before its rename)
            gen, end = index.header_gen, log.rfind(b"\n") + 1
            for i, seq in enumerate(index.seqs):
                if index.stops[i] <= end and seq > record.last_seq:
                    raw = log[index.starts[i] : index.stops[i]].rstrip(b"\n")
                    entry = parse_entry(raw, seq, None, None)
                    side = index.sides[i] or index.kinds[i] is None
                    adopted.append((entry, side))
        note = (
            f"; {len(adopted)} entries written after the backup were kept and the "
            "message and token counters counted again from them (other changes of the "
            "lost update were not recovered)"
            if adopted
            else ""
        )
    restored = record.model_copy(
        update={**_counted(record, adopted), "version": record.version + 2, "last_active": now}
    )
    return restored, gen, end, note


def _counted(record: SessionRecord, adopted: list[tuple[Entry, bool]]) -> dict[str, int]:
    """The head fields after the ``adopted`` (entry, side) pairs: last and head seq, and
    what appending their messages adds to the counters."""
    fields = {"last_seq": record.last_seq, "head_seq": record.head_seq}
    messages = tokens = 0
    for entry, side in adopted:
        fields["last_seq"] = max(fields["last_seq"], entry.seq)
        if not side:
            fields["head_seq"] = entry.seq
        if entry.kind == EntryKind.MESSAGE:
            messages += 1
            counted = entry.payload.get("tokens")
            tokens += counted if type(counted) is int and counted > 0 else 0
    fields["message_count"] = record.message_count + messages
    fields["total_tokens"] = record.total_tokens + tokens
    fields["fresh_tokens"] = record.fresh_tokens + tokens
    return fields


def salvage_lines(log: bytes) -> tuple[list[bytes], dict[str, int]]:
    """The whole entry lines of a transcript, and counts describing them."""
    index = LogIndex(None, (0, 0))
    index.scan(log, 0)
    lines: list[bytes] = []
    summary = {
        "entries": 0,
        "corrupt_entries": 0,
        "messages": 0,
        "torn_lines_dropped": 0,
        "last_seq": 0,
        "head_seq": 0,
    }
    for i, start in enumerate(index.starts):
        raw = log[start : index.stops[i]]
        if not raw.endswith(b"\n"):
            summary["torn_lines_dropped"] += 1
            continue
        lines.append(raw)
        entry = parse_entry(raw.rstrip(b"\n"), index.seqs[i], index.names[i], index.parents[i])
        summary["entries"] += 1
        summary["last_seq"] = max(summary["last_seq"], entry.seq)
        if entry.kind == EntryKind.CORRUPT:
            summary["corrupt_entries"] += 1
            continue
        if entry.kind == EntryKind.MESSAGE:
            summary["messages"] += 1
        if not index.sides[i]:
            summary["head_seq"] = entry.seq
    return lines, summary


def recovery_record(
    new_id: str,
    tenant: str,
    lost_id: str,
    reason: str,
    summary: dict[str, int],
    quarantined: tuple[str, ...],
    *,
    now: datetime,
) -> SessionRecord:
    """The head of a recovery session standing in for the lost session ``lost_id``."""
    return SessionRecord(
        id=new_id,
        tenant=tenant,
        title=f"Recovered from session {lost_id}",
        created_at=now,
        last_active=now,
        metadata={
            "recovered_from": lost_id,
            "recovery": {
                "reason": reason[:1000],
                "recovered_at": now.isoformat(),
                "lost": "the session record (title, agent, metadata, state, counters) "
                "could not be read; the whole lines of its transcript were copied here",
                "entries": summary["entries"],
                "corrupt_entries": summary["corrupt_entries"],
                "torn_lines_dropped": summary["torn_lines_dropped"],
                "quarantined": list(quarantined),
            },
        },
        message_count=summary["messages"],
        head_seq=summary["head_seq"],
        last_seq=summary["last_seq"],
        version=1,
    )
