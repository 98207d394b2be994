"""Sessions for one tenant: create, load, list, delete, and the `Session` handle.

A `Session` is a handle on one conversation. Appends are O(1): one transcript entry per
message and a small head update, never a rewrite. By default a handle appends only on
top of the version it last saw, so two writers on one conversation get a typed
`ConflictError` instead of an interleaved transcript; ``strict=False`` re-reads the head
and tries again instead (each append is chained onto whatever the head is then).

Every write goes to the conversation's live session: a handle on a session that was
continued follows the links first (see `statekeeper.sessions.continuation`), and the
compare-and-set keeps a write planned before another writer continued the session
out of it.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from statekeeper.core.context import ContextWindow, build_context_window
from statekeeper.core.messages import Message
from statekeeper.core.tokens import DEFAULT_COUNTER, TokenCounter, message_tokens
from statekeeper.core.typed import typed_input
from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
)
from statekeeper.ids import new_id, validate_id
from statekeeper.sessions.basics import SessionBasics, is_clear_marker
from statekeeper.sessions.compaction import CompactionResult, Summarizer, compact_session
from statekeeper.sessions.continuation import (
    check_limit,
    check_room,
    crosses_boundary,
    live_record,
    moved_error,
    reserve_continuation,
)
from statekeeper.sessions.portable import export_session, import_session, removed_on_failure
from statekeeper.sessions.state import ScopedState
from statekeeper.sessions.view import (
    TranscriptView,
    active_branch,
    appended_counters,
    build_view,
    check_messages,
    check_seq_arg,
    message_draft,
)
from statekeeper.stores.base import (
    DeliveryContext,
    Entry,
    ForkPoint,
    Page,
    SessionPatch,
    SessionQuery,
    SessionRecord,
    Store,
)

__all__ = ["AppendOutcome", "Session", "SessionManager"]

_RESERVED_TENANT_PREFIX = "statekeeper."
_NON_STRICT_ATTEMPTS = 64


@dataclass(frozen=True)
class AppendOutcome:
    """What `Session.append` stored, and where (``continued_from`` if it crossed a boundary)."""

    entries: list[Entry]
    session_id: str
    continued_from: str | None = None
    """The session the handle was on, when the append went to another one (it crossed
    the boundary, or the session had been continued and the handle followed)."""


class SessionManager:
    """Sessions of one tenant (user) in a store.

    ``max_messages`` / ``max_tokens`` set a session boundary (none by default): an append
    that would cross it first moves the conversation to a continuation session (when
    ``auto_continue``). With ``agent_id``, `list` and `iter` show that agent's sessions.
    """

    def __init__(
        self,
        store: Store,
        tenant: str,
        *,
        agent_id: str | None = None,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        auto_continue: bool = True,
        counter: TokenCounter | None = None,
    ) -> None:
        validate_id(tenant, "tenant")
        if tenant.startswith(_RESERVED_TENANT_PREFIX):
            raise InvalidInputError(f"tenant ids starting {_RESERVED_TENANT_PREFIX!r} are reserved")
        if agent_id is not None:
            validate_id(agent_id, "agent id")
        self.store = store
        self.tenant = tenant
        self.agent_id = agent_id
        self.max_messages = check_limit(max_messages, "max_messages")
        self.max_tokens = check_limit(max_tokens, "max_tokens")
        self.auto_continue = auto_continue
        self.counter = counter or DEFAULT_COUNTER

    async def create(
        self,
        *,
        session_id: str | None = None,
        title: str | None = None,
        agent_id: str | None = None,
        metadata: dict[str, JsonValue] | None = None,
        model_override: str | None = None,
        thinking_level: str | None = None,
        delivery: DeliveryContext | None = None,
        messages: Sequence[Message] = (),
    ) -> Session:
        """Create a session (optionally with first messages). `AlreadyExistsError` if taken."""
        check_messages(messages)
        sid = validate_id(session_id, "session id") if session_id is not None else new_id("ses")
        with typed_input("session"):
            record = SessionRecord(
                id=sid,
                tenant=self.tenant,
                agent_id=agent_id or self.agent_id,
                title=title,
                metadata=metadata or {},
                model_override=model_override,
                thinking_level=thinking_level,
                delivery=delivery,
            )
        session = Session(self, await self.store.create_session(record))
        if messages:  # created with its first messages or not at all
            async with removed_on_failure(self.store, self.tenant, record.id):
                await session.append(*messages)
        return session

    async def get(self, session_id: str) -> Session:
        """Open an existing session. `NotFoundError` if this tenant has no such session."""
        return Session(self, await self.store.get_session(self.tenant, session_id))

    async def get_or_create(self, session_id: str, **fields: Any) -> Session:
        """Open session ``session_id``, creating it (with `create`'s ``fields``) if absent.

        Safe for concurrent first callers: creation is atomic on the id, so exactly one
        creates it and every caller gets that session.
        """
        validate_id(session_id, "session id")
        try:
            return await self.get(session_id)
        except NotFoundError:
            pass
        try:
            return await self.create(session_id=session_id, **fields)
        except AlreadyExistsError:
            return await self.get(session_id)

    async def latest(self, session_id: str) -> Session:
        """The newest continuation of a conversation (following ``continued_to`` links)."""
        record = await self.store.get_session(self.tenant, session_id)
        seen = {record.id}
        while record.continued_to is not None:
            try:
                record = await self.store.get_session(self.tenant, record.continued_to)
            except NotFoundError:
                break  # a continuation that was reserved but not created yet
            if record.id in seen:
                break
            seen.add(record.id)
        return Session(self, record)

    async def list(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        offset: int = 0,
        agent_id: str | None = None,
        all_agents: bool = False,
        metadata: dict[str, JsonValue] | None = None,
        active_after: datetime | None = None,
        active_before: datetime | None = None,
    ) -> Page:
        """One page of sessions, most recently active first; pass ``next_cursor`` on.

        Only the manager's agent's sessions (when it has an ``agent_id``), unless
        ``agent_id`` names another agent or ``all_agents=True``.
        """
        query = SessionQuery(
            limit=limit,
            cursor=cursor,
            offset=offset,
            agent_id=agent_id or (None if all_agents else self.agent_id),
            metadata=metadata or {},
            active_after=active_after,
            active_before=active_before,
        )
        return await self.store.list_sessions(self.tenant, query)

    async def iter(self, *, page_size: int = 100, **filters: Any) -> AsyncIterator[SessionRecord]:
        """Every session matching the filters, page by page."""
        cursor: str | None = None
        while True:
            page = await self.list(limit=page_size, cursor=cursor, **filters)
            for record in page.items:
                yield record
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def delete(self, session_id: str) -> None:
        """Delete a session and its whole transcript. `NotFoundError` if absent."""
        await self.store.delete_session(self.tenant, session_id)

    async def delete_before(self, when: datetime) -> builtins.list[str]:
        """Delete every session last active before ``when``; returns their ids."""
        doomed = [r.id async for r in self.iter(active_before=when)]
        for session_id in doomed:
            await self.delete(session_id)
        return doomed

    async def export(self, session_id: str) -> dict[str, Any]:
        """The session (every branch, and any forked-from history) as one JSON document."""
        return await export_session(self, session_id)

    async def import_(self, document: object, *, session_id: str | None = None) -> Session:
        """Create a session from `export` output, under its own id or ``session_id``."""
        return Session(self, await import_session(self, document, session_id=session_id))

    # -- transcript reads shared by handles ------------------------------------------------

    async def load_branch(
        self, record: SessionRecord, head_seq: int | None = None
    ) -> builtins.list[Entry]:
        """The active branch of ``record`` (through forks into the sessions it came from)."""
        head = record.head_seq if head_seq is None else head_seq
        entries = await self.store.read_entries(self.tenant, record.id, until_seq=head)
        branch = active_branch(entries, head)
        if record.forked_from is not None and (
            not branch or (branch[0].parent_seq is None and not is_clear_marker(branch[0]))
        ):
            origin = await self.store.get_session(self.tenant, record.forked_from.session_id)
            branch = await self.load_branch(origin, record.forked_from.seq) + branch
        return branch


class Session(SessionBasics):
    """A handle on one conversation. See the module docstring for the append rules."""

    manager: SessionManager

    def __init__(self, manager: SessionManager, record: SessionRecord) -> None:
        self.manager = manager
        self._record = record
        self.state = ScopedState(self)

    def __repr__(self) -> str:
        return f"<Session {self.id} v{self.version} head={self._record.head_seq}>"

    @property
    def record(self) -> SessionRecord:
        """The session head as this handle last saw it."""
        return self._record

    @property
    def id(self) -> str:
        """The session id (changes when the conversation moves to a continuation)."""
        return self._record.id

    @property
    def version(self) -> int:
        """The version this handle last saw; appends compare-and-set on it by default."""
        return self._record.version

    @property
    def _store(self) -> Store:
        return self.manager.store

    @property
    def _tenant(self) -> str:
        return self.manager.tenant

    def _adopt(self, record: SessionRecord) -> None:
        self._record = record

    async def refresh(self) -> SessionRecord:
        """Re-read the head (after a `ConflictError`, or to see other writers' changes)."""
        self._adopt(await self._store.get_session(self._tenant, self.id))
        return self._record

    # -- writing ---------------------------------------------------------------------------

    async def append(self, *messages: Message, strict: bool = True) -> AppendOutcome:
        """Append messages atomically (all or none), O(1) in the transcript's length.

        Token counts are filled in with the manager's counter. A handle on a continued
        session first moves to the live one; crossing the session boundary first moves
        it to a new continuation. ``strict=False``: on `ConflictError`, re-read and retry.
        """
        if not messages:
            raise InvalidInputError("append needs at least one message")
        check_messages(messages)
        manager = self.manager
        tokens = [message_tokens(m, manager.counter) for m in messages]
        drafts = [message_draft(m, n) for m, n in zip(messages, tokens, strict=True)]
        origin = self.id
        for _ in range(_NON_STRICT_ATTEMPTS):
            if self._record.continued_to is not None:  # (the usual append awaits nothing)
                await self._follow()
            if manager.auto_continue and crosses_boundary(
                self._record, len(messages), sum(tokens), manager.max_messages, manager.max_tokens
            ):
                await check_room(manager, self._record, manager.max_messages, manager.max_tokens)
                await self.continue_session()
            patch = appended_counters(len(messages), sum(tokens))
            try:
                entries = await self._append_raw(drafts, patch, expected_version=self.version)
            except ConflictError:
                if strict:
                    raise
                await self.refresh()
                continue
            return AppendOutcome(entries, self.id, origin if self.id != origin else None)
        raise ConflictError(
            f"session {self.id!r} kept changing under other writers for "
            f"{_NON_STRICT_ATTEMPTS} attempts; nothing was written: retry"
        )

    async def update(self, **fields: Any) -> SessionRecord:
        """Set head fields (title, metadata, model_override, thinking_level, delivery ...)."""
        if "delivery" in fields and isinstance(fields["delivery"], DeliveryContext):
            fields["delivery"] = fields["delivery"].model_dump(mode="json")
        patch = SessionPatch(set=fields)
        await self._follow()
        return await self._update_head(patch)

    async def delete(self) -> None:
        """Delete this session and its transcript."""
        await self.manager.delete(self.id)

    # -- reading ---------------------------------------------------------------------------

    async def entries(
        self, *, after_seq: int = 0, until_seq: int | None = None, limit: int | None = None
    ) -> list[Entry]:
        """Raw stored entries of this session, every branch, in seq order."""
        return await self._store.read_entries(
            self._tenant, self.id, after_seq=after_seq, until_seq=until_seq, limit=limit
        )

    async def branch(self) -> list[Entry]:
        """The active branch, root first (including the history it was forked from).

        Reads the current head first, so other writers' appends are included.
        """
        return await self.manager.load_branch(await self.refresh())

    async def view(self) -> TranscriptView:
        """The active view: messages with compactions applied, plus corrupt-entry reports."""
        return build_view(await self.branch())

    async def messages(self) -> list[Message]:
        """The messages of the active view."""
        return (await self.view()).messages

    async def context_window(self, budget: int, *, reserve: int = 0) -> ContextWindow:
        """Messages for the next model call, packed by category under a token budget."""
        view = await self.view()
        return build_context_window(
            view.messages, budget, counter=self.manager.counter, reserve=reserve
        )

    # -- branches, forks, compaction, continuation ---------------------------------------

    async def _resolve(self, at: int | str | None) -> int:
        if at is None:
            return self._record.head_seq
        if isinstance(at, str):
            return (await self._store.get_entry(self._tenant, self.id, at)).seq
        check_seq_arg(at)
        if not 0 <= at <= self._record.last_seq:
            raise InvalidInputError(
                f"no entry {at} in session {self.id!r} (entries 1..{self._record.last_seq})"
            )
        return at

    async def checkout(self, at: int | str) -> SessionRecord:
        """Make the branch ending at entry ``at`` (seq or id) active; new appends fork there.

        ``at`` names an entry of this session: on a continued session it raises
        `ConflictError` naming the live one (check out there, or `fork` this one).
        """
        if self._record.continued_to is not None:
            live = await live_record(self.manager, self._record)
            raise moved_error(
                self._record,
                live,
                f"check out an entry of {live.id!r} (sessions.latest({self.id!r})), or "
                f"fork {self.id!r} at that entry to branch from its history",
            )
        seq = await self._resolve(at)
        view = build_view(await self.manager.load_branch(self._record, seq))
        patch = SessionPatch(set={"head_seq": seq, "fresh_tokens": view.tokens})
        return await self._update_head(patch)

    async def fork(
        self,
        at: int | str | None = None,
        *,
        session_id: str | None = None,
        title: str | None = None,
    ) -> Session:
        """A new session whose history is this one's up to entry ``at`` (default: the head).

        Nothing is copied: the new session reads the shared history from this one.
        """
        seq = await self._resolve(at)
        view = build_view(await self.manager.load_branch(self._record, seq))
        source = self._record
        record = SessionRecord(
            id=validate_id(session_id, "session id") if session_id is not None else new_id("ses"),
            tenant=self._tenant,
            agent_id=source.agent_id,
            title=title if title is not None else source.title,
            metadata=dict(source.metadata),
            model_override=source.model_override,
            thinking_level=source.thinking_level,
            delivery=source.delivery,
            forked_from=ForkPoint(session_id=source.id, seq=seq),
            state=dict(source.state),
            total_tokens=view.tokens,
            fresh_tokens=view.tokens,
            message_count=len(view.messages),
        )
        return Session(self.manager, await self._store.create_session(record))

    async def compact(self, summarize: Summarizer, *, keep_last: int = 4) -> CompactionResult:
        """Summarise older messages into one summary entry (see `compact_session`)."""
        return await compact_session(self, summarize, keep_last=keep_last)

    def needs_continuation(self, *, extra: Sequence[Message] = ()) -> bool:
        """Whether appending ``extra`` would cross the manager's session boundary."""
        manager = self.manager
        tokens = sum(message_tokens(m, manager.counter) for m in extra)
        return crosses_boundary(
            self._record, len(extra), tokens, manager.max_messages, manager.max_tokens
        )

    async def continue_session(self) -> Session:
        """Move this conversation to a new, linked continuation session and return self.

        The new session starts with this one's SYSTEM and CONTEXT messages (including
        compaction summaries) and a transition marker. Crash-safe: the link is reserved
        on this session first, so a retry finishes the same continuation. On a session
        that was continued already, the handle moves to the live one (nothing new).
        """
        old = await reserve_continuation(self.manager, await self.refresh())
        self._adopt(await live_record(self.manager, old))
        self._moved()
        return self

    def _moved(self) -> None:
        """The handle moved to another session of its chain: temp state stays behind."""
        self.state.reset_temp()
