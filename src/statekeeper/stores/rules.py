"""The rules every backend follows, as pure functions (no I/O).

The rule for what lives here: anything two backends would otherwise each decide or say —
append planning, head updates, version checks, pruning, paging and filters, argument
checks, the errors for missing things, and how a time is stored (epoch microseconds).
What a backend does with I/O lives in its package; the loop that applies these rules to
an append is `statekeeper.stores.engine`.

A backend fetches what a rule needs, calls it, and writes what it decides: sequence
numbers and parents of an append, idempotent replays, version checks, head updates,
what may be pruned, paging cursors and filter semantics. Keeping them here is what lets
one conformance suite prove that every backend behaves the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from operator import is_, itemgetter
from typing import Any, Final, NamedTuple, TypeGuard

from statekeeper.core.typed import trusted
from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    InvalidPayloadError,
    NotFoundError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import decode_json, encode_json, encode_stored, loads
from statekeeper.stores.base import (
    Entry,
    EntryDraft,
    EntryKind,
    EventDraft,
    SessionPatch,
    SessionRecord,
)
from statekeeper.stores.listing import (
    add_record,
    corrupt_item,
    decode_cursor,
    decode_session,
    encode_cursor,
    encoded_head,
    json_scalar_equal,
    matches_query,
    page_of,
    record_value,
)

__all__ = [
    "AppendPlan",
    "add_record",
    "apply_patch",
    "check_expiry",
    "check_limit",
    "check_prunable_kind",
    "check_record_ids",
    "check_record_listing",
    "check_record_version",
    "check_rewrites",
    "check_session_record",
    "check_tenant_and_id",
    "check_version",
    "check_wait",
    "corrupt_entry",
    "corrupt_item",
    "decode_cursor",
    "decode_session",
    "document_fields",
    "encode_cursor",
    "encoded_head",
    "event_texts",
    "from_micros",
    "json_scalar_equal",
    "matches_query",
    "new_session_record",
    "page_of",
    "plan_append",
    "prunable",
    "record_not_found",
    "record_text",
    "record_value",
    "same_document",
    "same_payload",
    "session_not_found",
    "to_micros",
]


def check_tenant_and_id(tenant: str, session_id: str) -> None:
    """Validate the two ids every session operation takes."""
    validate_id(tenant, "tenant")
    validate_id(session_id, "session id")


def document_fields(columns: Iterable[str]) -> tuple[str, ...]:
    """The head fields a backend keeps only in the head document, when it keeps
    ``columns`` (and ``version`` and ``last_active``) in columns of their own."""
    outside = {*columns, "version", "last_active"}
    return tuple(name for name in SessionRecord.model_fields if name not in outside)


def same_document(old: SessionRecord, new: SessionRecord, fields: Sequence[str]) -> bool:
    """Whether ``new`` has the same document ``fields`` (see `document_fields`) as ``old``,
    so an update need write only the columns.

    By identity: an append copies the head, so its other fields are the same objects;
    equal is not the same (``{"a": 1} == {"a": True}``, ``0.0 == -0.0``): a field set
    anew is written.
    """
    pick = _pickers.get(fields)
    if pick is None:
        # itemgetter of several names gives a tuple; of one, the bare value.
        pick = itemgetter(*fields, *fields[:1]) if len(fields) == 1 else itemgetter(*fields)
        _pickers[tuple(fields)] = pick
    # Both sides picked and compared in C: this runs on every append.
    return all(map(is_, pick(old.__dict__), pick(new.__dict__)))


_pickers: dict[Sequence[str], Callable[[dict[str, Any]], tuple[Any, ...]]] = {}


def apply_patch(
    record: SessionRecord,
    patch: SessionPatch,
    *,
    now: datetime,
    internal: dict[str, Any] | None = None,
) -> SessionRecord:
    """The record after ``patch``: fields set, counters added, version bumped.

    ``internal`` carries store-maintained fields (``last_seq``, ``head_seq``) of an append.
    """
    stored = record.__dict__
    changes: dict[str, Any] = dict(internal) if internal else {}
    for name, n in patch.add.items():  # counters (SessionPatch refuses other names)
        changes[name] = total = stored[name] + n
        if not -_BOUND < total < _BOUND:  # a message's tokens: any int, until stored
            raise InvalidPayloadError(
                f"{name} of session {record.id!r} would be {total}, past 2**63 - 1 (what "
                "a store holds); count a message's tokens, or leave them None"
            )
    changes["version"] = stored["version"] + 1
    changes["last_active"] = now
    if patch.set:
        data = record.model_dump()
        data.update(patch.set)
        data.update(changes)
        try:
            updated = SessionRecord.model_validate(data)
        except ValueError as exc:
            raise InvalidPayloadError(f"invalid session update: {exc}") from exc
    else:
        # Counters are ints and the rest is unchanged: nothing to validate again.
        fields = stored.copy()
        fields.update(changes)
        updated = trusted(SessionRecord, fields)
    if not 0 <= updated.head_seq <= updated.last_seq:
        raise InvalidInputError(
            f"head_seq {updated.head_seq} is not an entry of session {record.id!r} "
            f"(entries 1..{updated.last_seq})"
        )
    return updated


def check_version(record: SessionRecord, expected_version: int | None) -> None:
    """Raise `ConflictError` if ``expected_version`` is set and stale."""
    if expected_version is not None and expected_version != record.version:
        raise ConflictError(
            f"session {record.id!r} is at version {record.version}, not {expected_version}: "
            "another writer changed it; reload and retry",
            expected=expected_version,
            actual=record.version,
        )


_NO_PATCH = SessionPatch()


class AppendPlan(NamedTuple):
    """What a backend must write for an append: new entries and the new head record."""

    entries: list[Entry]
    encoded: list[str]
    session: SessionRecord
    replayed: list[Entry]


def plan_append(
    record: SessionRecord,
    drafts: Sequence[EntryDraft],
    existing: Mapping[str, Entry],
    *,
    expected_version: int | None,
    patch: SessionPatch | None,
    move_head: bool,
    max_payload_bytes: int,
    now: datetime,
) -> AppendPlan:
    """Decide an append. ``existing`` maps the drafts' ids already stored to their entries.

    Raises `ConflictError` for a stale version or a reused id with other content, and
    `InvalidInputError` for a parent that is not an entry of the session.
    """
    fresh, replayed = _new_and_replayed(record, drafts, existing)
    if not fresh:
        return AppendPlan([], [], record, replayed)
    if replayed:
        raise ConflictError(
            f"append to session {record.id!r} mixes already-stored entries "
            f"({', '.join(e.id for e in replayed)}) with new ones; retry the exact batch "
            "or append only the new entries"
        )
    check_version(record, expected_version)

    entries: list[Entry] = []
    encoded: list[str] = []
    seq = record.last_seq
    previous: int | None = record.head_seq or None
    head = record.head_seq
    for draft in fresh:
        seq += 1
        if draft.parent == "head":
            parent = previous
        elif draft.parent is None:
            parent = None
        else:
            parent = draft.parent
            if not 1 <= parent < seq:
                raise InvalidInputError(
                    f"parent {parent} of entry {draft.id!r} is not an entry of session "
                    f"{record.id!r} (entries 1..{seq - 1})"
                )
        # The entry holds the payload as a read returns it (tuples as lists ...).
        text, payload = encode_stored(
            draft.payload, what=f"entry {draft.id!r}", limit=max_payload_bytes
        )
        encoded.append(text)
        entries.append(Entry(seq, draft.id, parent, str(draft.kind), draft.created_at, payload))
        if not draft.side:
            previous = head = seq

    moved = {"last_seq": seq, "head_seq": head} if move_head else {"last_seq": seq}
    session = apply_patch(record, patch or _NO_PATCH, now=now, internal=moved)
    return AppendPlan(entries, encoded, session, [])


def _new_and_replayed(
    record: SessionRecord, drafts: Sequence[EntryDraft], existing: Mapping[str, Entry]
) -> tuple[list[EntryDraft], list[Entry]]:
    """The drafts not stored yet, and the stored entries of those stored identically."""
    if not drafts:
        raise InvalidInputError("append needs at least one entry")
    seen: set[str] = set()
    replayed: list[Entry] = []
    fresh: list[EntryDraft] = []
    for draft in drafts:
        validate_id(draft.id, "entry id")
        if draft.id in seen:
            raise InvalidInputError(f"entry id {draft.id!r} appears twice in one append")
        seen.add(draft.id)
        stored = existing.get(draft.id)
        if stored is None:
            fresh.append(draft)
        elif stored.kind == draft.kind and stored.payload == _roundtrip(draft.payload):
            replayed.append(stored)
        else:
            raise ConflictError(
                f"entry id {draft.id!r} is already stored in session {record.id!r} with "
                "different content; use a new id for a new entry"
            )
    return fresh, replayed


def prunable(
    entries: Sequence[Entry], record: SessionRecord, kind: str, before_seq: int, id_prefix: str
) -> list[int]:
    """Seqs of ``entries`` (all of a session's) that `prune_entries` may delete."""
    referenced = {e.parent_seq for e in entries} | {record.head_seq}
    return [
        e.seq
        for e in entries
        if e.kind == kind
        and e.seq < before_seq
        and e.seq not in referenced
        and e.id.startswith(id_prefix)
    ]


def _roundtrip(payload: dict[str, Any]) -> Any:
    """The payload as it reads back from storage (tuples become lists, etc.)."""
    return decode_json(encode_json(payload))


def corrupt_entry(
    seq: int, entry_id: str, parent_seq: int | None, created_at: datetime, raw: str, error: str
) -> Entry:
    """The stand-in for a stored entry that cannot be decoded (reported, not skipped)."""
    return Entry(
        seq, entry_id, parent_seq, EntryKind.CORRUPT, created_at, {"error": error, "raw": raw[:200]}
    )


# -- argument checks, errors and stored times shared by every backend ------------------


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


_NO_KEY: Final = object()


def check_record_ids(tenant: str, namespace: str, key: object = _NO_KEY) -> None:
    """Validate the ids that address a record (with ``key``) or an event log (without).

    A ``key`` that is given is always checked: None is refused, not taken for "no key".
    """
    validate_id(tenant, "tenant")
    validate_id(namespace, "namespace")
    if key is not _NO_KEY:
        validate_id(key, "record key")


def event_texts(tenant: str, log_id: str, events: Sequence[EventDraft], limit: int) -> list[str]:
    """Validate the arguments of ``append_events`` (or an append's events); the events'
    payloads as JSON text."""
    check_record_ids(tenant, log_id)
    return [encode_json(e.payload, what=f"event {e.stream}/{e.kind}", limit=limit) for e in events]


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


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


_BOUND = 2**63
"""Seqs and limits are below this: what every backend's integers hold (SQLite and
PostgreSQL bigint, Redis scores as exact integers)."""


def check_limit(limit: int | None) -> int | None:
    """A read's ``limit``: None (no limit) or a count >= 0 (below 2**63)."""
    if limit is not None and (not _whole(limit) or not 0 <= limit < _BOUND):
        raise InvalidInputError(
            f"limit must be None or a whole number from 0 to 2**63 - 1, got {limit!r}"
        )
    return limit


def check_read(after_seq: int, until_seq: int | None, limit: int | None) -> int | None:
    """A read's range: ``after_seq`` (and ``until_seq`` unless None) are seq numbers
    below 2**63; returns the checked ``limit``."""
    for name, seq in (("after_seq", after_seq), ("until_seq", until_seq)):
        if seq is None and name == "until_seq":
            continue
        if not _whole(seq) or seq >= _BOUND:
            raise InvalidInputError(
                f"{name} must be a whole number below 2**63 (an entry or event seq), got {seq!r}"
            )
    return check_limit(limit)


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


def check_wait(wait: float | None) -> float | None:
    """``wait`` (seconds to wait for a session lock) if it is None or >= 0."""
    if wait is not None and not wait >= 0:
        raise InvalidInputError(f"wait must be >= 0 seconds or None, got {wait!r}")
    return wait


def check_rewrites(
    payloads: Mapping[Any, tuple[Any, Any]], *, events: bool, limit: int
) -> dict[Any, tuple[Any, str]]:
    """The rewrites of ``rewrite_entry_payloads`` (keyed by entry id) or
    ``rewrite_event_payloads`` (keyed by event seq), checked: key -> (the payload expected
    stored, the new payload as JSON text)."""
    if not isinstance(payloads, Mapping):
        raise InvalidInputError("payloads must map each id to (expected payload, new payload)")
    checked: dict[Any, tuple[Any, str]] = {}
    for key, pair in payloads.items():
        if events and (not _whole(key) or key < 1):
            raise InvalidInputError(f"an event seq is a whole number >= 1, got {key!r}")
        what = f"event {key}" if events else f"entry {validate_id(key, 'entry id')!r}"
        if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[1], dict):
            raise InvalidInputError(
                f"{what}: give (expected payload, new payload), the new one a JSON object"
            )
        checked[key] = (pair[0], encode_json(pair[1], what=what, limit=limit))
    return checked


def same_payload(stored: str, expected: Any) -> bool:
    """Whether a stored payload's JSON text holds ``expected`` (a rewrite's guard)."""
    try:
        return bool(loads(stored) == expected)
    except ValueError:
        return False
