"""The end-of-test checks of the threads tests (`test_threads.py`): the store's sessions,
once every caller has ended, against the batches the callers sent (`threads.Ledger`)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Iterable, Sequence
from typing import TypeVar

from statekeeper.stores import Store
from statekeeper.stores.base import Entry, SessionRecord

from .support import TENANT
from .threads import CALL_LIMIT, SETTLE_LIMIT, Batch, Ledger, _clean_up, _fail, _listed

__all__ = ["bounded", "check_session", "settled", "verify"]

T = TypeVar("T")


async def bounded(what: str, call: Awaitable[T]) -> T:
    """Await ``call`` on the home loop for `CALL_LIMIT` at most, failing the test past it
    (without waiting for a stuck call to take its cancellation)."""
    task = asyncio.ensure_future(call)
    await asyncio.wait([task], timeout=CALL_LIMIT)
    if not task.done():
        task.cancel()
        _fail(f"{what}, on the store's home loop, took over {CALL_LIMIT:.0f} s")
    return task.result()


async def _head(store: Store, session_id: str) -> SessionRecord:
    return await bounded(f"get_session {session_id}", store.get_session(TENANT, session_id))


async def _versions(store: Store, session_ids: Iterable[str]) -> list[int]:
    return [(await _head(store, s)).version for s in session_ids]


async def settled(
    store: Store, session_ids: Sequence[str], ledger: Ledger
) -> dict[str, tuple[SessionRecord, list[Entry]]]:
    """Each session's head and entries, read once nothing changes any more: an append
    whose caller's loop closed or whose thread exited may still land after every caller
    has ended (it must not land partly, nor after `SETTLE_LIMIT`)."""
    deadline = time.monotonic() + SETTLE_LIMIT
    seen = await _versions(store, session_ids)
    quiet_since = time.monotonic()
    in_flight = any(b.result is None for b in ledger.batches)  # else every call has ended
    while in_flight and time.monotonic() - quiet_since < 0.3:
        if time.monotonic() > deadline:
            _fail(
                f"sessions still changing {SETTLE_LIMIT:.0f} s after every caller ended "
                f"({ledger.context()})"
            )
        await asyncio.sleep(0.05)
        now = await _versions(store, session_ids)
        if now != seen:
            seen, quiet_since = now, time.monotonic()
    found: dict[str, tuple[SessionRecord, list[Entry]]] = {}
    for session_id in session_ids:
        while True:  # a head and entries of one moment: nothing landed between the reads
            before = await _head(store, session_id)
            read = store.read_entries(TENANT, session_id)
            entries = await bounded(f"read_entries {session_id}", read)
            record = await _head(store, session_id)
            if record.version == before.version:
                found[session_id] = record, entries
                break
            if time.monotonic() > deadline:
                _fail(f"{session_id} never stood still ({ledger.context()})")
    return found


def _ranges(seqs: Sequence[int]) -> str:
    """``1-4, 6, 9-10``: a list of seqs, short."""
    runs: list[list[int]] = []
    for seq in seqs:
        if runs and seq == runs[-1][-1] + 1:
            runs[-1].append(seq)
        else:
            runs.append([seq])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def check_session(
    session_id: str, record: SessionRecord, entries: list[Entry], batches: Sequence[Batch]
) -> list[str]:
    """What is wrong with one session's stored entries, given what was sent to it."""
    problems: list[str] = []
    seqs = [e.seq for e in entries]
    if seqs != list(range(1, len(entries) + 1)):
        problems.append(f"{session_id}: seqs not 1..{len(entries)}: {_ranges(seqs)}")
    twice = sorted(i for i, n in Counter(e.id for e in entries).items() if n > 1)
    if twice:
        problems.append(f"{session_id}: entries stored twice: {twice[:10]}")
    parents = [e.parent_seq for e in entries]
    chain = [None, *seqs[:-1]] if seqs else []  # (a caller may never reach its session)
    if parents != chain:
        broken = [e.seq for e, p in zip(entries, chain, strict=True) if e.parent_seq != p]
        problems.append(f"{session_id}: not one chain, wrong parents at seqs {_ranges(broken)}")
    by_key = {b.key: b for b in batches}
    stored: dict[str, list[Entry]] = {}
    for entry in entries:
        key = entry.payload.get("batch")
        if not isinstance(key, str) or key not in by_key:
            problems.append(f"{session_id}: seq {entry.seq} is no entry sent: {entry.id!r}")
        else:
            stored.setdefault(key, []).append(entry)
    for key, got in stored.items():
        batch = by_key[key]
        if [e.payload.get("i") for e in got] != list(range(batch.size)):
            problems.append(
                f"{session_id}: {batch.describe()} stored partly or out of order: "
                f"{[e.id for e in got]} at seqs {_ranges([e.seq for e in got])}"
            )
        elif [e.seq for e in got] != list(range(got[0].seq, got[0].seq + batch.size)):
            problems.append(
                f"{session_id}: {batch.describe()} interleaved with others: "
                f"seqs {_ranges([e.seq for e in got])}"
            )
    for batch in batches:
        if batch.result is None:
            continue
        told = [(e.seq, e.id) for e in batch.result.entries]
        found = [(e.seq, e.id) for e in stored.get(batch.key, [])]
        if not found:
            problems.append(f"{session_id}: {batch.describe()} acknowledged but lost: {told}")
        elif told != found:
            problems.append(
                f"{session_id}: {batch.describe()} acknowledged as {told}, stored {found}"
            )
    counters = (record.head_seq, record.last_seq, record.message_count)
    if counters != (len(entries),) * 3:
        problems.append(
            f"{session_id}: head (head_seq, last_seq, message_count) {counters} for "
            f"{len(entries)} stored entries"
        )
    return problems


async def verify(store: Store, ledger: Ledger, session_ids: Sequence[str]) -> None:
    """Once the sessions have settled: every acknowledged batch is stored as it was
    acknowledged, every stored batch is whole and contiguous, nothing else is stored, and
    each session is one chain whose head counts its entries."""
    try:
        found = await settled(store, session_ids, ledger)
    finally:
        _clean_up(ledger)
    problems = list(ledger.problems)  # (from closing abandoned appends: the rest failed before)
    for session_id in session_ids:
        record, entries = found[session_id]
        sent = [b for b in ledger.batches if b.session_id == session_id]
        problems += check_session(session_id, record, entries, sent)
    unsent = sorted({b.session_id for b in ledger.batches} - set(session_ids))
    if unsent:
        _fail(f"batches sent to sessions not checked: {unsent}")
    if problems:
        _fail(f"({ledger.context()})" + _listed(problems))
