"""App-wide and per-user ADK state: a log of deltas per app, folded into snapshot records.

Each app has one event log in the service's tenant (`_codec.state_log_id`). The
``app:`` and ``user:`` deltas of an ADK event are logged in the same commit as the event
(``append_entries(events=...)``, see `SharedState.batch`), so a crash keeps both or
neither. The state is the log folded in order, the way ``dict.update`` merges (the last
write of a key wins).

Snapshots keep reads short: the app's record and each user's record (namespace
``adk.state``, keys from `_codec`) hold the state up to log seq ``through``, and a read
folds only the log's tail after it. `SharedState.catch_up` moves the snapshots on after
each write (a later one finishes what a crash left): it folds the tail into the record
of every user in it first, then into the app's record, which keeps this true: a user's
delta at a seq up to the app record's ``through`` is in that user's record. So a read
takes the app record first, then the user's, then the tail after the app's ``through``.
Records written before the log existed have no ``through`` (0) and read as they did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from statekeeper.errors import ConflictError, NotFoundError
from statekeeper.integrations.adk._codec import (
    STATE_NAMESPACE,
    app_record_key,
    state_log_id,
    user_record_key,
    user_record_prefix,
)
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES, encode_json
from statekeeper.stores.base import Event, EventBatch, EventDraft, Store

__all__ = ["STATE_EVENT", "SharedState"]

STATE_EVENT = "adk.state"
"""The kind of a logged delta: stream ``app`` (payload ``delta``) or ``user`` (payload
``user`` and ``delta``)."""

_MAX_ATTEMPTS = 10
_PAGE = 500


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """A state record as read: the state through log seq ``through``, and its version
    (0 when there is no record)."""

    state: dict[str, Any]
    through: int
    version: int


def _fold(state: dict[str, Any], events: Iterable[Event]) -> dict[str, Any]:
    merged = dict(state)
    for event in events:
        delta = event.payload.get("delta")
        if isinstance(delta, dict):
            merged.update(delta)
    return merged


def _of_user(events: Iterable[Event], user_id: str, after: int) -> list[Event]:
    return [
        e
        for e in events
        if e.stream == "user" and e.payload.get("user") == user_id and e.seq > after
    ]


class SharedState:
    """Reads, logs and snapshots the app and user state of one tenant."""

    def __init__(self, store: Store, tenant: str) -> None:
        self._store = store
        self._tenant = tenant

    # -- reads ------------------------------------------------------------------------------

    async def _load(self, key: str) -> _Snapshot:
        try:
            record = await self._store.get_record(self._tenant, STATE_NAMESPACE, key)
        except NotFoundError:
            return _Snapshot({}, 0, 0)
        return _snapshot(record.value, record.version)

    async def _tail(self, app_name: str, after: int) -> list[Event]:
        """The app's logged deltas after seq ``after``."""
        events: list[Event] = []
        while True:
            page = await self._store.read_events(
                self._tenant, state_log_id(app_name), after_seq=after, limit=_PAGE
            )
            events += page
            if len(page) < _PAGE:
                return events
            after = page[-1].seq

    async def app(self, app_name: str) -> dict[str, Any]:
        """The app's state (keys without ``app:``)."""
        snap = await self._load(app_record_key(app_name))
        tail = await self._tail(app_name, snap.through)
        return _fold(snap.state, (e for e in tail if e.stream == "app"))

    async def app_and_user(
        self, app_name: str, user_id: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The app's state and one user's state in it (keys without prefixes)."""
        app = await self._load(app_record_key(app_name))  # first: see the module docstring
        user = await self._load(user_record_key(app_name, user_id))
        tail = await self._tail(app_name, app.through)
        app_state = _fold(app.state, (e for e in tail if e.stream == "app"))
        return app_state, _fold(user.state, _of_user(tail, user_id, user.through))

    async def user(self, app_name: str, user_id: str) -> dict[str, Any]:
        """One user's state in the app (keys without ``user:``)."""
        return (await self.app_and_user(app_name, user_id))[1]

    async def users(self, app_name: str) -> dict[str, dict[str, Any]]:
        """Every user's state in the app, by user id."""
        app = await self._load(app_record_key(app_name))
        snapshots: dict[str, _Snapshot] = {}
        after: str | None = None
        while True:
            page = await self._store.list_records(
                self._tenant,
                STATE_NAMESPACE,
                prefix=user_record_prefix(app_name),
                after_key=after,
                limit=_PAGE,
            )
            for record in page:
                value = record.value
                if isinstance(value, dict) and isinstance(value.get("state"), dict):
                    snapshots[str(value.get("user"))] = _snapshot(value, record.version)
            if len(page) < _PAGE:
                break
            after = page[-1].key
        tail = await self._tail(app_name, app.through)
        for user_id in {str(e.payload.get("user")) for e in tail if e.stream == "user"}:
            snapshots.setdefault(user_id, _Snapshot({}, 0, 0))
        return {
            user_id: _fold(snap.state, _of_user(tail, user_id, snap.through))
            for user_id, snap in snapshots.items()
        }

    # -- writes -----------------------------------------------------------------------------

    async def batch(
        self, app_name: str, user_id: str, parts: dict[str, dict[str, Any]]
    ) -> EventBatch | None:
        """The log events of the ``app`` and ``user`` parts of a delta (None when both
        are empty), to write with the ADK event. Refuses first what a snapshot could not
        hold (values that are not JSON, a state past the store's payload limit)."""
        drafts: list[EventDraft] = []
        if parts["app"]:
            drafts.append(
                EventDraft(stream="app", kind=STATE_EVENT, payload={"delta": parts["app"]})
            )
        if parts["user"]:
            payload = {"user": user_id, "delta": parts["user"]}
            drafts.append(EventDraft(stream="user", kind=STATE_EVENT, payload=payload))
        if not drafts:
            return None
        limit = getattr(self._store, "max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES)
        app_state, user_state = await self.app_and_user(app_name, user_id)
        for scope, state, delta in (
            ("app", app_state, parts["app"]),
            ("user", user_state, parts["user"]),
        ):
            if delta:
                value = {
                    "app": app_name,
                    "user": user_id,
                    "state": {**state, **delta},
                    "through": 0,
                }
                encode_json(value, what=f"{scope} state of {app_name!r}", limit=limit)
        return EventBatch(log_id=state_log_id(app_name), events=drafts)

    async def log(self, app_name: str, user_id: str, parts: dict[str, dict[str, Any]]) -> None:
        """Log the ``app`` and ``user`` parts of a delta on their own (one commit)."""
        batch = await self.batch(app_name, user_id, parts)
        if batch is not None:
            await self._store.append_events(self._tenant, batch.log_id, batch.events)

    async def catch_up(self, app_name: str) -> None:
        """Fold the log's tail into the snapshot records: each user's in it first, then
        the app's (a snapshot another writer moved on meanwhile is read again)."""
        key = app_record_key(app_name)
        for _ in range(_MAX_ATTEMPTS):
            app = await self._load(key)
            tail = await self._tail(app_name, app.through)
            if not tail:
                return
            last = tail[-1].seq
            for user_id in dict.fromkeys(
                str(e.payload.get("user")) for e in tail if e.stream == "user"
            ):
                await self._advance_user(app_name, user_id, tail, last)
            value: dict[str, Any] = {
                "app": app_name,
                "state": _fold(app.state, (e for e in tail if e.stream == "app")),
                "through": last,
            }
            try:
                await self._store.put_record(
                    self._tenant, STATE_NAMESPACE, key, value, expected_version=app.version
                )
            except ConflictError:
                continue
            return
        raise ConflictError(f"app state of {app_name!r} kept changing under other writers")

    async def _advance_user(
        self, app_name: str, user_id: str, tail: list[Event], last: int
    ) -> None:
        key = user_record_key(app_name, user_id)
        for _ in range(_MAX_ATTEMPTS):
            snap = await self._load(key)
            if snap.through >= last:
                return
            value: dict[str, Any] = {
                "app": app_name,
                "user": user_id,
                "state": _fold(snap.state, _of_user(tail, user_id, snap.through)),
                "through": last,
            }
            try:
                await self._store.put_record(
                    self._tenant, STATE_NAMESPACE, key, value, expected_version=snap.version
                )
            except ConflictError:
                continue
            return
        raise ConflictError(f"user state of {app_name!r} kept changing under other writers")


def _snapshot(value: object, version: int) -> _Snapshot:
    if not isinstance(value, dict):
        return _Snapshot({}, 0, version)
    state, through = value.get("state"), value.get("through")
    return _Snapshot(
        dict(state) if isinstance(state, dict) else {},
        through if isinstance(through, int) and not isinstance(through, bool) else 0,
        version,
    )
