"""Which entries of a page are on the session's active branch, without reading the branch.

The active branch is the head and its ancestors by ``parent_seq``; a parent's seq is
always lower than its child's. So walking parents down from the head, an entry of the
page ``low..high`` is on the branch exactly when the walk passes its seq. Only what lies
above the page (``high < seq <= head``) has to be read besides the page itself: for the
newest entries that is little or nothing, whatever the session's length. The entries
above it are read in growing chunks from the head down, and the walk skips whatever a
branch point leaves behind (an abandoned branch is not read).

A fork's history before its fork point lives in the session it came from: a page holds
this session's own entries only, so the walk stays in this session.
"""

from __future__ import annotations

from collections.abc import Sequence

from statekeeper.errors import StoreCorruptError
from statekeeper.stores.base import Entry, TranscriptStore

__all__ = ["branch_seqs"]

_FIRST_CHUNK = 64
_MAX_CHUNK = 4096


async def branch_seqs(
    store: TranscriptStore, tenant: str, session_id: str, head_seq: int, page: Sequence[Entry]
) -> set[int]:
    """The seqs of ``page`` (entries in seq order, every entry of their seq range) that
    are on the branch ending at ``head_seq``; `StoreCorruptError` if the walk finds a
    branch entry missing or a parent that is not older than its child (as
    `Session.branch` does)."""
    if not page or head_seq < page[0].seq:
        return set()
    high = page[-1].seq
    seq: int | None = head_seq
    chunk = _FIRST_CHUNK
    while seq is not None and seq > high:
        low = max(high, seq - chunk)
        above = {
            e.seq: e
            for e in await store.read_entries(tenant, session_id, after_seq=low, until_seq=seq)
        }
        while seq is not None and seq > low:
            seq = _parent(above, seq)
        chunk = min(chunk * 2, _MAX_CHUNK)
    by_seq = {e.seq: e for e in page}
    found: set[int] = set()
    while seq is not None and seq >= page[0].seq:
        found.add(seq)
        seq = _parent(by_seq, seq)
    return found


def _parent(entries: dict[int, Entry], seq: int) -> int | None:
    entry = entries.get(seq)
    if entry is None:
        raise StoreCorruptError(f"entry {seq} of the active branch is missing")
    parent = entry.parent_seq
    if parent is not None and parent >= seq:
        raise StoreCorruptError(f"entry {seq} points forward to parent {parent}")
    return parent
