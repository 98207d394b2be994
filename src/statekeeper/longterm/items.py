"""What a long-term record holds for an item (its *envelope*) and the item read from it.

An envelope is a JSON object: the value first, then only what the record does not imply.
The times (see `stamp`) are the record's write time until the item is updated or has a
TTL (a TTL refresh rewrites the record); then ``created_at``, and ``updated_at`` once it
differs. The key is there when the slot holds its digest, the TTL when there is one, and
the vectors (unit-length float32 as base64) when indexed. Envelopes written before
2026-11-28 hold every field and the namespace, with ``isoformat`` times: both are read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import JsonValue

from statekeeper.errors import StoreCorruptError
from statekeeper.longterm import rules
from statekeeper.stores.base import VersionedRecord

__all__ = ["Found", "MemoryItem", "decode", "decoded", "envelope", "stamp"]

_log = logging.getLogger("statekeeper.longterm")


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """A stored item; ``score`` is the similarity to a search query (None otherwise)."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, JsonValue]
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    score: float | None = None


@dataclass(slots=True)
class Found:
    record: VersionedRecord
    envelope: dict[str, Any]
    key: str
    created_at: datetime
    updated_at: datetime

    def item(self, score: float | None = None) -> MemoryItem:
        return MemoryItem(
            rules.slot_namespace(self.record.key),
            self.key,
            self.envelope["value"],
            self.created_at,
            self.updated_at,
            self.record.expires_at,
            score,
        )


def decode(record: VersionedRecord) -> Found:
    """The item a record holds; `StoreCorruptError` if it is not an item envelope.

    Cheap on purpose (a search decodes every record it returns): the namespace, and the
    key unless it was digested, are read from the record key; vectors are checked when
    a query scores them. Envelopes written before 2026-11-28 hold every field (and the
    namespace); newer ones leave out what is implied (see `envelope`).
    """
    env: Any = record.value
    try:
        if not isinstance(env, dict):
            raise TypeError("not an object")
        key = env.get("key")
        if key is None:
            key = record.key.partition(".:")[2]
            if key.startswith(":"):
                raise TypeError("no key for a digested slot")
        if not isinstance(env["value"], dict) or not isinstance(key, str):
            raise TypeError("no value or key")
        created = _time(env.get("created_at"), record.updated_at)
        updated = _time(env.get("updated_at"), created)
        ttl = env.get("ttl")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)):
            raise TypeError("bad ttl")
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreCorruptError(
            f"long-term record {record.namespace}/{record.key} is not an item envelope "
            f"({exc}); delete or rewrite it"
        ) from exc
    return Found(record, env, key, created, updated)


def stamp(moment: datetime) -> str:
    """A time as an envelope holds it: ISO 8601 in UTC, basic format, to the microsecond
    (``20261128T133505.949725Z``: 9 characters fewer than ``isoformat``'s; both read)."""
    if moment.tzinfo is None:
        return moment.isoformat()
    return moment.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def _time(text: object, implied: datetime) -> datetime:
    if text is None:
        return implied
    if not isinstance(text, str):
        raise TypeError("a time is not a string")
    return datetime.fromisoformat(text)


def envelope(
    where: str,
    key: str,
    value: dict[str, JsonValue],
    created: str | None,
    updated: str | None,
    minutes: float | None,
    vectors: list[str],
) -> dict[str, JsonValue]:
    """What a record holds for an item: the value first, then only what its slot and
    its record do not imply (a filtered search parses every envelope it looks at, so
    bytes count). ``created`` None: both times are the record's write time."""
    envelope: dict[str, JsonValue] = {"value": value}
    if created is not None:
        envelope["created_at"] = created
    if updated is not None and updated != created:
        envelope["updated_at"] = updated
    if where.partition(".:")[2] != key:  # a digested key
        envelope["key"] = key
    if minutes is not None:
        envelope["ttl"] = minutes
    if vectors:
        envelope["vectors"] = list[JsonValue](vectors)
    return envelope


def decoded(record: VersionedRecord) -> Found | None:
    """`decode`, or None after logging why (a damaged item never hides the others)."""
    try:
        return decode(record)
    except StoreCorruptError as exc:
        _log.warning("skipping a long-term record: %s", exc)
        return None
