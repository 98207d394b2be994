"""Side entries (checkpoints beside the branch) and pruning them without breaking a branch."""

from __future__ import annotations

import pytest

from statekeeper.errors import InvalidIdError, InvalidInputError, NotFoundError
from statekeeper.stores import Store
from statekeeper.stores.base import EntryDraft, SessionRecord

from .support import OTHER_TENANT, TENANT, draft, new_session

CHECKPOINT = "checkpoint"


def side(entry_id: str) -> EntryDraft:
    return EntryDraft(id=entry_id, kind=CHECKPOINT, side=True, payload={"at": entry_id})


async def links(store: Store, session_id: str = "s1") -> list[tuple[int, int | None]]:
    return [(e.seq, e.parent_seq) for e in await store.read_entries(TENANT, session_id)]


async def with_checkpoints(store: Store) -> SessionRecord:
    """m1 c1 m2 c2 m3 c3: each checkpoint hangs off the message before it."""
    await new_session(store, "s1")
    result = None
    for n in (1, 2, 3):
        result = await store.append_entries(TENANT, "s1", [draft(f"m{n}"), side(f"c{n}")])
    assert result is not None
    return result.session


async def test_a_side_entry_hangs_off_the_tip_without_moving_the_head(store: Store) -> None:
    await new_session(store, "s1")
    await store.append_entries(TENANT, "s1", [draft("m1"), draft("m2")])
    result = await store.append_entries(TENANT, "s1", [side("c1")])
    assert [(e.seq, e.parent_seq, e.kind) for e in result.entries] == [(3, 2, CHECKPOINT)]
    assert (result.session.head_seq, result.session.last_seq) == (2, 3)
    after = await store.append_entries(TENANT, "s1", [draft("m3")])
    assert [(e.seq, e.parent_seq) for e in after.entries] == [(4, 2)]
    assert (after.session.head_seq, after.session.last_seq) == (4, 4)


async def test_nothing_in_a_batch_chains_onto_a_side_entry(store: Store) -> None:
    await new_session(store, "s1")
    result = await store.append_entries(
        TENANT, "s1", [draft("m1"), side("c1"), draft("m2"), side("c2")]
    )
    assert [(e.seq, e.parent_seq) for e in result.entries] == [(1, None), (2, 1), (3, 1), (4, 3)]
    assert (result.session.head_seq, result.session.last_seq) == (3, 4)


async def test_prune_deletes_old_unreferenced_entries_of_a_kind(store: Store) -> None:
    before = await with_checkpoints(store)
    assert await links(store) == [(1, None), (2, 1), (3, 1), (4, 3), (5, 3), (6, 5)]
    assert await store.prune_entries(TENANT, "s1", kind=CHECKPOINT, before_seq=6) == 2
    assert await links(store) == [(1, None), (3, 1), (5, 3), (6, 5)]
    for gone in ("c1", "c2"):
        with pytest.raises(NotFoundError):
            await store.get_entry(TENANT, "s1", gone)
    assert (await store.get_entry(TENANT, "s1", "c3")).seq == 6
    session = await store.get_session(TENANT, "s1")
    assert (session.head_seq, session.last_seq) == (before.head_seq, before.last_seq)
    assert session.version == before.version + 1


async def test_reads_skip_the_gaps_pruning_leaves(store: Store) -> None:
    await with_checkpoints(store)
    await store.prune_entries(TENANT, "s1", kind=CHECKPOINT, before_seq=6)

    async def seqs(**window: int) -> list[int]:
        return [e.seq for e in await store.read_entries(TENANT, "s1", **window)]

    assert await seqs(after_seq=1, limit=2) == [3, 5]
    assert await seqs(until_seq=4) == [1, 3]
    assert await seqs(after_seq=2, until_seq=2) == []
    assert await seqs(limit=1) == [1]


async def test_seqs_are_never_reused_after_pruning(store: Store) -> None:
    await with_checkpoints(store)
    await store.prune_entries(TENANT, "s1", kind=CHECKPOINT, before_seq=7)
    result = await store.append_entries(TENANT, "s1", [draft("m4")])
    assert [(e.seq, e.parent_seq) for e in result.entries] == [(7, 5)]


async def test_prune_keeps_the_head_and_every_parent(store: Store) -> None:
    await new_session(store, "s1")
    # A checkpoint on the branch (not a side entry): a later message points to it.
    on_branch = EntryDraft(id="k1", kind=CHECKPOINT, payload={})
    await store.append_entries(TENANT, "s1", [draft("m1"), on_branch, draft("m2")])
    tip = EntryDraft(id="k2", kind=CHECKPOINT, payload={})
    await store.append_entries(TENANT, "s1", [tip])
    assert await store.prune_entries(TENANT, "s1", kind=CHECKPOINT, before_seq=100) == 0
    assert await links(store) == [(1, None), (2, 1), (3, 2), (4, 3)]


async def test_prune_with_nothing_to_delete_changes_nothing(store: Store) -> None:
    await with_checkpoints(store)
    before = await store.get_session(TENANT, "s1")
    assert await store.prune_entries(TENANT, "s1", kind=CHECKPOINT, before_seq=1) == 0
    assert await store.prune_entries(TENANT, "s1", kind="other-kind", before_seq=100) == 0
    assert await store.get_session(TENANT, "s1") == before
    assert len(await store.read_entries(TENANT, "s1")) == 6


async def test_messages_are_never_pruned(store: Store) -> None:
    await with_checkpoints(store)
    with pytest.raises(InvalidInputError):
        await store.prune_entries(TENANT, "s1", kind="message", before_seq=100)
    assert len(await store.read_entries(TENANT, "s1")) == 6


async def test_prune_is_scoped_to_the_tenant_and_session(store: Store) -> None:
    await with_checkpoints(store)
    await new_session(store, "s2")
    await store.append_entries(TENANT, "s2", [draft("m1"), side("c1"), draft("m2")])
    with pytest.raises(NotFoundError):
        await store.prune_entries(OTHER_TENANT, "s1", kind=CHECKPOINT, before_seq=100)
    with pytest.raises(NotFoundError):
        await store.prune_entries(TENANT, "missing", kind=CHECKPOINT, before_seq=100)
    with pytest.raises(InvalidIdError):
        await store.prune_entries(TENANT, "../s1", kind=CHECKPOINT, before_seq=100)
    assert len(await store.read_entries(TENANT, "s1")) == 6
    assert await store.prune_entries(TENANT, "s2", kind=CHECKPOINT, before_seq=100) == 1
    assert len(await store.read_entries(TENANT, "s1")) == 6
