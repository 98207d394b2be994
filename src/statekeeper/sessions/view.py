"""Pure transcript logic: the active branch of the entry DAG and the view a model sees.

The active branch is the path from the session's head to the root, following
``parent_seq``. The view is that branch turned into messages, with each compaction
applied: a compaction's summary stands in for the older messages it covers (the
originals stay stored and readable), and entries appended while the summariser ran,
being after the compaction's range, stay in the view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from statekeeper.core.messages import Message, MessageCategory, default_category, stored_message
from statekeeper.core.typed import trusted
from statekeeper.errors import InvalidInputError, InvalidPayloadError, StoreCorruptError
from statekeeper.jsoncodec import gc_paused
from statekeeper.stores.base import Entry, EntryDraft, EntryKind, SessionPatch

__all__ = [
    "SUMMARY_KEY",
    "TranscriptView",
    "active_branch",
    "appended_counters",
    "build_view",
    "check_messages",
    "check_seq_arg",
    "covered_id",
    "covered_seq",
    "is_replaceable",
    "message_draft",
    "message_of",
]

SUMMARY_KEY = "statekeeper.summary"
"""Metadata key marking a compaction summary message."""


@dataclass(frozen=True)
class TranscriptView:
    """The active view of a session.

    ``messages`` is what the next model call builds on (compactions applied); ``seqs``
    gives the entry seq each message came from (a summary has its compaction's seq);
    ``corrupt`` lists entries that could not be decoded: reported, never silently skipped.
    """

    messages: list[Message]
    seqs: list[int]
    branch: list[Entry]
    corrupt: list[Entry] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Sum of the messages' stored token counts."""
        return sum(m.tokens or 0 for m in self.messages)


def check_messages(messages: Sequence[object]) -> None:
    """Raise `InvalidInputError` unless every item is a `Message`."""
    for item in messages:
        if not isinstance(item, Message):
            raise InvalidInputError(
                f"append takes Message objects, not {type(item).__name__} ({item!r:.60}); "
                "build one with Message.user(text), Message.assistant(text) or "
                "Message.from_dict(data)"
            )


def check_seq_arg(at: object) -> None:
    """Raise `InvalidInputError` unless ``at`` is an entry's seq number (an int)."""
    if not isinstance(at, int) or isinstance(at, bool):
        raise InvalidInputError(
            f"at must be an entry's seq number (int) or an entry id (str), got {at!r}; "
            "session.entries() lists both"
        )


def message_draft(message: Message, tokens: int | None = None) -> EntryDraft:
    """The transcript entry that stores ``message`` (with ``tokens``, if given, as its
    token count).

    The entry's own id and timestamp are the message's, so the payload leaves them out
    (they would be stored twice: about 15% of a typical message's bytes), and so it does
    fields at their defaults, and a category that is the role's default.
    """
    if tokens is None:
        tokens = message.tokens
    content = message.content
    if type(content) is str and message.name is None and not message.metadata:
        # The usual message, built directly: the same payload as the general way below,
        # in the same key order, at a fraction of the cost (this runs on every append).
        # str(): the role's value as a plain str, in C (``.value`` is a Python property).
        payload: dict[str, Any] = {"role": str(message.role), "content": content}
        if message.category != default_category(message.role):
            payload["category"] = int(message.category)
        if tokens is not None:
            payload["tokens"] = tokens
        if message.created_at.tzinfo is not None:  # else EntryDraft refuses it, typed
            return trusted(EntryDraft, _draft_fields(message.id, payload, message.created_at))
        return EntryDraft(id=message.id, payload=payload, created_at=message.created_at)
    payload = message.model_dump(mode="json", exclude={"id", "created_at"})
    payload["tokens"] = tokens
    # Only top-level defaults: nested ones (a block's "type") are needed to read it back.
    for key in ("name", "tokens"):
        if payload[key] is None:
            del payload[key]
    if not payload["metadata"]:
        del payload["metadata"]
    if payload["category"] == default_category(message.role):
        del payload["category"]  # reading derives it from the role again
    return EntryDraft(id=message.id, payload=payload, created_at=message.created_at)


def _draft_fields(entry_id: str, payload: dict[str, Any], created_at: Any) -> dict[str, Any]:
    return {
        "id": entry_id,
        "kind": EntryKind.MESSAGE,
        "payload": payload,
        "parent": "head",
        "side": False,
        "created_at": created_at,
    }


def appended_counters(messages: int, tokens: int) -> SessionPatch:
    """The head counters appending ``messages`` messages holding ``tokens`` tokens adds."""
    add = {"total_tokens": tokens, "fresh_tokens": tokens, "message_count": messages}
    return trusted(SessionPatch, {"set": {}, "add": add})


def message_of(entry: Entry) -> Message:
    """The message a ``message`` entry stores."""
    return stored_message(entry.payload, entry.id, entry.created_at)


def active_branch(entries: Sequence[Entry], head_seq: int) -> list[Entry]:
    """The entries from the root to ``head_seq``, given every entry with seq <= head.

    ``entries`` must be in seq order (as ``read_entries`` returns them).
    """
    if head_seq == 0:
        return []
    contiguous = bool(entries) and entries[0].seq == 1 and entries[-1].seq == len(entries)
    by_seq: dict[int, Entry] | None = None if contiguous else {e.seq: e for e in entries}
    path: list[Entry] = []
    seq: int | None = head_seq
    while seq is not None:
        if by_seq is None:
            entry = entries[seq - 1] if seq <= len(entries) else None
        else:
            entry = by_seq.get(seq)
        if entry is None:
            raise StoreCorruptError(f"entry {seq} of the active branch is missing")
        path.append(entry)
        if entry.parent_seq is not None and entry.parent_seq >= seq:
            raise StoreCorruptError(f"entry {seq} points forward to parent {entry.parent_seq}")
        seq = entry.parent_seq
    path.reverse()
    return path


def is_replaceable(message: Message) -> bool:
    """Whether a compaction may summarise this message away.

    SYSTEM and CONTEXT messages stay; earlier summaries are summarised again.
    """
    if message.category is MessageCategory.SYSTEM:
        return False
    if message.category is MessageCategory.CONTEXT:
        return bool(message.metadata.get(SUMMARY_KEY))
    return True


def build_view(branch: Sequence[Entry]) -> TranscriptView:
    """Turn a branch into the message view, applying compactions in order."""
    items = _Items()
    corrupt: list[Entry] = []
    with gc_paused():
        _fill(branch, items, corrupt)
    return TranscriptView(
        messages=items.messages, seqs=items.seqs, branch=list(branch), corrupt=corrupt
    )


class _Items:
    """The view as it is built, as parallel lists (no tuple per message): each message,
    its seq, and its ``cover``: the branch index a later compaction's range is judged
    by (a message's own, a summary's the end of the range it stands for)."""

    def __init__(self) -> None:
        self.covers: list[int] = []
        self.seqs: list[int] = []
        self.messages: list[Message] = []

    def compact(self, through: int, seq: int, summary: Message) -> None:
        """Put ``summary`` in place of the replaceable items covered through ``through``
        (where the first of them was; at the end if there is none)."""
        covers: list[int] = []
        seqs: list[int] = []
        messages: list[Message] = []
        placed = False
        for item in zip(self.covers, self.seqs, self.messages, strict=True):
            if item[0] <= through and is_replaceable(item[2]):
                if not placed:
                    item, placed = (through, seq, summary), True
                else:
                    continue
            covers.append(item[0])
            seqs.append(item[1])
            messages.append(item[2])
        if not placed:
            covers.append(through)
            seqs.append(seq)
            messages.append(summary)
        # In place: the reading loop holds these lists' append methods.
        self.covers[:], self.seqs[:], self.messages[:] = covers, seqs, messages


class _Seqs:
    """Branch indexes by seq. A fork's branch holds its origin's entries (their seqs are
    the origin's) and then its own (numbered from 1 again), so one seq can name two
    entries: a compaction's range ends at the latest one before the compaction."""

    def __init__(self, branch: Sequence[Entry]) -> None:
        self.branch = branch
        self.at: dict[int, list[int]] = {}
        for index, entry in enumerate(branch):
            self.at.setdefault(entry.seq, []).append(index)

    def through(self, compaction: int, seq: int, entry_id: object) -> int:
        """The index a compaction at ``compaction`` summarises through (`KeyError` if none)."""
        found = [i for i in self.at.get(seq, ()) if i < compaction]
        named = [i for i in found if self.branch[i].id == entry_id]
        if not (named or found):
            raise KeyError(f"through_seq {seq} is not an entry before the compaction")
        return (named or found)[-1]


def _fill(branch: Sequence[Entry], items: _Items, corrupt: list[Entry]) -> None:
    # The loop that reads whole transcripts: message entries are decoded right here, and
    # the index by seq only compactions need is built at the first one.
    seqs: _Seqs | None = None
    add_cover, add_seq, add_message = items.covers.append, items.seqs.append, items.messages.append
    for index, entry in enumerate(branch):
        seq, entry_id, _, kind, created_at, payload = entry
        if kind == EntryKind.MESSAGE:
            try:
                message = stored_message(payload, entry_id, created_at)
            except (ValidationError, InvalidPayloadError) as exc:
                corrupt.append(_as_corrupt(entry, f"not a valid message: {str(exc)[:200]}"))
                continue
            add_cover(index)
            add_seq(seq)
            add_message(message)
        elif kind == EntryKind.COMPACTION:
            seqs = seqs or _Seqs(branch)
            try:
                summary = Message.model_validate(payload["summary"])
                through_seq = int(payload["through_seq"])
                through = seqs.through(index, through_seq, payload.get("through_id"))
            except (KeyError, TypeError, ValueError) as exc:
                corrupt.append(_as_corrupt(entry, f"not a valid compaction: {exc!r}"))
                continue
            items.compact(through, seq, summary)
        elif kind == EntryKind.CORRUPT:
            corrupt.append(entry)


def covered_seq(seq: int, message: Message) -> int:
    """Where a view item ends for a later compaction's range: a message at its own seq,
    a summary at the end of the range it stands for (its ``through_seq``).

    A summary's own seq is its compaction entry, which lies after messages that
    compaction kept: judged by it, summarising the summary alone would drop them.
    """
    through = message.metadata.get("through_seq") if message.metadata.get(SUMMARY_KEY) else None
    if not isinstance(through, int) or isinstance(through, bool):
        return seq
    return through


def covered_id(message: Message) -> str:
    """The entry id where a view item ends (see `covered_seq`): a message's own id, a
    summary's ``through_id`` (which tells apart two entries with one seq in a fork)."""
    through = message.metadata.get("through_id") if message.metadata.get(SUMMARY_KEY) else None
    return through if isinstance(through, str) else message.id


def _as_corrupt(entry: Entry, error: str) -> Entry:
    return Entry(
        entry.seq,
        entry.id,
        entry.parent_seq,
        EntryKind.CORRUPT,
        entry.created_at,
        {"error": error, "kind": entry.kind},
    )
