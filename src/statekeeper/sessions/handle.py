"""What the session helpers (compaction, scoped state, export, continuation) need of a
session and its manager, as two small protocols.

`SessionManager` and `Session` (in ``manager.py``) satisfy them. The helpers depend on
these protocols instead of on ``manager.py``, so imports point one way: ``manager``
uses the helpers, the helpers use this module.
"""

from __future__ import annotations

from typing import Protocol

from statekeeper.core.tokens import TokenCounter
from statekeeper.sessions.view import TranscriptView
from statekeeper.stores.base import Entry, EntryDraft, SessionPatch, SessionRecord, Store

__all__ = ["SessionHandle", "SessionOwner"]


class SessionOwner(Protocol):
    """The sessions of one tenant in a store (what `SessionManager` offers the helpers)."""

    @property
    def store(self) -> Store:
        """The store the sessions live in."""
        ...

    @property
    def tenant(self) -> str:
        """The tenant every read and write is scoped to."""
        ...

    @property
    def counter(self) -> TokenCounter:
        """Counts the tokens of new messages."""
        ...

    async def load_branch(self, record: SessionRecord, head_seq: int | None = None) -> list[Entry]:
        """The active branch of ``record`` up to ``head_seq`` (through forks)."""
        ...


class SessionHandle(Protocol):
    """A handle on one conversation (what `Session` offers the helpers)."""

    @property
    def manager(self) -> SessionOwner:
        """The sessions this one belongs to."""
        ...

    @property
    def id(self) -> str:
        """The session id."""
        ...

    @property
    def version(self) -> int:
        """The head version this handle last saw."""
        ...

    @property
    def record(self) -> SessionRecord:
        """The head as this handle last saw it."""
        ...

    async def refresh(self) -> SessionRecord:
        """Re-read the head."""
        ...

    async def view(self) -> TranscriptView:
        """The active view (compactions applied)."""
        ...

    async def _follow(self) -> None:
        """Move to the live session of the chain, if the head last seen was continued
        (sessions-internal: every write does it first)."""
        ...

    async def _append_raw(
        self, drafts: list[EntryDraft], patch: SessionPatch, *, expected_version: int
    ) -> list[Entry]:
        """Append entry drafts and a head patch in one transaction, with compare-and-set
        on ``expected_version``, never to a continued session (sessions-internal)."""
        ...
