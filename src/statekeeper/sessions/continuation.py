"""Continuation sessions: where a conversation goes on once it crossed its boundary.

The new session starts with the old one's SYSTEM and CONTEXT messages (compaction
summaries included) and a marker naming the old session; ``continued_from`` links it
back. `Session.continue_session` reserves the link first, so a retry after a crash
finishes the same continuation.

A chain A -> B -> C has one *live* session, the one not continued (C). Every write
through a handle goes there: the handle first follows the links (`live_record`,
finishing a link a crash left reserved), and the write compare-and-sets on the head it
found, so a continuation committed in between makes it fail instead of landing in a
continued session (`moved_error` says where the conversation went).
"""

from __future__ import annotations

from collections.abc import Sequence

from statekeeper.core.messages import Message, MessageCategory, Role
from statekeeper.core.tokens import counted
from statekeeper.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    StoreCorruptError,
)
from statekeeper.ids import new_id
from statekeeper.sessions.handle import SessionOwner
from statekeeper.sessions.view import build_view, message_draft
from statekeeper.stores.base import SessionPatch, SessionRecord

__all__ = [
    "CARRIED_KEY",
    "MARKER_KEY",
    "check_limit",
    "check_room",
    "create_continuation",
    "crosses_boundary",
    "live_record",
    "moved_error",
    "reserve_continuation",
]

MARKER_KEY = "statekeeper.marker"
"""Metadata key of the transition marker a continuation starts with."""
CARRIED_KEY = "statekeeper.carried"
"""Session metadata key: how many messages a continuation started with."""


async def create_continuation(
    owner: SessionOwner, old: SessionRecord, target: str
) -> SessionRecord:
    """Create session ``target`` continuing ``old`` (or return it if it exists already)."""
    current = await owner.store.get_session(owner.tenant, old.id)
    carried = _carried(build_view(await owner.load_branch(current)).messages, old.id, owner)
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


def _carried(messages: Sequence[Message], old_id: str, owner: SessionOwner) -> list[Message]:
    """What a continuation of session ``old_id`` starts with: its SYSTEM and CONTEXT
    messages (new ids) and a transition marker."""
    carried = [
        m.with_changes(id=new_id("msg"))
        for m in messages
        if m.category in (MessageCategory.SYSTEM, MessageCategory.CONTEXT)
        and m.metadata.get(MARKER_KEY) != "continuation"
    ]
    marker = Message(
        role=Role.SYSTEM,
        category=MessageCategory.CONTEXT,
        content=f"[This conversation continues from session {old_id}.]",
        metadata={MARKER_KEY: "continuation", "continued_from": old_id},
    )
    carried.append(counted(marker, owner.counter))
    return carried


def check_limit(value: object, name: str) -> int | None:
    """A session boundary (``max_messages`` / ``max_tokens``): None or a positive int."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise InvalidInputError(
        f"{name} must be a positive integer, or None for no session boundary (got {value!r})"
    )


def crosses_boundary(
    record: SessionRecord,
    extra_messages: int,
    extra_tokens: int,
    max_messages: int | None,
    max_tokens: int | None,
) -> bool:
    """Whether appending ``extra_messages`` holding ``extra_tokens`` to ``record`` would
    cross the session boundary."""
    if max_messages is None and max_tokens is None:
        return False
    carried = record.metadata.get(CARRIED_KEY, 0)
    if isinstance(carried, int) and record.message_count <= carried:
        return False  # a fresh continuation: moving on again would not shrink anything
    if max_messages is not None and record.message_count + extra_messages > max_messages:
        return True
    return max_tokens is not None and record.fresh_tokens + extra_tokens > max_tokens


async def check_room(
    owner: SessionOwner, old: SessionRecord, max_messages: int | None, max_tokens: int | None
) -> None:
    """Refuse a boundary a continuation of ``old`` would already fill more than half of:
    it would make a chain of near-empty sessions. Reads only; writes nothing."""
    if old.continued_to is not None:
        return  # reserved already: finish it
    carried = _carried(build_view(await owner.load_branch(old)).messages, old.id, owner)
    tokens = sum(m.tokens or 0 for m in carried)
    for name, limit, used, unit in (
        ("max_messages", max_messages, len(carried), "messages"),
        ("max_tokens", max_tokens, tokens, "tokens"),
    ):
        if limit is not None and used * 2 > limit:
            raise InvalidInputError(
                f"{name}={limit} is too small: a continuation of session {old.id!r} would "
                f"start with {used} {unit} (its SYSTEM and CONTEXT messages and a marker), "
                f"more than half the budget; set {name} to at least {used * 2}, compact the "
                f"session, or set {name}=None for no session boundary"
            )


async def reserve_continuation(owner: SessionOwner, old: SessionRecord) -> SessionRecord:
    """Reserve the id of ``old``'s continuation on ``old`` (compare-and-set), unless a
    crashed earlier attempt already did; returns ``old`` with ``continued_to`` set."""
    if old.continued_to is not None:
        return old
    try:
        return await owner.store.update_session(
            owner.tenant,
            old.id,
            SessionPatch(set={"continued_to": new_id("ses")}),
            expected_version=old.version,
        )
    except ConflictError:
        current = await owner.store.get_session(owner.tenant, old.id)
        if current.continued_to is None:
            raise
        return current


async def live_record(owner: SessionOwner, record: SessionRecord) -> SessionRecord:
    """The live session of ``record``'s chain: ``record`` itself unless it was continued,
    else the end of its ``continued_to`` links (a link reserved but not created yet, as a
    crash leaves it, is finished first). `StoreCorruptError` if the links form a loop."""
    seen = {record.id}
    while record.continued_to is not None:
        target = record.continued_to
        if target in seen:
            raise StoreCorruptError(
                f"the continuation links of session {record.id!r} lead back to {target!r}: "
                "the stored heads are damaged; repair or delete them"
            )
        try:
            record = await owner.store.get_session(owner.tenant, target)
        except NotFoundError:
            record = await create_continuation(owner, record, target)
        seen.add(record.id)
    return record


def moved_error(record: SessionRecord, live: SessionRecord, fix: str) -> ConflictError:
    """The error for a write planned on session ``record``, which was continued: its
    conversation goes on in ``live``; ``fix`` says what to do."""
    return ConflictError(
        f"session {record.id!r} was continued (its conversation goes on in session "
        f"{live.id!r}); nothing was written: {fix}"
    )
