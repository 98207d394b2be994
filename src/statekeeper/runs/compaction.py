"""Compaction inside runs: published on the ``compaction`` stream, and automatic past a
token threshold (opt-in: ``Runner(compaction=AutoCompaction(summarize, threshold_tokens=...))``).

Before each step, a runner with `AutoCompaction` counts the tokens of the conversation
the agent is about to see; past ``threshold_tokens`` it compacts the run's session
through the user's summariser (`statekeeper.sessions.compaction`: atomic, originals
kept) and the agent sees the compacted view from that step on. Each compaction, automatic
or by `Runner.compact`, publishes ``compaction/start`` then ``compaction/complete``
(with ``replaced``, ``tokens_before``, ``tokens_after``, ``tokens_freed``, ``seq``, or
``error`` when the summariser or the write failed). A failed automatic compaction
changes nothing and the run goes on (the next step tries again); `Runner.compact`
raises the error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from statekeeper.core.messages import Message
from statekeeper.core.tokens import TokenCounter, message_tokens
from statekeeper.errors import InvalidInputError
from statekeeper.runs.lifecycle import RunLifecycle
from statekeeper.runs.state import RunState
from statekeeper.sessions import CompactionResult, Session, Summarizer

__all__ = ["AutoCompaction", "compact_published", "conversation_tokens"]


@dataclass(frozen=True)
class AutoCompaction:
    """Compact a run's session before a step when its conversation is past
    ``threshold_tokens``, keeping the newest ``keep_last`` messages as they are."""

    summarize: Summarizer
    threshold_tokens: int
    keep_last: int = 4

    def __post_init__(self) -> None:
        if not callable(self.summarize):
            raise InvalidInputError(
                "AutoCompaction needs summarize: an async function of the messages to "
                "compact returning the summary (text or a Message)"
            )
        if isinstance(self.threshold_tokens, bool) or not (
            isinstance(self.threshold_tokens, int) and self.threshold_tokens >= 1
        ):
            raise InvalidInputError(
                f"threshold_tokens must be an int >= 1 (the conversation's tokens past "
                f"which a run compacts), got {self.threshold_tokens!r}"
            )
        if isinstance(self.keep_last, bool) or not (
            isinstance(self.keep_last, int) and self.keep_last >= 0
        ):
            raise InvalidInputError(f"keep_last must be an int >= 0, got {self.keep_last!r}")

    def due(self, messages: Sequence[Message], counter: TokenCounter) -> bool:
        """Whether a conversation of ``messages`` is past the threshold."""
        return conversation_tokens(messages, counter) > self.threshold_tokens

    async def apply(
        self,
        session: Session,
        lifecycle: RunLifecycle,
        state: RunState,
        *,
        own: set[int],
        seen_seq: int,
    ) -> list[Message] | None:
        """Compact ``session`` for the run ``state``; the conversation the agent sees
        now, or None when nothing changed (nothing to compact, or it failed: published).

        ``own``: seqs the run wrote (the compaction's entry is added); ``seen_seq``: the
        session's seq when the run last looked. Messages others appended since are left
        out: the run takes them as new input at its next look, not through the view.
        """
        try:
            result = await compact_published(
                session,
                self.summarize,
                keep_last=self.keep_last,
                lifecycle=lifecycle,
                state=state,
                trigger="auto",
            )
        except Exception:  # published; the run goes on uncompacted
            return None
        if result.entry is None:
            return None
        own.add(result.entry.seq)
        view = await session.view()
        pairs = zip(view.seqs, view.messages, strict=True)
        return [m for seq, m in pairs if seq <= seen_seq or seq in own]


def conversation_tokens(messages: Sequence[Message], counter: TokenCounter) -> int:
    """The tokens of ``messages`` (measured counts, else ``counter``'s)."""
    return sum(message_tokens(m, counter) for m in messages)


async def compact_published(
    session: Session,
    summarize: Summarizer,
    *,
    keep_last: int,
    lifecycle: RunLifecycle,
    state: RunState,
    trigger: str,
) -> CompactionResult:
    """Compact ``session`` and publish ``compaction/start`` and ``compaction/complete``
    as events of the run ``state``; a failure is published, then raised."""
    about: dict[str, Any] = {"session_id": session.id, "trigger": trigger}
    tokens = (await session.refresh()).fresh_tokens
    await lifecycle.publish(state, "compaction", "start", {**about, "tokens": tokens})
    try:
        result = await session.compact(summarize, keep_last=keep_last)
    except Exception as exc:
        failed = {**about, "replaced": 0, "error": f"{type(exc).__name__}: {exc}"[:500]}
        await lifecycle.publish(state, "compaction", "complete", failed)
        raise
    done = {
        **about,
        "replaced": result.replaced,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "tokens_freed": result.tokens_freed,
        "seq": result.entry.seq if result.entry is not None else None,
    }
    await lifecycle.publish(state, "compaction", "complete", done)
    return result
