"""Transcript entries of a sealed store bound to their place in the transcript.

Since envelope version 2 an entry's payload is bound to its seq and its parent seq as
well as to its tenant, session, id and kind, so an entry moved to another seq (two
entries' seqs swapped, say) or given another parent fails to open. The backend assigns
seqs, so the wrapper works out the seqs an append will get from the session head (the
rules `statekeeper.stores.rules.plan_append` follows), seals with them, and has the
backend check that the head did not move meanwhile (``expected_version``); when it did,
it plans again. A retried append finds its entries stored and reseals them at their
stored places, so it replays as on a plain store.

A read checks the chain: an entry whose parent seq lies in the range read but is not
stored (an entry deleted; backends never prune a parent) is reported by a ``corrupt``
stand-in at the missing seq, naming the entry that points to it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, NamedTuple, Protocol

from statekeeper.errors import ConflictError, NotFoundError
from statekeeper.stores.base import AppendResult, Entry, EntryDraft, SessionRecord, Store
from statekeeper.stores.rules import corrupt_entry
from statekeeper.stores.sealed.keyring import bindings


class SealedStore(Protocol):
    """What the appends of this module use of `statekeeper.stores.sealed.store.SealedStore`
    (a protocol, so that module imports this one and not the other way round)."""

    wrapped: Store
    heads: dict[tuple[str, str], Head]
    appending: dict[tuple[int, str, str], tuple[asyncio.Lock, list[int]]]

    def seal_entry(
        self,
        tenant: str,
        session_id: str,
        entry_id: str,
        kind: str,
        payload: Any,
        seq: int,
        parent: int | None,
    ) -> tuple[str, dict[str, Any]]: ...


__all__ = ["MISSING_ID", "Head", "entry_bindings", "missing_parents", "positions"]

MISSING_ID: Final = "~missing"
"""The id of the stand-in for an entry that should be stored and is not (never an id a
store accepts, so it names no real entry)."""
_TRIES: Final = 50
"""Plans of an append whose session other processes keep moving, before giving up (the
appends of one store handle wait for each other instead, per session and event loop)."""
_HEADS: Final = 4096
"""Session heads remembered per store (the seqs the next append of each will get)."""


class Head(NamedTuple):
    """What an append's seqs depend on: the head's version, last seq and head seq."""

    version: int
    last_seq: int
    head_seq: int

    @classmethod
    def of(cls, record: SessionRecord) -> Head:
        return cls(record.version, record.last_seq, record.head_seq)


def entry_bindings(
    tenant: str, session_id: str, entry_id: str, kind: str, seq: int, parent: int | None
) -> tuple[bytes, bytes]:
    """An entry's binding (version 2: with its seq and parent seq, 0 for none), and the
    one version 1 used (without them)."""
    legacy = bindings("entry", tenant, session_id, entry_id, kind)
    return legacy + bindings(seq, parent or 0), legacy


def positions(head: Head, drafts: Sequence[EntryDraft]) -> list[tuple[int, int | None]]:
    """The (seq, parent seq) each draft gets when appended after ``head`` (as
    `statekeeper.stores.rules.plan_append` gives them; a bad parent is the backend's to
    refuse)."""
    out: list[tuple[int, int | None]] = []
    seq = head.last_seq
    previous: int | None = head.head_seq or None
    for draft in drafts:
        seq += 1
        parent = previous if draft.parent == "head" else draft.parent
        out.append((seq, parent if isinstance(parent, int) else None))
        if not draft.side:
            previous = seq
    return out


def missing_parents(entries: list[Entry], after_seq: int) -> list[Entry]:
    """``entries`` (a read of seqs after ``after_seq``, in seq order) with a ``corrupt``
    stand-in at each parent seq that lies in the range read but is not stored."""
    seen: set[int] = set()
    missing: dict[int, Entry] = {}
    for entry in entries:
        parent = entry.parent_seq
        if (
            parent is not None
            and parent > after_seq
            and parent not in seen
            and parent not in missing
        ):
            problem = (
                f"entry {entry.id!r} (seq {entry.seq}) names seq {parent} as its parent, "
                f"but no entry {parent} is stored: an entry was deleted from the "
                "transcript around the store (a store never prunes a parent); restore "
                "it from a backup"
            )
            missing[parent] = corrupt_entry(parent, MISSING_ID, None, entry.created_at, "", problem)
        seen.add(entry.seq)
    if not missing:
        return entries
    return sorted([*entries, *missing.values()], key=lambda e: e.seq)


async def append_bound(
    store: SealedStore,
    tenant: str,
    session_id: str,
    drafts: Sequence[EntryDraft],
    *,
    expected_version: int | None,
    extra: dict[str, Any],
) -> tuple[AppendResult, dict[str, str]]:
    """Append ``drafts`` sealed at the seqs they get; the backend's result and each new
    entry's JSON text. ``extra`` holds the other (already sealed) append arguments."""
    async with _serial(store, tenant, session_id):
        return await _append(store, tenant, session_id, drafts, expected_version, extra)


@asynccontextmanager
async def _serial(store: SealedStore, tenant: str, session_id: str) -> AsyncIterator[None]:
    """One append at a time per session, among the callers of ``store`` on this loop."""
    where = (id(asyncio.get_running_loop()), tenant, session_id)
    held = store.appending.get(where)
    if held is None:
        held = store.appending[where] = (asyncio.Lock(), [0])
    lock, users = held
    users[0] += 1
    try:
        async with lock:
            yield
    finally:
        users[0] -= 1
        if not users[0]:
            store.appending.pop(where, None)


async def _append(
    store: SealedStore,
    tenant: str,
    session_id: str,
    drafts: Sequence[EntryDraft],
    expected_version: int | None,
    extra: dict[str, Any],
) -> tuple[AppendResult, dict[str, str]]:
    inner = store.wrapped
    where = (tenant, session_id)
    for attempt in range(_TRIES):
        head = store.heads.get(where)
        if head is None or (expected_version is not None and head.version != expected_version):
            head = Head.of(await inner.get_session(tenant, session_id))
        if expected_version is not None and head.version != expected_version:
            replayed = await _replay(
                store, tenant, session_id, drafts, head, expected_version, extra
            )
            if replayed is not None:
                return replayed
            raise ConflictError(
                f"session {session_id!r} is at version {head.version}, not "
                f"{expected_version}: another writer changed it; reload and retry",
                expected=expected_version,
                actual=head.version,
            )
        texts, sealed = _sealed(store, tenant, session_id, drafts, positions(head, drafts))
        try:
            result = await inner.append_entries(
                tenant, session_id, sealed, expected_version=head.version, **extra
            )
        except ConflictError as exc:
            store.heads.pop(where, None)
            if exc.actual is None or exc.expected != head.version:
                # Not (only) the head moving: the drafts may be stored already (a retry).
                replayed = await _replay(
                    store, tenant, session_id, drafts, head, expected_version, extra
                )
                if replayed is not None:
                    return replayed
            if expected_version is not None:
                raise
            if attempt >= 3:  # writers in step: a pause that grows, at random
                await asyncio.sleep(random.uniform(0, 0.0005 * 2 ** min(attempt, 8)))
            continue  # the head moved meanwhile: plan again
        remember(store, result.session)
        await _misplaced(store, tenant, session_id, drafts, positions(head, drafts), result)
        return result, texts
    raise ConflictError(
        f"session {session_id!r} kept changing while entries were appended to it "
        f"({_TRIES} tries): other writers are appending to it; retry"
    )


def remember(store: SealedStore, record: SessionRecord) -> None:
    """Note a session head the store just read or wrote (where the next append goes)."""
    if len(store.heads) >= _HEADS:
        store.heads.clear()
    store.heads[(record.tenant, record.id)] = Head.of(record)


def _sealed(
    store: SealedStore,
    tenant: str,
    session_id: str,
    drafts: Sequence[EntryDraft],
    places: Sequence[tuple[int, int | None]],
) -> tuple[dict[str, str], list[EntryDraft]]:
    texts: dict[str, str] = {}
    sealed: list[EntryDraft] = []
    for draft, (seq, parent) in zip(drafts, places, strict=True):
        text, payload = store.seal_entry(
            tenant, session_id, draft.id, draft.kind, draft.payload, seq, parent
        )
        texts[draft.id] = text
        sealed.append(draft.model_copy(update={"payload": payload}))
    return texts, sealed


async def _misplaced(
    store: SealedStore,
    tenant: str,
    session_id: str,
    drafts: Sequence[EntryDraft],
    planned: Sequence[tuple[int, int | None]],
    result: AppendResult,
) -> None:
    """Reseal at their places the entries the backend stored elsewhere than planned.

    Never expected: the backend checked the version the plan was made from. But a session
    deleted and made again by another handle can reach that version with other seqs;
    rather than leave such entries unreadable, they are rewritten where they are (a
    backend without the payload rewrite of ``docs/stores.md`` leaves them to read as
    ``corrupt``)."""
    if result.replayed:
        return
    wanted = {d.id: (d, place) for d, place in zip(drafts, planned, strict=True)}
    rewrites: dict[str, tuple[Any, Any]] = {}
    for entry in result.entries:
        found = wanted.get(entry.id)
        if found is None or found[1] == (entry.seq, entry.parent_seq):
            continue
        draft = found[0]
        _, payload = store.seal_entry(
            tenant, session_id, draft.id, draft.kind, draft.payload, entry.seq, entry.parent_seq
        )
        rewrites[entry.id] = (entry.payload, payload)
    rewrite = getattr(store.wrapped, "rewrite_entry_payloads", None)
    if rewrites and callable(rewrite):
        await rewrite(tenant, session_id, rewrites)
        store.heads.pop((tenant, session_id), None)


async def _replay(
    store: SealedStore,
    tenant: str,
    session_id: str,
    drafts: Sequence[EntryDraft],
    head: Head,
    expected_version: int | None,
    extra: dict[str, Any],
) -> tuple[AppendResult, dict[str, str]] | None:
    """A retried append: its drafts resealed where they are stored, appended again (the
    backend replays them, or refuses other content). None when none is stored."""
    inner = store.wrapped
    planned = positions(head, drafts)
    places: list[tuple[int, int | None]] = []
    found = False
    for draft, place in zip(drafts, planned, strict=True):
        try:
            stored = await inner.get_entry(tenant, session_id, draft.id)
        except NotFoundError:
            places.append(place)
            continue
        found = True
        places.append((stored.seq, stored.parent_seq))
    if not found:
        return None
    texts, sealed = _sealed(store, tenant, session_id, drafts, places)
    result = await inner.append_entries(
        tenant, session_id, sealed, expected_version=expected_version, **extra
    )
    return result, texts
