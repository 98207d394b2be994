"""`EngineWrites`: the session writes of a `statekeeper.stores.base.Store`, done by the
append engine (a backend mixes it in and sets ``self._engine``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from statekeeper.errors import InvalidInputError
from statekeeper.stores.base import (
    AppendResult,
    Entry,
    EntryDraft,
    EventBatch,
    SessionPatch,
    SessionRecord,
)
from statekeeper.stores.engine import AppendEngine
from statekeeper.stores.engine_types import Planned
from statekeeper.stores.rules import check_session_record, check_tenant_and_id, check_version

__all__ = ["EngineWrites"]


class EngineWrites:
    """Mixin for backends: `append_entries` and `update_session` through ``self._engine``."""

    _engine: AppendEngine

    async def append_entries(
        self,
        tenant: str,
        session_id: str,
        drafts: Sequence[EntryDraft],
        *,
        expected_version: int | None = None,
        patch: SessionPatch | None = None,
        move_head: bool = True,
        events: EventBatch | None = None,
    ) -> AppendResult:
        """See `statekeeper.stores.base.TranscriptStore.append_entries`."""
        check_tenant_and_id(tenant, session_id)
        return await self._engine.append(
            tenant,
            session_id,
            drafts,
            expected_version=expected_version,
            patch=patch,
            move_head=move_head,
            events=events,
        )

    async def update_session(
        self,
        tenant: str,
        session_id: str,
        patch: SessionPatch,
        *,
        expected_version: int | None = None,
    ) -> SessionRecord:
        """See `statekeeper.stores.base.SessionStore.update_session`."""
        check_tenant_and_id(tenant, session_id)
        return await self._engine.update(
            tenant, session_id, patch, expected_version=expected_version
        )

    async def rewrite_session_fields(
        self, tenant: str, session_id: str, fields: dict[str, Any], *, expected_version: int
    ) -> SessionRecord:
        """Store a head's title, metadata, delivery or state in another form meaning the
        same (re-encrypted: `statekeeper.stores.sealed.reseal`), with compare-and-set;
        ``last_active`` is kept, so listings keep their order."""
        check_tenant_and_id(tenant, session_id)
        if not set(fields) <= _REWRITABLE:
            raise InvalidInputError(f"only {sorted(_REWRITABLE)} can be rewritten in place")
        limit = self._engine.max_payload_bytes

        def plan(record: SessionRecord, existing: dict[str, Entry]) -> Planned:
            check_version(record, expected_version)
            updated = record.model_copy(update={**fields, "version": record.version + 1})
            return Planned(check_session_record(updated, limit), result=updated)

        return await self._engine.submit(tenant, session_id, plan, ())  # type: ignore[no-any-return]


_REWRITABLE = frozenset({"title", "metadata", "delivery", "state"})
