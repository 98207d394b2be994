"""The basics other session libraries have, kept log-structured: pop the last item, clear
the transcript, and items stored verbatim.

- *pop* moves the head back to the parent of the active branch's last message (or
  verbatim item): the entry stays stored and readable, it just leaves the active view.
- *clear* appends a root ``clear`` marker and makes it the head: the active view is
  empty (a fork no longer reads the history it came from) and every earlier entry
  stays stored; `Session.entries` and `sessions export` still show it.
- a *verbatim item* is a JSON object stored as given, in an ``item`` entry, and
  returned equal, key order included (no conversion to a `Message`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statekeeper.core.convert import from_openai_responses, to_openai_responses
from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError, InvalidPayloadError
from statekeeper.jsoncodec import encode_json
from statekeeper.sessions.handle import SessionOwner
from statekeeper.sessions.view import TranscriptView, active_branch, build_view, message_of
from statekeeper.sessions.writes import HeadWrites
from statekeeper.stores.base import Entry, EntryDraft, EntryKind, SessionPatch, SessionRecord

__all__ = [
    "CLEAR_MARKER",
    "ITEM_KIND",
    "SessionBasics",
    "branch_items",
    "branch_origins",
    "clear_plan",
    "is_clear_marker",
    "item_messages",
    "message_origins",
    "pop_plan",
    "verbatim_drafts",
]

ITEM_KIND = "item"
"""Entry kind of a verbatim item (payload ``{"item": <the object as given>}``)."""
CLEAR_MARKER = "clear"
"""``payload["marker"]`` of the root entry `Session.clear` appends."""

Popped = Message | dict[str, Any]


class SessionBasics(HeadWrites):
    """pop, clear, append_items and items of `Session` (which supplies what is declared)."""

    if TYPE_CHECKING:

        async def append(self, *messages: Message, strict: bool = True) -> Any: ...
        async def branch(self) -> list[Entry]: ...

    async def pop(self) -> Message | dict[str, Any]:
        """Remove the active branch's last message (or verbatim item) and return it.

        The head moves back to its parent: the entry stays stored (see `entries`).
        Compare-and-set on the version this handle saw, like `append`.
        """
        await self._follow()
        patch, popped = await pop_plan(self.manager, self._record)
        await self._update_head(patch)
        return popped

    async def clear(self) -> None:
        """Empty the active view; every earlier entry stays stored and readable."""
        await self._follow()
        marker, patch = clear_plan(self._record)
        await self._append_raw([marker], patch, expected_version=self.version)

    async def append_items(
        self, items: Sequence[dict[str, Any]], *, verbatim: bool = False
    ) -> list[Entry]:
        """Append items (OpenAI Responses or chat input format) atomically.

        By default they become messages. ``verbatim=True`` stores each JSON object
        exactly as given; `items` returns it equal (verbatim items are not messages:
        `messages` and context windows leave them out).
        """
        if not verbatim:
            entries: list[Entry] = (await self.append(*item_messages(items))).entries
            return entries
        drafts = verbatim_drafts(items)
        if not drafts:
            raise InvalidInputError("append_items needs at least one item")
        await self._follow()
        return await self._append_raw(drafts, SessionPatch(), expected_version=self.version)

    async def items(self) -> list[dict[str, Any]]:
        """The active branch as items: verbatim items as stored, messages in the OpenAI
        Responses input format (compactions applied)."""
        return branch_items(await self.branch())


def is_clear_marker(entry: Entry) -> bool:
    """Whether ``entry`` is the root marker a clear appended."""
    return entry.kind == EntryKind.MARKER and entry.payload.get("marker") == CLEAR_MARKER


async def pop_plan(owner: SessionOwner, record: SessionRecord) -> tuple[SessionPatch, Popped]:
    """The head move that pops the active branch's last message or item, and what it pops.

    `InvalidInputError` when there is nothing to pop, when a compaction lies after the
    last message (pop would undo it: use `Session.checkout`), or when what is left is the
    history a fork reads from its origin (fork at an earlier entry instead).
    """
    entries = await owner.store.read_entries(owner.tenant, record.id, until_seq=record.head_seq)
    own = active_branch(entries, record.head_seq)
    last = _last_poppable(record, own)
    new_head = last.parent_seq or 0
    view = build_view(await owner.load_branch(record, new_head))
    popped: Popped
    if last.kind == ITEM_KIND:
        popped = dict(last.payload["item"])
        patch = SessionPatch(set={"head_seq": new_head, "fresh_tokens": view.tokens})
    else:
        popped = message_of(last)
        patch = SessionPatch(
            set={"head_seq": new_head, "fresh_tokens": view.tokens},
            add={"message_count": -1} if record.message_count > 0 else {},
        )
    return patch, popped


def _last_poppable(record: SessionRecord, own: Sequence[Entry]) -> Entry:
    entry: Entry
    for entry in reversed(own):
        if entry.kind in (EntryKind.MESSAGE, ITEM_KIND):
            return entry
        if entry.kind == EntryKind.COMPACTION:
            raise InvalidInputError(
                f"the last message of session {record.id!r} is covered by the compaction at "
                f"entry {entry.seq}; pop would undo it: use checkout(seq) to go back explicitly"
            )
        if is_clear_marker(entry):
            break
    else:
        if record.forked_from is not None:
            origin = record.forked_from
            raise InvalidInputError(
                f"session {record.id!r} has nothing of its own to pop: its messages are the "
                f"history it was forked from ({origin.session_id!r} up to entry {origin.seq}); "
                f"fork {origin.session_id!r} at an earlier entry instead"
            )
    raise InvalidInputError(f"session {record.id!r} has nothing to pop: its active view is empty")


def clear_plan(record: SessionRecord) -> tuple[EntryDraft, SessionPatch]:
    """The root marker and head patch that empty the active view (history stays stored)."""
    marker = EntryDraft(kind=EntryKind.MARKER, payload={"marker": CLEAR_MARKER}, parent=None)
    patch = SessionPatch(set={"fresh_tokens": 0}, add={"message_count": -record.message_count})
    return marker, patch


def verbatim_drafts(
    items: Sequence[Mapping[str, Any]], call: str = "append_items"
) -> list[EntryDraft]:
    """Entry drafts storing each item exactly as given (a JSON object each); ``call``
    names the method the caller used, in error messages."""
    if isinstance(items, Mapping | str | bytes) or not isinstance(items, Sequence):
        raise InvalidInputError(
            f"{call} takes a list of JSON objects (dicts), got {type(items).__name__}"
        )
    drafts = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidPayloadError(
                f"item {index} of {call} is a {type(item).__name__}, not a JSON object (dict)"
            )
        encode_json(item, what=f"item {index} of {call}")
        drafts.append(EntryDraft(kind=ITEM_KIND, payload={"item": item}))
    return drafts


def item_messages(items: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Items in the OpenAI Responses (or chat) input format, as messages."""
    if isinstance(items, Mapping | str | bytes) or not isinstance(items, Sequence):
        raise InvalidInputError("append_items takes a list of JSON objects (dicts)")
    return from_openai_responses(items)


def branch_items(branch: Sequence[Entry]) -> list[dict[str, Any]]:
    """The active branch as items: verbatim items as stored, messages (compactions
    applied) in the OpenAI Responses input format, in branch order."""
    index = {entry.id: i for i, entry in enumerate(branch)}
    placed: list[tuple[float, list[dict[str, Any]]]] = []
    where = -1.0
    for message in build_view(branch).messages:
        # A summary is not an entry of its own: it goes where the view puts it.
        where = index[message.id] if message.id in index else where + 1e-6
        placed.append((where, to_openai_responses([message])))
    placed += [(i, [e.payload["item"]]) for i, e in enumerate(branch) if e.kind == ITEM_KIND]
    placed.sort(key=lambda pair: pair[0])
    return [item for _, items in placed for item in items]


async def branch_origins(
    owner: SessionOwner, record: SessionRecord, head_seq: int | None = None
) -> list[str]:
    """The session each entry of ``owner.load_branch(record)`` is stored in (a fork's
    branch starts with the history of the session it was forked from, whose seqs are
    that session's own)."""
    head = record.head_seq if head_seq is None else head_seq
    own = active_branch(
        await owner.store.read_entries(owner.tenant, record.id, until_seq=head), head
    )
    inherited: list[str] = []
    fork = record.forked_from
    if fork is not None and (
        not own or (own[0].parent_seq is None and not is_clear_marker(own[0]))
    ):
        origin = await owner.store.get_session(owner.tenant, fork.session_id)
        inherited = await branch_origins(owner, origin, fork.seq)
    return inherited + [record.id] * len(own)


def message_origins(view: TranscriptView, origins: Sequence[str], default: str) -> list[str]:
    """The session each message of ``view`` was stored in (``origins`` from
    `branch_origins`, parallel to ``view.branch``)."""
    where: dict[str, str] = {}
    for entry, session_id in zip(view.branch, origins, strict=True):
        where[entry.id] = session_id
        summary = entry.payload.get("summary") if entry.kind == EntryKind.COMPACTION else None
        if isinstance(summary, dict) and isinstance(summary.get("id"), str):
            where[summary["id"]] = session_id
    return [where.get(m.id, default) for m in view.messages]
