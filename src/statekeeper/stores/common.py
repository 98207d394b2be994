"""Checks and error messages shared by every backend, so they all say the same thing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from statekeeper.errors import ConflictError, InvalidInputError, NotFoundError
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import encode_json
from statekeeper.stores.base import EntryKind, SessionRecord

__all__ = [
    "check_expiry",
    "check_limit",
    "check_prunable_kind",
    "check_record_ids",
    "check_record_listing",
    "check_record_version",
    "check_session_record",
    "from_micros",
    "new_session_record",
    "record_not_found",
    "record_text",
    "session_not_found",
    "to_micros",
]


def new_session_record(record: SessionRecord, limit: int) -> SessionRecord:
    """A record as ``create_session`` stores it: validated, version 1, no entries yet."""
    check_session_record(record, limit)
    return record.model_copy(update={"version": 1, "head_seq": 0, "last_seq": 0})


def check_session_record(record: SessionRecord, limit: int) -> SessionRecord:
    """Validate a session record's ids and size before it is stored."""
    validate_id(record.tenant, "tenant")
    validate_id(record.id, "session id")
    for name in ("continued_from", "continued_to"):
        value = getattr(record, name)
        if value is not None:
            validate_id(value, name)
    if record.forked_from is not None:
        validate_id(record.forked_from.session_id, "forked_from session id")
    encode_json(record.to_doc(), what=f"session {record.id!r}", limit=limit)
    return record


def check_record_ids(tenant: str, namespace: str, key: str | None = None) -> None:
    """Validate the ids that address a record or an event log."""
    validate_id(tenant, "tenant")
    validate_id(namespace, "namespace")
    if key is not None:
        validate_id(key, "record key")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(value: datetime) -> int:
    """Microseconds since the epoch, exactly (how backends store times)."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The UTC time ``micros`` microseconds after the epoch, exactly."""
    if -(2**52) < micros < 2**52:
        # The float is within 0.13 us of the exact value for any date before year 2200,
        # and fromtimestamp rounds to the nearest microsecond: exact, and 2.5x faster
        # than adding a timedelta (this runs once per entry read).
        return datetime.fromtimestamp(micros / 1e6, UTC)
    return _EPOCH + timedelta(microseconds=micros)


def check_record_listing(tenant: str, namespace: str, prefix: str, limit: int) -> None:
    """Validate the arguments of ``list_records``."""
    check_record_ids(tenant, namespace)
    check_limit(limit)
    if prefix:
        validate_id(prefix, "key prefix")


def record_text(
    tenant: str,
    namespace: str,
    key: str,
    value: object,
    expires_at: datetime | None,
    limit: int,
) -> str:
    """Validate the arguments of ``put_record`` and encode the value (JSON text)."""
    check_record_ids(tenant, namespace, key)
    check_expiry(expires_at)
    return encode_json(value, what=f"record {namespace}/{key}", limit=limit)


def check_expiry(expires_at: datetime | None) -> None:
    """An expiry must be timezone-aware (UTC is best)."""
    if expires_at is not None and expires_at.tzinfo is None:
        raise InvalidInputError("expires_at must be timezone-aware (use UTC)")


def check_record_version(
    namespace: str, key: str, version: int, expected_version: int | None
) -> None:
    """Raise `ConflictError` when a record's version is not the expected one (0: absent)."""
    if expected_version is not None and expected_version != version:
        state = "does not exist" if version == 0 else f"is at version {version}"
        raise ConflictError(
            f"record {namespace}/{key} {state}, not version {expected_version}: "
            "another writer changed it; reload and retry",
            expected=expected_version,
            actual=version,
        )


def check_limit(limit: int | None) -> int | None:
    """A read's ``limit``: None (no limit) or a count >= 0."""
    if limit is not None and limit < 0:
        raise InvalidInputError(f"limit must be >= 0, got {limit}")
    return limit


def check_prunable_kind(kind: str) -> None:
    """Messages are never pruned (counts and views depend on them); other kinds may be."""
    if kind == EntryKind.MESSAGE:
        raise InvalidInputError(
            "message entries cannot be pruned; compact the session or delete it instead"
        )


def session_not_found(session_id: str) -> NotFoundError:
    """The error for a session this tenant does not have."""
    return NotFoundError(f"session {session_id!r} not found")


def record_not_found(namespace: str, key: str) -> NotFoundError:
    """The error for a record this tenant does not have."""
    return NotFoundError(f"record {namespace}/{key} not found")
