"""Continuation sessions: where a conversation goes on once it crossed its boundary.

The new session starts with the old one's SYSTEM and CONTEXT messages (compaction
summaries included) and a marker naming the old session; ``continued_from`` links it
back. `Session.continue_session` reserves the link first, so a retry after a crash
finishes the same continuation.
"""

from __future__ import annotations

from statekeeper.core.messages import Message, MessageCategory, Role
from statekeeper.core.tokens import counted
from statekeeper.errors import AlreadyExistsError
from statekeeper.ids import new_id
from statekeeper.sessions.handle import SessionOwner
from statekeeper.sessions.view import build_view, message_draft
from statekeeper.stores.base import SessionPatch, SessionRecord

__all__ = ["CARRIED_KEY", "MARKER_KEY", "create_continuation"]

MARKER_KEY = "statekeeper.marker"
"""Metadata key of the transition marker a continuation starts with."""
CARRIED_KEY = "statekeeper.carried"
"""Session metadata key: how many messages a continuation started with."""


async def create_continuation(
    owner: SessionOwner, old: SessionRecord, target: str
) -> SessionRecord:
    """Create session ``target`` continuing ``old`` (or return it if it exists already)."""
    current = await owner.store.get_session(owner.tenant, old.id)
    view = build_view(await owner.load_branch(current))
    carried = [
        m.with_changes(id=new_id("msg"))
        for m in view.messages
        if m.category in (MessageCategory.SYSTEM, MessageCategory.CONTEXT)
        and m.metadata.get(MARKER_KEY) != "continuation"
    ]
    marker = Message(
        role=Role.SYSTEM,
        category=MessageCategory.CONTEXT,
        content=f"[This conversation continues from session {old.id}.]",
        metadata={MARKER_KEY: "continuation", "continued_from": old.id},
    )
    carried.append(counted(marker, owner.counter))
    record = SessionRecord(
        id=target,
        tenant=owner.tenant,
        agent_id=old.agent_id,
        title=old.title,
        metadata={**old.metadata, CARRIED_KEY: len(carried)},
        model_override=old.model_override,
        thinking_level=old.thinking_level,
        delivery=old.delivery,
        continued_from=old.id,
        continuation_index=old.continuation_index + 1,
        state=dict(old.state),
        total_tokens=old.total_tokens,
    )
    try:
        created = await owner.store.create_session(record)
    except AlreadyExistsError:
        return await owner.store.get_session(owner.tenant, target)
    tokens = sum(m.tokens or 0 for m in carried)
    result = await owner.store.append_entries(
        owner.tenant,
        target,
        [message_draft(m) for m in carried],
        expected_version=created.version,
        patch=SessionPatch(add={"fresh_tokens": tokens, "message_count": len(carried)}),
    )
    return result.session
