"""How ADK's names, events and state map onto statekeeper's records (pure, no I/O).

ADK names a session by ``(app_name, user_id, session_id)``, three free strings; a
statekeeper id is restricted (`statekeeper.ids`). So every stored id is a hash of the
names it stands for, and the names themselves are kept beside it (session metadata,
record values), where reads check them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError as AdkAlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events import Event
from google.adk.sessions import State
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    InvalidPayloadError,
    NotFoundError,
)
from statekeeper.ids import MAX_ID_LENGTH, validate_id
from statekeeper.integrations.adk._rebuild import Unsupported, builder
from statekeeper.stores.base import Entry, EntryKind

__all__ = [
    "APP_KEY",
    "EVENT_KIND",
    "ID_KEY",
    "ORDER_KEY",
    "STATE_NAMESPACE",
    "UPDATED_KEY",
    "USER_KEY",
    "AdkSessionExistsError",
    "AdkSessionNotFoundError",
    "AdkStaleSessionError",
    "app_record_key",
    "check_name",
    "decode_event",
    "encode_event",
    "entry_id",
    "session_key",
    "split_delta",
    "state_log_id",
    "user_record_key",
    "user_record_prefix",
]

EVENT_KIND = "adk.event"
"""The transcript entry kind of a stored ADK event."""
STATE_NAMESPACE = "adk.state"
"""The record namespace of app-wide and per-user state."""
APP_KEY, USER_KEY, ID_KEY, UPDATED_KEY = "adk.app", "adk.user", "adk.id", "adk.updated"
"""Session metadata: the ADK names and ADK's ``last_update_time`` (a float)."""
ORDER_KEY = "adk.ordered"
"""Session metadata: True while the events are in timestamp order (see `_reads`)."""


class AdkSessionExistsError(AlreadyExistsError, AdkAlreadyExistsError):
    """A session id already taken for this app and user (ADK's ``AlreadyExistsError``)."""


class AdkStaleSessionError(ConflictError, StaleSessionError):
    """The session changed in the store since this object was loaded (ADK's
    ``StaleSessionError``): reload it with ``get_session`` and append again."""


class AdkSessionNotFoundError(NotFoundError, SessionNotFoundError):
    """Appending to a session that does not exist (ADK's ``SessionNotFoundError``)."""


def _digest(*names: str) -> str:
    # JSON of the list, so ("a:b", "c") and ("a", "b:c") never hash alike.
    return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:32]


def check_name(value: object, what: str) -> str:
    """``value`` if it is a non-empty string, else `InvalidInputError`."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{what} must be a non-empty string, got {value!r}")
    return value


def session_key(app_name: str, user_id: str, session_id: str) -> str:
    """The statekeeper session id of an ADK session."""
    return f"adk-{_digest(app_name, user_id, session_id)}"


def app_record_key(app_name: str) -> str:
    """The record key of an app's shared state."""
    return f"app.{_digest(app_name)}"


def state_log_id(app_name: str) -> str:
    """The event log of an app's ``app:`` and ``user:`` state deltas (`_shared`)."""
    return f"adk.state.{_digest(app_name)}"


def user_record_prefix(app_name: str) -> str:
    """The key prefix of every user-state record of an app."""
    return f"user.{_digest(app_name)}."


def user_record_key(app_name: str, user_id: str) -> str:
    """The record key of one user's state in an app."""
    return user_record_prefix(app_name) + _digest(user_id)


def entry_id(event_id: str) -> str:
    """The transcript entry id of an event: its own id when that is a valid id (so an
    equal re-delivery is stored once), else a hash of it."""
    candidate = f"ev:{event_id}"
    if len(candidate) <= MAX_ID_LENGTH and event_id:
        try:
            return validate_id(candidate, "entry id")
        except InvalidInputError:
            pass
    return f"ev-{_digest(event_id)}"


def jsonable(value: dict[str, Any], what: str) -> dict[str, Any]:
    """State as JSON data, converted the way ADK's database services convert it
    (datetimes, models ...); `InvalidPayloadError` when there is no JSON form."""
    try:
        out = to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidPayloadError(f"{what} has a value with no JSON form: {exc}") from exc
    if not isinstance(out, dict):  # pragma: no cover - a dict stays a dict
        raise InvalidPayloadError(f"{what} must be a dict")
    return out


def split_delta(delta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``app``, ``user`` and ``session`` parts of a state delta, prefixes removed;
    ``temp:`` keys are dropped (never persisted)."""
    parts: dict[str, dict[str, Any]] = {"app": {}, "user": {}, "session": {}}
    for key, value in delta.items():
        if key.startswith(State.APP_PREFIX):
            parts["app"][key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            parts["user"][key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            parts["session"][key] = value
    return parts


_build_event = builder(Event)


def encode_event(event: Event) -> dict[str, Any]:
    """The stored form of an event: its JSON dump without unset (None) fields, the
    form ADK's own database services store."""
    try:
        return event.model_dump(mode="json", exclude_none=True)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        problem = f"event {event.id!r} has a value with no JSON form: {exc}"
        raise InvalidPayloadError(problem) from exc


def decode_event(entry: Entry) -> Event:
    """The event an entry stores. A stored row that cannot be read (a corrupt entry, or
    data ADK no longer accepts) becomes an error event naming it, so the valid rest of
    the session is still served and the damage is visible, never skipped."""
    if entry.kind == EVENT_KIND:
        try:
            # The dump `encode_event` stored, built back without validating it again
            # (`_rebuild`: the same event, several times faster) ...
            return _build_event(entry.payload)
        except Unsupported:
            pass
        try:
            # ... or, for a shape `_rebuild` does not know, validated from JSON text
            # (pydantic's JSON path is about 5x faster for an Event than from a dict).
            return Event.model_validate_json(json.dumps(entry.payload))
        except ValidationError as exc:
            problem = f"stored event {entry.id!r} (entry {entry.seq}) is invalid: {exc}"
    elif entry.kind == EntryKind.CORRUPT:
        problem = f"stored entry {entry.id!r} (entry {entry.seq}) is corrupt: {entry.payload}"
    else:
        problem = f"entry {entry.id!r} (entry {entry.seq}) of kind {entry.kind!r} is not an event"
    return Event(
        id=entry.id,
        author="statekeeper",
        invocation_id="",
        error_code="STATEKEEPER_UNREADABLE_ENTRY",
        error_message=problem,
        timestamp=entry.created_at.timestamp(),
    )
