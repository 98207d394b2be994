"""Compaction: one summary entry stands for older messages in the active view.

Atomic by construction: the summariser runs first, and the only write is a single
append (the compaction entry plus the head update, in one transaction). If the
summariser fails, nothing is written. Originals are never deleted. Entries appended
while the summariser ran come after the compaction's range and stay in the view.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from statekeeper.core.messages import Message, MessageCategory, Role
from statekeeper.core.tokens import counted
from statekeeper.errors import ConflictError, InvalidPayloadError
from statekeeper.sessions.continuation import live_record, moved_error
from statekeeper.sessions.handle import SessionHandle
from statekeeper.sessions.view import (
    SUMMARY_KEY,
    TranscriptView,
    covered_id,
    covered_seq,
    is_replaceable,
)
from statekeeper.stores.base import Entry, EntryDraft, EntryKind, SessionPatch

__all__ = ["CompactionResult", "Summarizer", "compact_session"]

Summarizer = Callable[[list[Message]], Awaitable[str | Message]]
"""Turns the messages to compact into a summary (in real use, an LLM call)."""

_MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did. ``entry`` is None when there was nothing to compact."""

    entry: Entry | None
    summary: Message | None
    replaced: int
    tokens_before: int
    tokens_after: int

    @property
    def tokens_freed(self) -> int:
        """Tokens the active view lost by the compaction."""
        return self.tokens_before - self.tokens_after


def _choose(view: TranscriptView, keep_last: int) -> list[int]:
    """Indices of view messages to summarise: replaceable ones except the newest few.

    The cut never separates a tool call from its results: if a kept result answers a
    call that would be summarised, the call (and everything after it) is kept too.
    """
    replaceable = [i for i, m in enumerate(view.messages) if is_replaceable(m)]
    chosen = replaceable[: max(len(replaceable) - keep_last, 0)]
    if not chosen:
        return []
    kept_results = {
        r.tool_call_id
        for i, m in enumerate(view.messages)
        if i > chosen[-1]
        for r in m.tool_results
    }
    for position, index in enumerate(chosen):
        if any(call.id in kept_results for call in view.messages[index].tool_calls):
            return chosen[:position]
    return chosen


async def compact_session(
    session: SessionHandle, summarize: Summarizer, *, keep_last: int = 4
) -> CompactionResult:
    """Summarise all but the newest ``keep_last`` replaceable messages of the active view.

    SYSTEM and CONTEXT messages are never summarised away; earlier summaries are.
    Records the compaction count and the tokens freed on the session.
    """
    if keep_last < 0:
        raise InvalidPayloadError("keep_last must be >= 0")
    await session.refresh()
    await session._follow()  # a continued session is compacted in its live one
    view = await session.view()
    chosen = _choose(view, keep_last)
    before = view.tokens
    if not chosen:
        return CompactionResult(None, None, 0, before, before)
    originals = [view.messages[i] for i in chosen]
    last = view.messages[chosen[-1]]
    # The seq and the id: in a fork's branch one seq can name an origin's entry and
    # one of the fork's own; the id tells them apart.
    through_seq, through_id = covered_seq(view.seqs[chosen[-1]], last), covered_id(last)

    produced = await summarize(originals)
    if isinstance(produced, str):
        produced = Message(role=Role.USER, content=produced)
    summary = produced.with_changes(
        category=MessageCategory.CONTEXT,
        metadata={
            **produced.metadata,
            SUMMARY_KEY: True,
            "through_seq": through_seq,
            "through_id": through_id,
        },
        tokens=None,
    )
    summary = counted(summary, session.manager.counter)
    replaced_tokens = sum(m.tokens or 0 for m in originals)

    for _ in range(_MAX_ATTEMPTS):
        if view.branch and through_seq not in {e.seq for e in view.branch}:
            raise ConflictError(
                f"session {session.id!r} switched branches while compacting; compact again"
            )
        after = view.tokens - replaced_tokens + (summary.tokens or 0)
        draft = EntryDraft(
            kind=EntryKind.COMPACTION,
            payload={
                "summary": summary.to_dict(),
                "through_seq": through_seq,
                "through_id": through_id,
                "replaced": len(originals),
                "tokens_before": view.tokens,
                "tokens_after": after,
            },
        )
        patch = SessionPatch(set={"fresh_tokens": after}, add={"compaction_count": 1})
        try:
            entries = await session._append_raw([draft], patch, expected_version=session.version)
        except ConflictError:
            # Someone appended while the summariser ran: keep their entries and retry on
            # top of them with the same summary.
            record = await session.refresh()
            if record.continued_to is not None:
                live = await live_record(session.manager, record)
                raise moved_error(
                    record, live, f"compact again, and the handle compacts {live.id!r}"
                ) from None
            view = await session.view()
            continue
        return CompactionResult(entries[0], summary, len(originals), before, after)
    raise ConflictError(
        f"session {session.id!r} kept changing while compacting; retry when it is quieter"
    )
