"""Export and import a session as one portable JSON document.

The document holds the session record and every entry of every branch, with parent
links by sequence number. A forked session is exported whole: the history it reads from
its origin is included, so the file stands on its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from statekeeper.errors import (
    InvalidInputError,
    InvalidPayloadError,
    SchemaVersionError,
    StatekeeperError,
)
from statekeeper.ids import validate_id
from statekeeper.sessions.handle import SessionOwner
from statekeeper.stores.base import Entry, EntryDraft, SessionPatch, SessionRecord, Store

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "export_session",
    "import_session",
    "removed_on_failure",
]

EXPORT_FORMAT = "statekeeper.session"
EXPORT_VERSION = 1


async def export_session(manager: SessionOwner, session_id: str) -> dict[str, Any]:
    """The session as a JSON-ready document."""
    record = await manager.store.get_session(manager.tenant, session_id)
    own = await manager.store.read_entries(manager.tenant, session_id)
    inherited: list[Entry] = []
    if record.forked_from is not None:
        origin = await manager.store.get_session(manager.tenant, record.forked_from.session_id)
        inherited = await manager.load_branch(origin, record.forked_from.seq)
    entries = _flatten(inherited, own)
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "session": record.model_dump(mode="json", exclude={"forked_from"}),
        "head": _new_seq(inherited, own, record.head_seq),
        "entries": entries,
    }


def _new_seq(inherited: list[Entry], own: list[Entry], seq: int) -> int:
    positions = {e.seq: i + 1 for i, e in enumerate(own)}
    if seq == 0:
        return len(inherited)
    return len(inherited) + positions[seq]


def _flatten(inherited: list[Entry], own: list[Entry]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(inherited):
        out.append(_entry_doc(entry, i + 1, i if i else None))
    base = len(inherited)
    positions = {e.seq: base + i + 1 for i, e in enumerate(own)}
    for entry in own:
        parent = positions.get(entry.parent_seq) if entry.parent_seq is not None else None
        if entry.parent_seq is None and base:
            parent = base  # a fork's roots continue the inherited history
        out.append(_entry_doc(entry, positions[entry.seq], parent))
    return out


def _entry_doc(entry: Entry, seq: int, parent: int | None) -> dict[str, Any]:
    return {
        "seq": seq,
        "id": entry.id,
        "parent_seq": parent,
        "kind": entry.kind,
        "created_at": entry.created_at.isoformat(),
        "payload": entry.payload,
    }


async def import_session(
    manager: SessionOwner, document: object, *, session_id: str | None = None
) -> SessionRecord:
    """Create a session from an exported document (under a new id if ``session_id``)."""
    source, drafts, head = _parse(document)
    record = source.model_copy(
        update={
            "id": validate_id(session_id, "session id") if session_id else source.id,
            "tenant": manager.tenant,
            "continued_from": None,
            "continued_to": None,
            # The append below adds the counters back, together with the entries.
            "total_tokens": 0,
            "fresh_tokens": 0,
            "message_count": 0,
            "compaction_count": 0,
        }
    )
    created = await manager.store.create_session(record)
    if not drafts:
        return created
    patch = SessionPatch(
        set={"head_seq": head, "fresh_tokens": source.fresh_tokens},
        add={
            "total_tokens": source.total_tokens,
            "message_count": source.message_count,
            "compaction_count": source.compaction_count,
        },
    )
    # What the checks above cannot know (the store's size limit, a failing disk): the
    # import fails whole, and the session it had just created goes too.
    async with removed_on_failure(manager.store, manager.tenant, created.id):
        result = await manager.store.append_entries(
            manager.tenant,
            created.id,
            drafts,
            expected_version=created.version,
            move_head=False,
            patch=patch,
        )
    return result.session


@contextlib.asynccontextmanager
async def removed_on_failure(store: Store, tenant: str, session_id: str) -> AsyncIterator[None]:
    """Delete the session just created if the block raises (then re-raise): a call that
    creates a session and fills it succeeds whole or leaves nothing."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(StatekeeperError):
            await store.delete_session(tenant, session_id)
        raise


def _parse(document: object) -> tuple[SessionRecord, list[EntryDraft], int]:
    """The session record, entry drafts and head of an export; raises on anything else."""
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise InvalidPayloadError("not a statekeeper session export (missing format marker)")
    version = document.get("version")
    if not isinstance(version, int) or version > EXPORT_VERSION:
        raise SchemaVersionError(
            f"session export version {version!r} is not supported (this statekeeper reads "
            f"up to {EXPORT_VERSION}); upgrade statekeeper"
        )
    try:
        source = SessionRecord.model_validate(document["session"])
        docs = list(document["entries"])
        head = int(document["head"])
        drafts = [
            EntryDraft(
                id=d["id"],
                kind=d["kind"],
                payload=d["payload"],
                parent=d["parent_seq"],
                created_at=d["created_at"],
            )
            for d in docs
        ]
        expected = list(range(1, len(docs) + 1))
        if [d["seq"] for d in docs] != expected or not 0 <= head <= len(docs):
            raise ValueError("entries must be numbered 1..n and the head must be one of them")
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidPayloadError(f"invalid session export: {exc}") from exc
    _check_entries(drafts)
    return source, drafts, head


def _check_entries(drafts: list[EntryDraft]) -> None:
    """Refuse what the append would refuse, before the import creates anything."""
    seen: set[str] = set()
    for seq, draft in enumerate(drafts, start=1):
        validate_id(draft.id, "entry id")
        if draft.id in seen:
            raise InvalidInputError(
                f"invalid session export: entry id {draft.id!r} appears twice; "
                "every entry needs an id of its own"
            )
        seen.add(draft.id)
        parent = draft.parent
        if parent is not None and (type(parent) is not int or not 1 <= parent < seq):
            raise InvalidInputError(
                f"invalid session export: parent_seq {parent!r} of entry {seq} must be "
                f"an earlier entry (1..{seq - 1}) or null"
            )
