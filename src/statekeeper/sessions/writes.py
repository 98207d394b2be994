"""`HeadWrites`: the two ways a `Session` handle writes (an append, a head patch), kept
out of continued sessions.

Every write compare-and-sets on the version the handle saw. Reserving a continuation
bumps the old session's version, so a write planned on a head without the link fails
instead of landing in a session that was continued; a handle that already knows of the
link moves to the live session first (`HeadWrites._follow`), and a write that would go
to a continued session anyway raises `ConflictError` naming the live one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from statekeeper.errors import ConflictError, NotFoundError
from statekeeper.sessions.continuation import live_record, moved_error
from statekeeper.sessions.handle import SessionOwner
from statekeeper.stores.base import Entry, EntryDraft, SessionPatch, SessionRecord

__all__ = ["HeadWrites"]


class HeadWrites:
    """Guarded appends and head patches of `Session` (which supplies what is declared)."""

    _record: SessionRecord
    manager: SessionOwner

    if TYPE_CHECKING:

        @property
        def id(self) -> str: ...
        @property
        def version(self) -> int: ...
        def _adopt(self, record: SessionRecord) -> None: ...
        def _moved(self) -> None: ...

    async def _follow(self) -> None:
        """Move this handle to its chain's live session if the head it saw was continued
        (finishing a link a crash left reserved)."""
        if self._record.continued_to is not None:
            self._adopt(await live_record(self.manager, self._record))
            self._moved()

    async def _refused(self, exc: ConflictError) -> ConflictError:
        """``exc``, or the error naming the live session if this one was continued."""
        owner = self.manager
        try:
            current = await owner.store.get_session(owner.tenant, self.id)
        except NotFoundError:
            return exc
        if current.continued_to is None:
            return exc
        live = await live_record(owner, current)
        return moved_error(current, live, f"refresh() and retry: the write goes to {live.id!r}")

    async def _append_raw(
        self, drafts: list[EntryDraft], patch: SessionPatch, *, expected_version: int
    ) -> list[Entry]:
        """Append entry drafts and a head patch in one transaction, with compare-and-set
        on ``expected_version``; never to a continued session."""
        if self._record.continued_to is not None:
            raise await self._refused(ConflictError(f"session {self.id!r} was continued"))
        owner = self.manager
        try:
            result = await owner.store.append_entries(
                owner.tenant, self.id, drafts, expected_version=expected_version, patch=patch
            )
        except ConflictError as exc:
            raise await self._refused(exc) from None
        if not result.replayed:
            self._adopt(result.session)
        return result.entries

    async def _update_head(self, patch: SessionPatch) -> SessionRecord:
        """Apply ``patch`` with compare-and-set on this handle's version; never to a
        continued session."""
        if self._record.continued_to is not None:
            raise await self._refused(ConflictError(f"session {self.id!r} was continued"))
        owner = self.manager
        try:
            record = await owner.store.update_session(
                owner.tenant, self.id, patch, expected_version=self.version
            )
        except ConflictError as exc:
            raise await self._refused(exc) from None
        self._adopt(record)
        return record
