"""`StatekeeperSession`: the OpenAI Agents SDK's ``Session`` over any statekeeper store.

Each SDK item is one verbatim ``item`` entry of a statekeeper session (see
`statekeeper.sessions.basics`): stored as given and returned equal. The rules are the
session log's, so nothing is rewritten:

- ``add_items`` appends one batch atomically onto whatever the head is then, so
  concurrent writers (tasks or processes) serialise instead of failing or interleaving
  inside a batch;
- ``pop_item`` moves the head back to the popped entry's parent (compare-and-set,
  retried on a concurrent change); ``clear_session`` appends a root ``clear`` marker.
  Both keep the earlier entries stored and readable (`Session.entries`, export);
  ``delete`` removes the session and its entries for good;
- ``get_items(limit)`` walks the active branch back from the head, reading the log in
  growing windows, so the newest N items cost about N entries, not the whole history.

Observable behaviour matches the SDK's ``SQLiteSession`` (ordering, ``limit`` None / 0 /
negative / above the count, ``session_settings.limit``, pop on empty, isolation by id),
and so do the exception types its callers catch (``TypeError`` for unknown settings and
items it cannot store, ``RuntimeError`` once closed).

``StatekeeperSession.from_url`` opens a store of its own, which it closes (see
`statekeeper.integrations._owned`); a store passed in stays the caller's.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Self, cast

from agents.memory import SessionABC, SessionSettings
from agents.memory.session_settings import coerce_session_settings, resolve_session_limit

from statekeeper.core.convert import to_openai_responses
from statekeeper.errors import (
    ConflictError,
    InvalidInputError,
    InvalidPayloadError,
    NotFoundError,
    PayloadTooLargeError,
    StoreCorruptError,
)
from statekeeper.ids import validate_id
from statekeeper.integrations._owned import AdapterStore, StoreLifecycle, on_store
from statekeeper.integrations.openai_agents._sdk import settled
from statekeeper.sessions import Session, SessionManager
from statekeeper.sessions.basics import (
    ITEM_KIND,
    branch_items,
    clear_plan,
    is_clear_marker,
    pop_plan,
    verbatim_drafts,
)
from statekeeper.stores.base import Entry, EntryKind, SessionPatch, SessionRecord, Store

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

__all__ = ["InvalidItemsError", "InvalidSessionSettingsError", "StatekeeperSession"]

_log = logging.getLogger(__name__)
_SLACK = 16
_CAS_ATTEMPTS = 50
_MESSAGE_KINDS = frozenset({EntryKind.MESSAGE, EntryKind.COMPACTION})
METADATA = {"integration": "openai-agents"}
"""Metadata of the sessions `StatekeeperSession` creates (list them with it)."""


class _NeedsBranch(Exception):
    """The branch holds statekeeper messages: read it whole, with conversion."""


class InvalidSessionSettingsError(InvalidInputError, TypeError):
    """``session_settings`` the SDK's ``SessionSettings`` refuses (not a dict or
    ``SessionSettings``, an unknown field, a bad value). Also a ``TypeError``, which is
    what ``SQLiteSession`` raises for these (and a ``ValueError``, as every
    `InvalidInputError` is)."""


class InvalidItemsError(InvalidPayloadError, TypeError):
    """Items ``add_items`` cannot store (not a list of JSON objects). Also a
    ``TypeError``, which is what ``SQLiteSession`` raises for an item ``json.dumps``
    refuses."""


class StatekeeperSession(StoreLifecycle, SessionABC):
    """The SDK's ``Session`` (``get_items`` / ``add_items`` / ``pop_item`` /
    ``clear_session``) over a statekeeper store, tenant-scoped.

    The statekeeper session is created on the first ``add_items`` (with metadata
    ``{"integration": "openai-agents"}``); reading an absent one gives ``[]``. A store
    passed in is the caller's to close; one opened by `from_url` is the session's
    (`close`, `aclose`, ``with``, ``async with``): ``close()`` is synchronous, as
    ``SQLiteSession.close()``, and later calls raise `AdapterClosedError` (a
    ``RuntimeError``, as ``SQLiteSession``'s). Bad ids raise `InvalidIdError`, bad
    items `InvalidItemsError`, bad settings `InvalidSessionSettingsError`, a bad limit
    `InvalidInputError`; a failed call stores nothing. One session object may be used
    from any thread and event loop.
    """

    def __init__(
        self,
        session_id: str,
        store: Store,
        *,
        tenant: str = "default",
        session_settings: SessionSettings | dict[str, Any] | None = None,
        agent_id: str | None = None,
    ) -> None:
        self._setup(session_id, tenant, session_settings, agent_id)
        self._stores = AdapterStore.given(store, "StatekeeperSession")

    @classmethod
    def from_url(
        cls,
        session_id: str,
        url: str,
        *,
        tenant: str = "default",
        session_settings: SessionSettings | dict[str, Any] | None = None,
        agent_id: str | None = None,
        **options: Any,
    ) -> Self:
        """A session over a store of its own, opened from ``url`` (``options`` go to
        `open_store`), which `close` closes.

        Usable in synchronous code and inside a running event loop, which it does not
        block: the store opens on statekeeper's background loop, and a failure to open
        it (a bad option, a server that does not answer) is raised by the first call.
        """
        session = cls.__new__(cls)
        session._setup(session_id, tenant, session_settings, agent_id)
        session._stores = AdapterStore.open(url, options, "StatekeeperSession")
        return session

    def _setup(
        self,
        session_id: str,
        tenant: str,
        session_settings: SessionSettings | dict[str, Any] | None,
        agent_id: str | None,
    ) -> None:
        self.session_id = validate_id(session_id, "session id")
        # Checks tenant and agent id as the manager will (no I/O); it is made once the
        # store is known, which for an owned store is after it opened.
        SessionManager(cast(Store, None), tenant, agent_id=agent_id)
        self._tenant, self._agent_id = tenant, agent_id
        self._manager: SessionManager | None = None
        try:
            self.session_settings = (
                coerce_session_settings(session_settings)
                if session_settings is not None
                else SessionSettings()
            )
        except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            raise InvalidSessionSettingsError(
                f"session_settings must be SessionSettings or a dict like {{'limit': 20}}: {exc}"
            ) from None
        self.corrupt: list[Entry] = []
        """Entries the last read could not decode: reported here and logged, not returned."""

    def __repr__(self) -> str:
        return f"<StatekeeperSession {self.session_id} tenant={self.tenant}>"

    @property
    def tenant(self) -> str:
        """The tenant every read and write is scoped to."""
        return self._tenant

    @property
    def store(self) -> Store:
        """The statekeeper store the items live in (one opened by `from_url` is waited
        for if it is still opening)."""
        return self._stores.store()

    @property
    def manager(self) -> SessionManager:
        """The statekeeper `SessionManager` of the tenant, over `store`."""
        if self._manager is None:
            self._manager = SessionManager(self.store, self._tenant, agent_id=self._agent_id)
        return self._manager

    # -- the SDK's Session -----------------------------------------------------------------

    @on_store
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The latest ``limit`` items in order (``None``: ``session_settings.limit``, and
        all when that is ``None`` too; ``0``: none; negative: all, as ``SQLiteSession``)."""
        resolved = resolve_session_limit(_check_limit(limit), self.session_settings)
        wanted = _check_limit(resolved, "session_settings.limit")
        if wanted == 0:
            return []
        record = await self._record()
        if record is None:
            return []
        items = await self._latest_items(record, wanted if wanted and wanted > 0 else None)
        return cast("list[TResponseInputItem]", items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` as one atomic batch (an empty list stores nothing)."""
        self._stores.check_open()  # before the empty list's shortcut, as SQLiteSession
        try:
            drafts = verbatim_drafts(cast("list[dict[str, Any]]", items), "add_items")
        except PayloadTooLargeError:
            raise
        except InvalidInputError as exc:  # not a list of JSON objects
            raise InvalidItemsError(str(exc)) from None
        if drafts:
            await settled(self._stores.call(lambda: self._append(drafts)))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the most recent item and return it; ``None`` when there is none."""
        return cast("TResponseInputItem | None", await settled(self._stores.call(self._pop)))

    async def clear_session(self) -> None:
        """Empty the session (its entries stay stored; `delete` erases them)."""
        await settled(self._stores.call(self._clear))

    # -- statekeeper extras ----------------------------------------------------------------

    @on_store
    async def delete(self) -> None:
        """Erase the session and every entry it stored (no error if there is none)."""
        with contextlib.suppress(NotFoundError):
            await self.manager.delete(self.session_id)

    @on_store
    async def statekeeper_session(self) -> Session:
        """The statekeeper `Session` behind this one (created if absent), for forks,
        export, entries and the other statekeeper features."""
        return await self._statekeeper_session()

    # -- internals -------------------------------------------------------------------------

    async def _statekeeper_session(self) -> Session:
        return await self.manager.get_or_create(self.session_id, metadata=dict(METADATA))

    async def _record(self) -> SessionRecord | None:
        try:
            return await self.store.get_session(self.tenant, self.session_id)
        except NotFoundError:
            return None

    async def _append(self, drafts: list[Any]) -> None:
        store, tenant = self.store, self.tenant
        try:
            # No expected version: the store chains the batch onto the head it finds, so
            # concurrent writers serialise (as rows of one SQLite table would).
            await store.append_entries(tenant, self.session_id, drafts)
        except NotFoundError:
            await self._statekeeper_session()
            await store.append_entries(tenant, self.session_id, drafts)

    async def _pop(self) -> dict[str, Any] | None:
        for _ in range(_CAS_ATTEMPTS):
            record = await self._record()
            if record is None:
                return None
            try:
                tail = await self._walk(record, 1, skip_corrupt=False)
            except _NeedsBranch:
                try:
                    return await self._pop_message(record)
                except ConflictError:
                    continue
            if not tail:
                return None
            entry = tail[0]
            patch = SessionPatch(set={"head_seq": entry.parent_seq or 0})
            try:
                await self.store.update_session(
                    self.tenant, self.session_id, patch, expected_version=record.version
                )
            except ConflictError:
                continue  # another writer moved the head: look again
            return dict(entry.payload["item"])
        raise ConflictError(
            f"session {self.session_id!r} kept changing while popping; retry the call"
        )

    async def _pop_message(self, record: SessionRecord) -> dict[str, Any]:
        # The newest entry is a statekeeper message, not an SDK item: pop it as a message,
        # checked before the head moves so that a refused pop changes nothing.
        patch, popped = await pop_plan(self.manager, record)
        if isinstance(popped, dict):
            item = popped
        else:
            items = to_openai_responses([popped])
            if len(items) != 1:
                raise InvalidInputError(
                    f"the last message of session {self.session_id!r} is {len(items)} SDK "
                    "items (a message with tool calls); pop it with Session.pop, or clear"
                )
            item = items[0]
        await self.store.update_session(
            self.tenant, self.session_id, patch, expected_version=record.version
        )
        return item

    async def _clear(self) -> None:
        for _ in range(_CAS_ATTEMPTS):
            record = await self._record()
            if record is None or (record.head_seq == 0 and record.forked_from is None):
                return
            marker, patch = clear_plan(record)
            try:
                await self.store.append_entries(
                    self.tenant,
                    self.session_id,
                    [marker],
                    expected_version=record.version,
                    patch=patch,
                )
            except ConflictError:
                continue
            return
        raise ConflictError(
            f"session {self.session_id!r} kept changing while clearing; retry the call"
        )

    async def _latest_items(self, record: SessionRecord, wanted: int | None) -> list[Any]:
        self.corrupt = []
        try:
            entries = await self._walk(record, wanted, skip_corrupt=True)
            return [entry.payload["item"] for entry in entries]
        except _NeedsBranch:
            branch = await self.manager.load_branch(record)
            self.corrupt = [e for e in branch if e.kind == EntryKind.CORRUPT]
            items = branch_items(branch)
            return items[-wanted:] if wanted is not None else items

    async def _walk(
        self, record: SessionRecord, wanted: int | None, *, skip_corrupt: bool
    ) -> list[Entry]:
        """The last ``wanted`` item entries of the active branch (all when None), in
        order. `_NeedsBranch` when statekeeper messages or a fork's history lie on it."""
        found: list[Entry] = []
        loaded: dict[int, Entry] = {}
        window = (wanted or 0) + _SLACK  # a few more than asked: pops leave dead entries
        seq = record.head_seq
        limit = -1 if wanted is None else wanted
        item, marker = ITEM_KIND, EntryKind.MARKER
        # The loop runs once per item of a whole transcript: the usual entry (an item
        # whose payload holds a dict) is decided with the fewest lookups.
        while seq and len(found) != limit:
            entry = loaded.get(seq)
            if entry is None:
                after = 0 if wanted is None else max(0, seq - window)
                read = await self.store.read_entries(
                    self.tenant, self.session_id, after_seq=after, until_seq=seq
                )
                loaded.update({e.seq: e for e in read})
                window *= 2
                entry = loaded.get(seq)
                if entry is None:
                    raise StoreCorruptError(
                        f"entry {seq} of session {self.session_id!r} is on the active branch "
                        "but missing from the store"
                    )
            kind = entry.kind
            if kind == item and type(entry.payload.get("item")) is dict:
                found.append(entry)
            elif kind == marker and is_clear_marker(entry):
                break
            elif kind in _MESSAGE_KINDS:
                raise _NeedsBranch
            elif kind == EntryKind.CORRUPT or kind == item:
                if not skip_corrupt:
                    raise StoreCorruptError(
                        f"the last entry ({entry.seq}) of session {self.session_id!r} cannot "
                        "be decoded; see Session.entries, or clear the session"
                    )
                self._report(entry)
            seq = entry.parent_seq or 0
        if not seq and record.forked_from is not None and len(found) != limit:
            raise _NeedsBranch  # the rest is the history this session was forked from
        found.reverse()
        return found

    def _report(self, entry: Entry) -> None:
        self.corrupt.append(entry)
        _log.warning(
            "session %r (tenant %r): entry %d cannot be decoded and is left out of get_items",
            self.session_id,
            self.tenant,
            entry.seq,
        )


def _check_limit(limit: object, what: str = "limit") -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInputError(f"{what} must be an int or None, got {type(limit).__name__}")
    return limit
