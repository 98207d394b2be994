"""`StatekeeperSessionService`: Google ADK's ``BaseSessionService`` over any statekeeper store.

The mapping (docs/integrations/adk.md has the long form):

- one service instance is bound to one statekeeper tenant; every ADK app and user it
  serves lives inside that tenant, so tenants stay invisible to each other;
- an ADK session is a statekeeper session whose id is a hash of ``(app_name, user_id,
  session_id)``; the three names are its metadata (``adk.app``, ``adk.user``,
  ``adk.id``), which is what listing an app's or a user's sessions filters on;
- each ADK event is one transcript entry (kind ``adk.event``) holding the event's JSON,
  appended with compare-and-set on the session's version: that version is the stale
  check, carried on the ADK session object;
- session-scoped state is the session record's ``state``; app and user state are a
  log of deltas per app, written in the same commit as the event that carries them,
  with snapshot records of the tenant (namespace ``adk.state``) that keep reads short
  (`_shared`); ``temp:`` keys are never stored.

A store passed in stays the caller's; one opened by ``from_url`` is the service's, which
``close()`` / ``aclose()`` / ``async with`` / ``with`` close (see
`statekeeper.integrations._owned`). One service object serves any thread and loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Self

from google.adk.events import Event
from google.adk.sessions import BaseSessionService, Session
from google.adk.sessions.base_session_service import GetSessionConfig, ListSessionsResponse
from google.adk.sessions.state import State

from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    StatekeeperError,
)
from statekeeper.ids import validate_id
from statekeeper.integrations._owned import AdapterStore, StoreLifecycle, on_store
from statekeeper.integrations.adk._codec import (
    APP_KEY,
    EVENT_KIND,
    ID_KEY,
    ORDER_KEY,
    UPDATED_KEY,
    USER_KEY,
    AdkSessionExistsError,
    AdkSessionNotFoundError,
    AdkStaleSessionError,
    check_name,
    encode_event,
    entry_id,
    jsonable,
    session_key,
    split_delta,
)
from statekeeper.integrations.adk._reads import (
    Order,
    marker,
    order_after,
    order_of,
    parse_marker,
    read_events,
)
from statekeeper.integrations.adk._shared import SharedState
from statekeeper.stores import Store
from statekeeper.stores.base import EntryDraft, SessionPatch, SessionQuery, SessionRecord

__all__ = ["StatekeeperSessionService"]

_STALE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
_PAGE = 1000


class StatekeeperSessionService(StoreLifecycle, BaseSessionService):
    """ADK sessions, events and state in a statekeeper store, for one tenant.

    ``StatekeeperSessionService(store, tenant="acme")`` serves every ADK app and user of
    tenant ``acme`` and leaves the store the caller's.
    ``StatekeeperSessionService.from_url(url)`` opens a store of its own, which `close`,
    `aclose`, ``async with`` and ``with`` close. Inside a running loop ``close()`` does
    not block, and ``await service.close()`` (ADK's style) waits for it.
    """

    def __init__(self, store: Store, *, tenant: str = "adk") -> None:
        self._tenant = validate_id(tenant, "tenant")
        self._stores = AdapterStore.given(store, "StatekeeperSessionService")
        self._setup()

    @classmethod
    def from_url(cls, url: str, *, tenant: str = "adk", **options: Any) -> Self:
        """A service over a store of its own, opened from ``url`` (``options`` go to
        `open_store`), which `close` closes (as leaving ``async with`` or ``with`` does).

        A plain constructor, in synchronous code and inside a running event loop, which it
        does not block: the store opens on statekeeper's background loop, where the
        service's calls run. ``async with`` (or ``with`` in synchronous code) waits for
        the open, so a store that cannot open fails there; otherwise the first call
        raises it.
        """
        service = cls.__new__(cls)
        service._tenant = validate_id(tenant, "tenant")
        service._stores = AdapterStore.open(url, options, "StatekeeperSessionService")
        service._setup()
        return service

    def _setup(self) -> None:
        self._shared_state: SharedState | None = None
        # (loop, session key) -> the lock serialising appends, with its number of users.
        self._locks: dict[tuple[asyncio.AbstractEventLoop, str], tuple[asyncio.Lock, int]] = {}

    @property
    def store(self) -> Store:
        """The store sessions live in (one opened by `from_url` is waited for if it is
        still opening)."""
        return self._stores.store()

    @property
    def _store(self) -> Store:
        return self._stores.store()

    @property
    def _shared(self) -> SharedState:
        if self._shared_state is None:
            self._shared_state = SharedState(self._store, self._tenant)
        return self._shared_state

    # -- sessions -------------------------------------------------------------------------

    @on_store
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new session; `AdkSessionExistsError` (ADK's ``AlreadyExistsError``) when
        ``session_id`` is taken for this app and user. ``app:`` and ``user:`` keys of
        ``state`` go to the shared scopes, ``temp:`` keys are dropped."""
        check_name(app_name, "app_name")
        check_name(user_id, "user_id")
        session_id = session_id.strip() if session_id else None
        session_id = session_id or str(uuid.uuid4())
        parts = split_delta(jsonable(state or {}, "initial state"))
        record = SessionRecord(
            id=session_key(app_name, user_id, session_id),
            tenant=self._tenant,
            metadata={
                APP_KEY: app_name,
                USER_KEY: user_id,
                ID_KEY: session_id,
                UPDATED_KEY: time.time(),
                ORDER_KEY: True,
            },
            state=parts["session"],
        )
        try:
            created = await self._store.create_session(record)
        except AlreadyExistsError as exc:
            raise AdkSessionExistsError(f"Session with id {session_id} already exists.") from exc
        try:
            await self._shared.log(app_name, user_id, parts)
        except BaseException:
            # The session is new and nobody holds it yet: removing it undoes the call.
            with contextlib.suppress(StatekeeperError):
                await self._store.delete_session(self._tenant, created.id)
            raise
        await self._catch_up(app_name)
        return await self._to_session(created, [])

    @on_store
    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events (filtered by ``config``) and merged state, or None."""
        record = await self._find(app_name, user_id, session_id)
        if record is None:
            return None
        events = await read_events(self._store, self._tenant, record, config)
        return await self._to_session(record, events)

    @on_store
    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """A user's sessions of the app (every user's when ``user_id`` is None), without
        events, oldest update first."""
        metadata: dict[str, str | int | float | bool | None] = {APP_KEY: app_name}
        if user_id is not None:
            metadata[USER_KEY] = user_id
        records: list[SessionRecord] = []
        cursor: str | None = None
        while True:
            page = await self._store.list_sessions(
                self._tenant, SessionQuery(metadata=metadata, limit=_PAGE, cursor=cursor)
            )
            # Names are compared again: SQLite's metadata filter cuts strings at a NUL.
            records += [r for r in page.items if _names_match(r, app_name, user_id)]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        if user_id is not None:
            app_state, user_state = await self._shared.app_and_user(app_name, user_id)
            users = {user_id: user_state}
        else:
            app_state = await self._shared.app(app_name)
            users = await self._shared.users(app_name)
        sessions = [
            self._build(r, [], app_state, users.get(str(r.metadata[USER_KEY]), {})) for r in records
        ]
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    @on_store
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session and its events (no error if it does not exist). App and
        user state stay, as in ADK's services."""
        record = await self._find(app_name, user_id, session_id)
        if record is None:
            return
        try:
            await self._store.delete_session(self._tenant, record.id)
        except NotFoundError:
            return  # deleted meanwhile: the outcome asked for

    @on_store
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state in the app, keys without ``user:``."""
        return await self._shared.user(app_name, user_id)

    # -- events ---------------------------------------------------------------------------

    @on_store
    async def append_event(self, session: Session, event: Event) -> Event:
        """Store ``event`` and apply its state delta; partial events are not stored.

        Raises `AdkStaleSessionError` (ADK's ``StaleSessionError``) when the session
        changed in the store since ``session`` was loaded, and `AdkSessionNotFoundError`
        (ADK's ``SessionNotFoundError``) when it does not exist. The event, its session
        state and its ``app:`` / ``user:`` deltas are one commit: a failed call, or a
        crash anywhere in it, stores all of them or none.
        """
        if not isinstance(session, Session) or not isinstance(event, Event):
            raise InvalidInputError(
                "append_event takes an ADK Session (from create_session or get_session) and "
                f"an Event, got {type(session).__name__} and {type(event).__name__}"
            )
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        delta = event.actions.state_delta if event.actions else {}
        parts = split_delta(jsonable(delta or {}, "state delta"))
        draft = EntryDraft(id=entry_id(event.id), kind=EVENT_KIND, payload=encode_event(event))
        key = session_key(session.app_name, session.user_id, session.id)
        with self._counted_lock(key) as lock:
            async with lock:
                expected, record, order = await self._expected_version(
                    session, key, parts["session"]
                )
                fields: dict[str, Any] = {
                    "metadata": {
                        APP_KEY: session.app_name,
                        USER_KEY: session.user_id,
                        ID_KEY: session.id,
                        UPDATED_KEY: event.timestamp,
                        ORDER_KEY: order_after(order, event.timestamp),
                    }
                }
                if record is not None:
                    fields["state"] = {**record.state, **parts["session"]}
                try:
                    shared = await self._shared.batch(session.app_name, session.user_id, parts)
                    result = await self._store.append_entries(
                        self._tenant,
                        key,
                        [draft],
                        expected_version=expected,
                        patch=SessionPatch(set=fields),
                        events=shared,
                    )
                except BaseException as exc:
                    mapped = _adk_error(exc, session.id)
                    if mapped is exc:
                        raise
                    raise mapped from exc
                if result.replayed:
                    return event  # an equal re-delivery: stored once, applied once
                if shared is not None:
                    await self._catch_up(session.app_name)
                session.last_update_time = event.timestamp
                session._storage_update_marker = marker(result.session)
        return self._commit_event_to_session(session, event)

    # -- helpers --------------------------------------------------------------------------

    @contextmanager
    def _counted_lock(self, session_key: str) -> Iterator[asyncio.Lock]:
        """The lock that serialises this process's appends to one session (the parallel
        branches of one ADK invocation share a session object), dropped when unused.
        One per event loop (an asyncio lock serves one): the branches of an invocation
        run on one loop, and appends from other loops are checked by the store."""
        key = (asyncio.get_running_loop(), session_key)
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            yield lock
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    async def _expected_version(
        self, session: Session, key: str, session_delta: dict[str, Any]
    ) -> tuple[int, SessionRecord | None, Order]:
        """The version the append must find, the stored record when it was read (always
        when the event changes session state, which is merged into it), and the order
        facts of the log at that version (`_reads`)."""
        known = parse_marker(session._storage_update_marker)
        version = known[0] if known else None
        if known is not None and not session_delta:
            return known[0], None, known[1]
        try:
            record = await self._store.get_session(self._tenant, key)
        except NotFoundError:
            raise AdkSessionNotFoundError(f"Session {session.id} not found.") from None
        if version is not None:
            if record.version != version:
                raise AdkStaleSessionError(_STALE, expected=version, actual=record.version)
            return version, record, order_of(record)
        # A session object this service did not load: stale only when the store moved
        # on past it, as ADK's DatabaseSessionService decides for marker-less sessions.
        stored = record.metadata.get(UPDATED_KEY)
        moved_on = isinstance(stored, int | float) and stored > session.last_update_time
        if moved_on and not await self._same_last_event(record, session.events):
            raise AdkStaleSessionError(_STALE, expected=None, actual=record.version)
        return record.version, record, order_of(record)

    async def _same_last_event(self, record: SessionRecord, events: Sequence[Event]) -> bool:
        if not events:
            return record.last_seq == 0
        last = await self._store.read_entries(
            self._tenant, record.id, after_seq=max(0, record.last_seq - 1)
        )
        return bool(last) and last[-1].id == entry_id(events[-1].id)

    async def _catch_up(self, app_name: str) -> None:
        """Move the app's state snapshots on (`SharedState.catch_up`). The deltas are
        committed already and reads fold what a snapshot lacks, so a failure here loses
        nothing: the next write of the app finishes it."""
        with contextlib.suppress(StatekeeperError):
            await self._shared.catch_up(app_name)

    async def _find(self, app_name: str, user_id: str, session_id: str) -> SessionRecord | None:
        if not all(isinstance(n, str) for n in (app_name, user_id, session_id)):
            return None
        session_id = session_id.strip()
        try:
            record = await self._store.get_session(
                self._tenant, session_key(app_name, user_id, session_id)
            )
        except NotFoundError:
            return None
        names = (record.metadata.get(APP_KEY), record.metadata.get(USER_KEY))
        if names != (app_name, user_id) or record.metadata.get(ID_KEY) != session_id:
            return None  # not an ADK session of these names (ids are hashes of them)
        return record

    async def _to_session(self, record: SessionRecord, events: list[Event]) -> Session:
        app_name, user_id = str(record.metadata[APP_KEY]), str(record.metadata[USER_KEY])
        return self._build(record, events, *await self._shared.app_and_user(app_name, user_id))

    def _build(
        self,
        record: SessionRecord,
        events: list[Event],
        app_state: dict[str, Any],
        user_state: dict[str, Any],
    ) -> Session:
        state: dict[str, Any] = dict(record.state)
        state.update({State.APP_PREFIX + k: v for k, v in app_state.items()})
        state.update({State.USER_PREFIX + k: v for k, v in user_state.items()})
        updated = record.metadata.get(UPDATED_KEY)
        session = Session(
            id=str(record.metadata[ID_KEY]),
            app_name=str(record.metadata[APP_KEY]),
            user_id=str(record.metadata[USER_KEY]),
            state=state,
            events=events,
            last_update_time=float(updated) if isinstance(updated, int | float) else 0.0,
        )
        session._storage_update_marker = marker(record)
        return session


def _names_match(record: SessionRecord, app_name: str, user_id: str | None) -> bool:
    metadata = record.metadata
    if metadata.get(APP_KEY) != app_name:
        return False
    return user_id is None or metadata.get(USER_KEY) == user_id


def _adk_error(exc: BaseException, session_id: str) -> BaseException:
    """The ADK error a store error on append stands for (others pass through)."""
    if (
        isinstance(exc, ConflictError)
        and exc.expected is not None
        and not isinstance(exc, AdkStaleSessionError)
    ):
        return AdkStaleSessionError(_STALE, expected=exc.expected, actual=exc.actual)
    if isinstance(exc, NotFoundError) and not isinstance(exc, AdkSessionNotFoundError):
        return AdkSessionNotFoundError(f"Session {session_id} not found.")
    return exc
