"""Listing rules every backend shares: paging cursors, filters, damaged rows, and a
head's stored document (`encoded_head`, `decode_session`).

A listing never fails because one stored row cannot be decoded: `page_of` (sessions)
and `add_record` (records) report such a row as a `CorruptItem` naming the fix, and
list the rest. Re-exported by `statekeeper.stores.rules`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from statekeeper.errors import (
    InvalidInputError,
    PayloadTooLargeError,
    StatekeeperError,
    StoreCorruptError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import decode_json, encode_json, loads
from statekeeper.stores.base import (
    CorruptItem,
    Page,
    RecordList,
    SessionQuery,
    SessionRecord,
    VersionedRecord,
)

__all__ = [
    "add_record",
    "corrupt_item",
    "decode_cursor",
    "decode_session",
    "encode_cursor",
    "encoded_head",
    "json_scalar_equal",
    "matches_query",
    "page_of",
    "record_value",
]


def encoded_head(record: SessionRecord, limit: int) -> str:
    """A head's whole document as a backend stores it (its JSON), or
    `PayloadTooLargeError` if it is over ``limit``."""
    doc = record.model_dump_json()
    if len(doc) > limit:
        raise PayloadTooLargeError(
            f"session {record.id!r} record would be {len(doc)} bytes; the limit is {limit}"
        )
    return doc


def decode_session(
    tenant: str,
    session_id: str,
    doc: str | bytes,
    where: str,
    current: Callable[[], dict[str, Any]] | None = None,
) -> SessionRecord:
    """A stored session head; `StoreCorruptError` naming the id and the fix if it cannot
    be decoded, or holds another session's record. ``current`` gives fields stored
    apart from the document that replace its own (a `ValueError` if they are damaged)."""
    try:
        if current is None:
            record = SessionRecord.model_validate_json(doc)
        else:
            data = loads(doc)
            if type(data) is not dict:
                raise ValueError(f"expected a JSON object, got {type(data).__name__}")
            data.update(current())
            record = SessionRecord.model_validate(data)
        if (record.tenant, record.id) != (tenant, session_id):
            raise ValueError(f"it holds session {record.id!r} of tenant {record.tenant!r}")
    except ValueError as exc:
        raise StoreCorruptError(
            f"the stored head of session {session_id!r} in {where} cannot be decoded "
            f"({_why(exc)}); delete the session (SessionManager.delete, or `statekeeper "
            f"sessions delete {session_id}`) or restore it from a backup"
        ) from exc
    return record


def _why(exc: ValueError) -> str:
    """A one-line reason (pydantic's own message spans lines and links its docs)."""
    if isinstance(exc, ValidationError):
        parts = [
            f"{'.'.join(str(p) for p in e['loc']) or 'head'}: {e['msg']}" for e in exc.errors()[:3]
        ]
        return "; ".join(parts)[:300]
    return " ".join(str(exc).split())[:300]


def corrupt_item(item_id: str, error: StoreCorruptError, raw: str | bytes) -> CorruptItem:
    """How a listing reports a damaged session head or record (``raw``: what is stored)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return CorruptItem(id=item_id, error=str(error), raw=text[:200])


def page_of(
    rows: Sequence[tuple[datetime, str, str | bytes | SessionRecord]],
    tenant: str,
    limit: int,
    where: str,
) -> Page:
    """A page from up to ``limit + 1`` stored rows (last active, id, head doc or the
    record decoded already) in list order: damaged heads reported in ``corrupt``; the
    cursor comes from the stored position (the index), not from the decoded head."""
    items: list[SessionRecord] = []
    corrupt: list[CorruptItem] = []
    for _, session_id, doc in rows[:limit]:
        if isinstance(doc, SessionRecord):
            items.append(doc)
            continue
        try:
            items.append(decode_session(tenant, session_id, doc, where))
        except StoreCorruptError as exc:
            corrupt.append(corrupt_item(session_id, exc, doc))
    cursor = None
    if len(rows) > limit:
        last_active, last_id, _ = rows[limit - 1]
        cursor = encode_cursor(last_active, last_id)
    return Page(items=items, next_cursor=cursor, corrupt=corrupt)


def record_value(namespace: str, key: str, text: str | bytes) -> Any:
    """A stored record's value; `StoreCorruptError` naming the record and the fix."""
    try:
        return loads(text)
    except ValueError as exc:
        raise StoreCorruptError(
            f"record {namespace}/{key} cannot be decoded ({exc}); delete it "
            "(delete_record) or put a new value over it"
        ) from exc


def add_record(
    found: RecordList,
    limit: int,
    key: str,
    decode: Callable[[], VersionedRecord],
    raw: str | bytes,
) -> bool:
    """Add a stored record to a listing (a damaged one to ``found.corrupt``, which does
    not count towards ``limit``); False once ``found`` holds ``limit`` records."""
    if len(found) >= limit:
        return False
    try:
        found.append(decode())
    except StoreCorruptError as exc:
        found.corrupt.append(corrupt_item(key, exc, raw))
    return len(found) < limit


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
